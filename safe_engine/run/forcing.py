"""What-if branching: texts the user commits at given committed-token indices (`DecodeConfig.force`)."""

from __future__ import annotations

from collections.abc import Sequence

from ..contract.errors import ConfigError
from ..contract.reasons import Decision
from ..tokenization.alignment import TokenBytes, display_piece
from .piece import Piece


class Forcing:
    """Each forced index's text, spelled once in the drafter's vocabulary."""

    def __init__(self, force: Sequence[tuple[int, str]], vocab: TokenBytes, drafter: str):
        self.vocab = vocab
        self.ids: dict[int, list[int]] = {}
        for index, text in force:
            try:
                self.ids[index] = vocab.encode_bytes(text.encode("utf-8"))
            except ValueError:
                raise ConfigError(f"the drafter {drafter} cannot spell the forced text {text!r}") from None

    def diverts(self, index: int, piece: Piece) -> bool:
        """A forced text replaces the strategy's piece at committed-token `index` (its draft is then stale)."""
        return index in self.ids and self.vocab.join(piece.ids) != self.vocab.join(self.ids[index])

    def apply(self, index: int, piece: Piece) -> Piece:
        """The piece committed at `index`. Forcing the strategy's own text keeps its ids and changes nothing
        but the decision."""
        if index not in self.ids:
            return piece
        if not self.diverts(index, piece):
            return Piece(piece.ids, Decision.FORCED, kept_draft=piece.kept_draft)
        return Piece(self.ids[index], Decision.FORCED, drafted=display_piece(self.vocab.join(piece.ids)))
