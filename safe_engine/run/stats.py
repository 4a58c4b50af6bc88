"""Per-run counters: the metrics every run reports (docs/algorithm.md), filled in as decoding goes."""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from ..contract.reasons import Decision, Reason
from .piece import Piece

PHASES = ("draft", "verify", "ensemble", "retokenize", "damage")
KEPT = (Reason.UNANIMITY, Reason.MEAN, Reason.GATE, Reason.ACCEPTED)  # why a draft is kept without an ensemble


@dataclass
class RunStats:
    strategy: str
    tokens: int = 0  # committed response positions (an ensembled string re-encoded to several ids counts once)
    rounds: int = 0  # the run's one round counter (`Run.round` reads it)
    drafted: int = 0
    accepted_drafts: int = 0  # drafted tokens committed unchanged (`Piece.kept_draft`)
    ensembled: int = 0  # ensemble operations (E in E/T)
    replaced: int = 0  # ensemble operations that changed the drafted token
    oov_skips: dict[str, int] = field(default_factory=dict)  # per verifier
    consensus_skips: dict[str, int] = field(default_factory=lambda: {r.value: 0 for r in KEPT})  # by Reason code
    sharpened: int = 0
    forward: dict[str, dict] = field(default_factory=dict)  # per model: passes, positions, seconds
    time_split: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    wall_s: float = 0.0  # decoding time: the damage measurement's own time (time_split["damage"]) is left out
    damage: dict = field(default_factory=dict)  # damage.DamageMeter.summary(), filled when the run ends

    def count(self, pieces: Sequence[Piece]) -> None:
        """Count committed pieces: tokens, accepted drafts, and the skips their decisions and reasons say."""
        self.tokens += len(pieces)
        for piece in pieces:
            self.accepted_drafts += piece.kept_draft
            if piece.decision == Decision.SKIPPED_CONSENSUS:
                self.consensus_skips[piece.reason] += 1
            elif piece.decision == Decision.SKIPPED_OOV:
                for name in piece.oov_like_for:
                    self.oov_skips[name] += 1

    @contextmanager
    def timed(self, phase: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.time_split[phase] += time.perf_counter() - started

    @property
    def e_t(self) -> float:
        return self.ensembled / self.tokens if self.tokens else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0

    @property
    def passes_per_token(self) -> float:
        """Forward passes of all the models per committed token (byte-level: about bytes per token each)."""
        return sum(entry["passes"] for entry in self.forward.values()) / self.tokens if self.tokens else 0.0

    @property
    def forward_s(self) -> float:
        return sum(entry["seconds"] for entry in self.forward.values())

    @property
    def overhead_share(self) -> float:
        """Share of wall time spent outside model forward passes."""
        return max(0.0, 1.0 - self.forward_s / self.wall_s) if self.wall_s else 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(
            e_t=self.e_t,
            tokens_per_s=self.tokens_per_s,
            forward_s=self.forward_s,
            passes_per_token=self.passes_per_token,
            overhead_share=self.overhead_share,
        )
        return out
