"""Decoding strategies behind one interface: ``decode(models, prompt, config)`` yields events.

- ``single``: the drafter alone.
- ``per-token``: UniTE at every step (`per_token.py`): every model runs every step, the baseline whose
  collapse the paper reports.
- ``safe``: Generate → Verify → Ensemble (`safe.py`): the paper's algorithm, ``exact`` by default.

Every strategy decodes greedily, or samples with a temperature, top-p and seed (`sampling.py`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence

from .batching import ActiveRun
from .config import MAX_NEW_TOKENS, PER_TOKEN_COMMITS, SAFE_MODES, STRATEGIES, DecodeConfig
from .decoder import Decoder
from .events import Event
from .models import LoadedModel
from .per_token import per_token_step
from .runtime import SCHEDULER
from .safe import safe_round

__all__ = ["MAX_NEW_TOKENS", "PER_TOKEN_COMMITS", "SAFE_MODES", "STRATEGIES", "DecodeConfig", "decode"]


def single_round(run: Decoder) -> Iterator[Event]:
    """The drafter alone, n tokens at a time (the same drafting code SAFE uses)."""
    draft = run.draft(min(run.config.lookahead, run.remaining()))
    if not draft.ids:
        return
    yield run.draft_event(draft)
    pieces = []
    for token_id in draft.ids:
        piece, forced = run.override(run.stats.tokens + len(pieces), ([token_id], {"decision": "accepted"}))
        pieces.append(piece)
        if forced:  # the rest of the draft followed another text
            break
    event = run.commit(pieces)  # a stop sequence may end it early
    run.stats.accepted_drafts += sum(1 for t in event.tokens if t.decision == "accepted")
    yield event


STEPS: dict[str, Callable[[Decoder], Iterator[Event]]] = {
    "single": single_round,
    "per-token": per_token_step,
    "safe": safe_round,
}
assert tuple(STEPS) == STRATEGIES


def _events(run: Decoder) -> Iterator[Event]:
    step = STEPS[run.config.strategy]
    yield run.started_event()
    while not run.done():
        run.round += 1
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
    stop: threading.Event | None = None,
) -> Iterator[Event]:
    """Run one strategy; yields events as they happen. Raises SafeEngineError subclasses on bad input
    (checked here, before the first event). Runs decoding at the same time share forward passes
    (`runtime.py`); the run's KV slots are handed back when its events end or the iterator is closed."""
    run = ActiveRun(SCHEDULER)
    with run.opening():
        decoder = Decoder(models, prompt, config, stop)
    return run.drive(_events(decoder))
