"""What a strategy needs of a model's computation: a session per run that answers next-token logits.

A loaded model carries a `Sessions` (its session factory): this process's runtime for weights loaded here, an
HTTP client for a model behind a server, a proxy for a model in a Ray actor. The strategies, the damage
measures and the integrations call only what these protocols name, so where a model computes is the factory's
business and nothing above it subclasses a model to change it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch


@dataclass
class ForwardStats:
    """A session's forward passes. `seconds` is the wall time of the passes it took part in (the other
    rows' work included); `rows` sums the runs sharing each of them, so rows / passes is the mean batch;
    `wait_seconds` is the time its requests waited for a pass to start; `reused` counts prompt positions whose
    keys and values came from a finished run's slot instead of a pass."""

    passes: int = 0
    positions: int = 0
    seconds: float = 0.0
    rows: int = 0
    wait_seconds: float = 0.0
    logit_bytes: int = 0  # logits handed from the model's device to the host (full-vocabulary rows, its dtype)
    reused: int = 0


class Session(Protocol):
    """One model in one run: the calls the engine makes of it."""

    stats: ForwardStats

    def next_token_logits(self, ids: Sequence[int], starts: Sequence[int]) -> torch.Tensor:
        """Logits of the distribution of ids[t] given ids[:t], one row per t in `starts` (1 ≤ t ≤ len(ids))."""

    def forget_before(self, start: int) -> None:
        """No later call asks for a position before `start`: what is remembered for them may go."""

    def close(self) -> None:
        """The run is over with this model (idempotent); what the session holds goes back."""


class Sessions(Protocol):
    """Where a model computes: opens one session per run and says how it computes."""

    @property
    def key(self) -> object:
        """What the scheduler registers this model's executor under (runs holding it share its passes)."""

    def open(self) -> Session:
        """A fresh session for one run."""

    def describe(self) -> dict:
        """How the model computes, merged into the model's description (`runtime`, and where it is hosted)."""
