"""The drafter's response: its ids, their exact bytes, and the text shown of them."""

from __future__ import annotations

from collections.abc import Sequence

from ..models.loading import LoadedModel
from ..tokenization.alignment import CharIndex, complete_utf8_prefix


class Response:
    """The drafter's response so far: ids, their exact bytes, and the text already announced."""

    def __init__(self, drafter: LoadedModel):
        self.vocab = drafter.vocab
        self.ids: list[int] = []
        self.raw = b""
        self._announced = 0  # characters already sent in TextCommitted deltas

    def extended(self, ids: Sequence[int]) -> bytes:
        return self.raw + self.vocab.join(ids)

    def commit(self, ids: Sequence[int]) -> tuple[int, int]:
        start = len(self.raw)
        self.ids.extend(ids)
        self.raw += self.vocab.join(ids)
        return start, len(self.raw)

    @property
    def text(self) -> str:
        return text_and_index(self.raw)[0]

    def take_delta(self) -> str:
        text = self.text
        delta, self._announced = text[self._announced :], len(text)
        return delta


def complete(raw: bytes) -> bytes:
    """`raw` without a character still being spelled at its end."""
    return raw[: complete_utf8_prefix(raw)]


def text_and_index(raw: bytes) -> tuple[str, CharIndex]:
    """Display text (a character still being spelled at the end is held back) and its offset index."""
    index = CharIndex.of_bytes(complete(raw))
    return index.text, index
