"""One model's decoding state in a run: its token ids, its KV slot and the logits it already computed.

`next_token_logits(ids, starts)` is the only way the strategies run a model. It keeps the longest
cached prefix of `ids` (a rollback only shortens the run's slot), feeds only the rest, and projects
the LM head only at the positions asked for. Logits already computed for a cached prefix are returned
from memory, so a drafted token that survives a round is never recomputed.

The feeding goes through the model's batching executor (`batching.py`), as the session's scheduler
(`scheduler.py`) decides: whatever other runs wait on the same model at the same moment share the pass,
each with its own slot (`kv_slots.py`); a run alone is a pass of one. A model the KV slots cannot hold
(`executors.py` decides when it loads) runs one run at a time on transformers' own cache instead
(`own_cache.py`); the session is the same. Close a session (or use it as a
context manager) to hand its slot back: a later run whose prompt starts with the same tokens (a chat
template's system turn, a benchmark's instructions, few-shot examples) adopts that slot and feeds only
the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..contract.sessions import ForwardStats, Sessions
from .executors import RuntimePath, model_executor, runtime_path
from .kv_slots import common_prefix
from .scheduler import SCHEDULER, ActiveRun, Request, Scheduler, Slot, SlotExecutor
from .weights import Weights

__all__ = ["SCHEDULER", "LocalSessions", "ModelSession", "runs_sharing"]


def runs_sharing(models: Sequence[Sessions], scheduler: Scheduler | None = None) -> int:
    """How many runs hold these models (their session factories) right now, i.e. share their forward passes
    (on the process's scheduler unless given another)."""
    return (SCHEDULER if scheduler is None else scheduler).runs_on([m.key for m in models])


@dataclass(frozen=True)
class LocalSessions:
    """The session factory of weights loaded in this process: the path they take through the runtime is
    decided once, from what they compute (`executors.runtime_path`), when the factory is made (`serve`)."""

    weights: Weights
    path: RuntimePath = field(default_factory=RuntimePath)

    @classmethod
    def serve(cls, weights: Weights) -> LocalSessions:
        """The factory for these weights on the path the load probes choose (ModelLoadError where none runs)."""
        return cls(weights, runtime_path(weights))

    @property
    def key(self) -> object:
        return self.weights.module

    def open(self, scheduler: Scheduler | None = None) -> ModelSession:
        return ModelSession(self, scheduler)

    def executor(self, scheduler: Scheduler) -> SlotExecutor:
        """The scheduler's executor for these weights (made on first use)."""
        return model_executor(scheduler, self.weights, self.path)

    def describe(self) -> dict:
        return {"runtime": self.path.name, **({"runtime_reason": self.path.reason} if self.path.reason else {})}


class ModelSession:
    """One model in one run. `scheduler`: the one whose passes it joins; by default the scheduler of the run
    opening it (`ActiveRun.opening`), else the process's. Opened while a run on that scheduler is current, it
    belongs to that run; otherwise to a run of its own that never holds up anyone's pass."""

    def __init__(self, local: LocalSessions, scheduler: Scheduler | None = None):
        run = ActiveRun.current()
        if scheduler is None:
            scheduler = SCHEDULER if run is None else run.scheduler
        if run is None or run.scheduler is not scheduler:
            run = ActiveRun(scheduler)
        self.name = local.weights.name
        self.cached_ids: list[int] = []
        self.stats = ForwardStats()
        self._memo: dict[int, torch.Tensor] = {}  # start index -> logits (fp32, CPU)
        self.scheduler = scheduler
        self.executor = local.executor(scheduler)
        self._slot: Slot | None = None  # taken at the first feed, when the prompt is known
        self._closed = False
        self._run = run
        self._run.attach(self)
        self._vocab_size = local.weights.vocab_size

    @property
    def slot(self) -> Slot | None:
        """The run's KV slot on this model (its own cache, off the KV slots): taken at the first feed, handed
        back at `close`."""
        return self._slot

    def __enter__(self) -> ModelSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Hand the slot back (idempotent); the session cannot compute afterwards."""
        if not self._closed:
            self._closed = True
            if self._slot is not None:
                self.executor.release(self._slot, self.cached_ids)
                self._slot = None
            self._run.detach(self)

    def next_token_logits(self, ids: Sequence[int], starts: Sequence[int]) -> torch.Tensor:
        """Logits of the distribution of ids[t] given ids[:t], for each t in `starts` (1 ≤ t ≤ len(ids))."""
        if self._closed:
            raise RuntimeError(f"the session on {self.name} is closed")
        if self._slot is None:  # the first feed: a finished run's slot may hold the start of `ids`
            self._slot, shared = self.executor.take_slot(ids)
            self.cached_ids, self.stats.reused = [int(i) for i in ids[:shared]], shared
        keep = common_prefix(self.cached_ids, ids)
        if keep < min(len(self.cached_ids), len(ids)):  # diverged (a prefix of the cache needs no crop)
            self._truncate(keep)
        missing = [t for t in starts if t not in self._memo]
        if missing:
            # Feed from the first uncached position; remembered logits past it are recomputed with it.
            feed_from = min(len(self.cached_ids), min(missing) - 1)
            self._forward(ids, feed_from, sorted({t for t in starts if t in missing or t > feed_from}))
        return torch.stack([self._memo[t] for t in starts])

    def _truncate(self, keep: int) -> None:
        del self.cached_ids[keep:]
        self._slot.length = keep
        self._memo = {t: v for t, v in self._memo.items() if t <= keep}

    def _forward(self, ids: Sequence[int], feed_from: int, wanted: Sequence[int]) -> None:
        """Feed ids[feed_from:max(wanted)]; the output at position p is the distribution of ids[p + 1]."""
        if not 1 <= wanted[0] <= wanted[-1] <= len(ids):
            raise ValueError(f"positions {wanted[0]}..{wanted[-1]} are outside the {len(ids)} ids given")
        if feed_from < len(self.cached_ids):
            self._truncate(feed_from)
        chunk = [int(i) for i in ids[feed_from : wanted[-1]]]
        if self._vocab_size and not all(0 <= i < self._vocab_size for i in chunk):
            raise ValueError(f"a token id outside {self.name}'s vocabulary of {self._vocab_size}")
        request = Request(self._run, self._slot, feed_from, chunk, [t - 1 - feed_from for t in wanted])
        self.scheduler.answer(self.executor, request)
        self.stats.passes += 1
        self.stats.positions += len(chunk)
        self.stats.seconds += request.seconds
        self.stats.rows += request.rows
        self.stats.wait_seconds += request.started - request.submitted
        self.stats.logit_bytes += request.logit_bytes
        self.cached_ids.extend(chunk)
        for t, row in zip(wanted, request.logits):
            self._memo[t] = row

    def forget_before(self, start: int) -> None:
        """Drop remembered logits that no later request can ask for (bounded memory on long runs)."""
        self._memo = {t: v for t, v in self._memo.items() if t >= start}
