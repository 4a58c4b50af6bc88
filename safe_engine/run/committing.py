"""Appending a strategy's pieces to the response: forced texts in their place, and the end of the response
(an end token, a stop sequence) returned with what was appended."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from ..contract.reasons import StopReason
from .forcing import Forcing
from .piece import Piece
from .response import Response
from .stop_sequences import StopSequences


@dataclass
class Appended:
    """The pieces one commit appended (a forced text in place of the strategy's), their byte spans in the
    response, and why the response ends here (None: it goes on)."""

    pieces: list[Piece]
    spans: list[tuple[int, int]]
    end: StopReason | None


class Committer:
    """Appends pieces to the response: forced texts (`DecodeConfig.force`) in place of the strategy's, up
    to a stop sequence (`DecodeConfig.stop`)."""

    def __init__(self, response: Response, forcing: Forcing, stops: StopSequences, eos_ids: Collection[int]):
        self.response = response
        self.forcing = forcing
        self.stops = stops
        self.eos_ids = eos_ids

    def diverted(self, committed: int, pieces: Sequence[Piece]) -> bool:
        """A forced text replaces the last of `pieces`, appended after `committed` pieces."""
        return self.forcing.diverts(committed + len(pieces) - 1, pieces[-1])

    def append(self, committed: int, pieces: Sequence[Piece]) -> Appended:
        """Append `pieces` after `committed` pieces. A piece a forced text replaced, or one that completes a
        stop sequence, is the last one appended; an end token among the ids ends the response."""
        appended = Appended([], [], None)
        for piece in pieces:
            index = committed + len(appended.pieces)
            diverted = self.forcing.diverts(index, piece)
            piece = self.forcing.apply(index, piece)
            appended.pieces.append(piece)
            appended.spans.append(self.response.commit(piece.ids))
            if self.stops.found(self.response.raw, appended.spans[-1][0]):
                appended.end = StopReason.STOP_SEQUENCE
                break
            if diverted:
                break
        if any(i in self.eos_ids for piece in appended.pieces for i in piece.ids):
            appended.end = StopReason.EOS
        return appended
