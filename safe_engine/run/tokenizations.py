"""The verifiers' canonical tokenizations of the response, the latest kept for the next caller."""

from __future__ import annotations

from collections.abc import Sequence

from ..tokenization.alignment import Tokenization, tokenize
from .participant import Participant
from .response import complete
from .stats import RunStats


class VerifierTokenizations:
    """Each verifier's tokenization of a text, timed as `retokenize`. The last one is kept: per-token's damage
    check tokenizes the text its next step reads."""

    def __init__(self, verifiers: Sequence[Participant], stats: RunStats):
        self.vocabs = [v.lm.vocab for v in verifiers]
        self.stats = stats
        self._last: tuple[bytes, list[Tokenization]] | None = None

    def of(self, raw: bytes) -> list[Tokenization]:
        """One per verifier, in role order, of `raw` (a character still being spelled at its end is held back)."""
        raw = complete(raw)
        if self._last is None or self._last[0] != raw:
            with self.stats.timed("retokenize"):
                self._last = (raw, [tokenize(vocab, raw) for vocab in self.vocabs])
        return self._last[1]
