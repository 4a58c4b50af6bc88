"""Decoding strategies behind one interface: ``decode(models, prompt, config)`` yields events.

- ``single``: the drafter alone.
- ``per-token``: UniTE at every step (`per_token.py`): every model runs every step, the baseline whose
  collapse the paper reports.
- ``safe``: Generate → Verify → Ensemble (`safe.py`): the paper's algorithm, ``exact`` by default.
- ``byte-level``: every model as an exact next-byte model, combined byte by byte (`byte_level.py`).

Every strategy decodes greedily, or samples with a temperature, top-p and seed (`sampling.py`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from ..contract.config import MAX_NEW_TOKENS, PER_TOKEN_COMMITS, SAFE_MODES, STRATEGIES, DecodeConfig
from ..contract.events import Event
from ..contract.reasons import Decision
from ..models.loading import LoadedModel
from ..run.piece import Piece
from ..run.state import Run
from ..runtime.scheduler import ActiveRun
from .byte_level import byte_level_step
from .per_token import per_token_step
from .safe import safe_round

if TYPE_CHECKING:
    from ..runtime.scheduler import Scheduler

__all__ = ["MAX_NEW_TOKENS", "PER_TOKEN_COMMITS", "SAFE_MODES", "STRATEGIES", "DecodeConfig", "decode"]


def single_round(run: Run) -> Iterator[Event]:
    """The drafter alone, n tokens at a time (the same drafting code SAFE uses)."""
    draft = run.draft(min(run.config.lookahead, run.remaining()))
    if not draft.ids:
        return
    yield run.draft_event(draft)
    pieces: list[Piece] = []
    for token_id in draft.ids:
        pieces.append(Piece([token_id], Decision.ACCEPTED, kept_draft=True))
        if run.diverted(pieces):  # a forced text: the rest of the draft followed another text
            break
    yield run.commit(pieces)  # a stop sequence may end it early


STEPS: dict[str, Callable[[Run], Iterator[Event]]] = {
    "single": single_round,
    "per-token": per_token_step,
    "safe": safe_round,
    "byte-level": byte_level_step,
}
assert tuple(STEPS) == STRATEGIES


def _events(run: Run) -> Iterator[Event]:
    step = STEPS[run.config.strategy]
    yield run.started_event()
    while not run.done():
        run.stats.rounds += 1
        yield from step(run)
        damage = run.damage_event()
        if damage:
            yield damage
    yield run.finished_event()


def decode(
    models: Sequence[LoadedModel],
    prompt: str,
    config: DecodeConfig = DecodeConfig(),
    cancel: threading.Event | None = None,
    scheduler: Scheduler | None = None,
) -> Iterator[Event]:
    """Run one strategy; yields events as they happen. Setting `cancel` (4th argument) ends the run at the
    next check, with stop_reason "stopped" (`StopReason.CANCELLED`). Raises SafeEngineError subclasses on
    bad input (checked here, before the first event). Runs decoding at the same time on one scheduler (the
    process's unless given another) share forward passes (`runtime/scheduler.py`); the run's KV slots are
    handed back when its events end or the iterator is closed."""
    active = ActiveRun(scheduler)
    with active.opening():
        run = Run(models, prompt, config, cancel)
    return active.drive(_events(run))
