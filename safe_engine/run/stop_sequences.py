"""Stop sequences (`DecodeConfig.stop`): the run ends at the first one after the response's leading whitespace."""

from __future__ import annotations

from collections.abc import Sequence


class StopSequences:
    def __init__(self, texts: Sequence[str]):
        self.sequences = [text.encode("utf-8") for text in texts]
        self.end: int | None = None  # where the first stop sequence ends in the response (bytes)

    def found(self, raw: bytes, piece_start: int) -> bool:
        """Whether a stop sequence now ends in `raw`, searched from where a piece appended at byte
        `piece_start` could newly complete one."""
        lead = len(raw) - len(raw.lstrip())  # a stop sequence in the leading whitespace does not count
        for stop in self.sequences:
            found = raw.find(stop, max(lead, piece_start - len(stop) + 1))
            if found >= 0:
                end = found + len(stop)
                self.end = end if self.end is None else min(self.end, end)
        return self.end is not None
