"""One run at a time on transformers' own cache: the executor for a model the KV slots cannot batch.

The KV-slot runtime (`batching.py`, `kv_slots.py`) replaces a model's attention, so it can only serve a
model whose every layer's state is its attention's keys and values, written through transformers'
attention interface (`executors.py` checks that when the model loads). Any other model (attention code of
its own, as in Falcon, GPT-J or Bloom; layers that carry a recurrent or convolution state, as in LFM2 or
Qwen3-Next) runs here as transformers runs it in `generate`: each run keeps the cache the model itself
fills, and each request is a forward pass of its own, so these runs never share a pass. Slower, and the
tokens are transformers' own.

A rollback (a SAFE replacement, a dropped draft) crops the cache where every layer is a plain growing
`DynamicLayer`; any other cache (a sliding window's, a recurrent state) cannot go back, so the run's
tokens up to the rollback point are fed again into a fresh cache.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch

from .scheduler import Request, Scheduler, SlotExecutor
from .transformers_api import cache_keyword, croppable, fresh_cache, returned_cache
from .weights import Weights


class OwnCache:
    """One run's state on the model: the ids its cache holds, and the cache (None before the first pass).

    `length` is what the run's session keeps: a rollback only lowers it, and the next pass makes the cache
    agree (`OwnCacheExecutor.run_pass`)."""

    def __init__(self):
        self.length = 0
        self.ids: list[int] = []
        self.cache = None


class OwnCacheExecutor(SlotExecutor[OwnCache]):
    """A model's requests, answered one run at a time on transformers' cache (the module's docstring)."""

    def __init__(self, scheduler: Scheduler, weights: Weights):
        super().__init__(scheduler, weights.name, weights.device)
        self._model = weakref.ref(weights.module)  # the scheduler's registry must not keep a model alive
        self._cache_keyword = cache_keyword(weights.module)
        self.device = weights.device
        self._open = 0

    def take_slot(self, ids: Sequence[int] = ()) -> tuple[OwnCache, int]:
        """A fresh state for a run (nothing is shared between runs, so no prefix is adopted)."""
        with self.scheduler.lock:
            self._open += 1
        return OwnCache(), 0

    def release(self, slot: OwnCache, ids: Sequence[int] = ()) -> None:
        """A closed run's cache is dropped."""
        slot.cache, slot.ids = None, []
        with self.scheduler.lock:
            self._open -= 1

    def open_slots(self) -> int:
        with self.scheduler.lock:
            return self._open

    def free_slots(self) -> int:
        return 0

    def slot_bytes(self) -> int:
        return 0  # the caches are transformers' objects; their size is not tracked here

    def run_pass(self, batch: list[Request[OwnCache]]) -> None:
        for request in batch:  # one forward pass per run: each has its own cache
            self._answer(request)

    def _answer(self, request: Request[OwnCache]) -> None:
        state = request.slot
        offset, chunk, keep = request.offset, list(request.chunk), list(request.keep)
        if offset < len(state.ids):
            if croppable(state.cache):
                state.cache.crop(offset - len(state.ids))
                del state.ids[offset:]
            else:  # the cache cannot go back: feed the kept ids again, into a fresh cache
                chunk, keep = state.ids[:offset] + chunk, [k + offset for k in keep]
                state.cache, state.ids, offset = None, [], 0
        model = self._model()
        if state.cache is None:
            state.cache = fresh_cache(model)
        clock = self.scheduler.clock
        started = clock()
        with torch.inference_mode():
            out = model(
                input_ids=torch.tensor([chunk], device=self.device),
                use_cache=True,
                logits_to_keep=torch.tensor(keep, device=self.device),
                **({} if state.cache is None else {self._cache_keyword: state.cache}),
            )
        seconds = clock() - started
        state.cache = returned_cache(out)
        state.ids += chunk
        state.length = len(state.ids)
        kept = out.logits[0]
        request.logits = kept.cpu().float()
        request.rows, request.started, request.seconds = 1, started, seconds
        request.logit_bytes = len(keep) * kept.shape[-1] * kept.element_size()
        self.note_pass(seconds)
