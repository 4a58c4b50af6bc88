"""One forward pass for the waiting requests of every run: the KV-slot batching executor of one model.

`ModelExecutor` is the `Executor` the scheduler (`scheduler.py`: when a pass fires, whose turn a device
is) drives for a model loaded in this process: it packs the new tokens of every row into one forward pass
without padding, each row reading and writing its own `KVSlot` (`kv_slots.py`), and keeps closed runs'
slots for the next run whose prompt starts the same way. One executor per model weights and scheduler
(`executors.model_executor`, which serves a model the KV slots cannot hold on its own cache instead),
shared by every run on that scheduler.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch

from .kv_slots import KVSlot, SlotBatch, SlotRow, common_prefix, install_slot_attention
from .scheduler import Request, Scheduler, SlotExecutor
from .weights import Weights

_PLACEHOLDER_MASK = torch.ones(1, 1, 1, 1, dtype=torch.bool)  # a prepared 4D mask stops transformers building one


class ModelExecutor(SlotExecutor[KVSlot]):
    """Pending requests, free slots and the forward pass of one model.

    Slots: a closed run's slot is kept (buffers and all) for the next run, up to `keep_free` of them and
    `keep_free_bytes` in all; a run adopts a kept slot's prefix when its prompt shares `min_shared` tokens
    with it at least."""

    def __init__(
        self,
        scheduler: Scheduler,
        weights: Weights,
        keep_free: int = 8,
        keep_free_bytes: int = 256 * 2**20,
        min_shared: int = 8,
    ):
        super().__init__(scheduler, weights.name, weights.device)
        self.keep_free, self.keep_free_bytes, self.min_shared = keep_free, keep_free_bytes, min_shared
        self._model = weakref.ref(weights.module)  # the scheduler's registry must not keep a model alive
        self.device = weights.device
        self._live: weakref.WeakSet[KVSlot] = weakref.WeakSet()  # open runs' slots
        self._free: list[KVSlot] = []  # closed runs' slots, kept with their tokens
        self._mask = _PLACEHOLDER_MASK.to(weights.device)
        install_slot_attention(weights.module)

    # ------------------------------------------------------------ slots
    def take_slot(self, ids: Sequence[int] = ()) -> tuple[KVSlot, int]:
        """A slot for a run about to feed `ids`, and how many of them it already holds: the free slot
        whose tokens share the longest prefix with `ids` (at least `min_shared`, never all: the last id
        is fed for its logits), its keys and values for that prefix kept; else a free slot emptied, or a
        new one. Free slots only: no pass writes into them, so a prefix cannot change while it is adopted."""
        with self.scheduler.lock:
            slot, shared = None, 0
            for candidate in self._free:
                n = min(common_prefix(candidate.ids, ids), len(ids) - 1)
                if n >= max(shared + 1, self.min_shared):
                    slot, shared = candidate, n
            if slot is not None:
                self._free.remove(slot)
            elif self._free:
                slot = self._free.pop()
            else:
                slot = KVSlot()
            self._live.add(slot)
        slot.length, slot.ids = shared, []
        return slot, shared

    def release(self, slot: KVSlot, ids: Sequence[int] = ()) -> None:
        """A closed run's slot, holding `ids`: kept for the next run (within `keep_free` and
        `keep_free_bytes`; a run whose prompt starts the same way adopts its prefix); otherwise its memory
        is freed."""
        slot.ids = list(ids[: slot.length])
        with self.scheduler.lock:
            self._live.discard(slot)
            kept = sum(s.nbytes for s in self._free) + slot.nbytes
            if len(self._free) < self.keep_free and kept <= self.keep_free_bytes:
                self._free.append(slot)

    def open_slots(self) -> int:
        """Slots of open runs (a closed run hands its slot back)."""
        with self.scheduler.lock:
            return len(self._live)

    def free_slots(self) -> int:
        """Closed runs' slots kept for the next runs."""
        with self.scheduler.lock:
            return len(self._free)

    def slot_bytes(self) -> int:
        """Memory held by this model's KV slots, open runs' and kept free ones'."""
        with self.scheduler.lock:
            return sum(s.nbytes for s in [*self._live, *self._free])

    # ------------------------------------------------------------ passes
    def run_pass(self, batch: list[Request[KVSlot]]) -> None:
        ids, positions, keep, rows = [], [], [], []
        for request in batch:
            begin = len(ids)
            ids += request.chunk
            positions += range(request.offset, request.offset + len(request.chunk))
            keep += [begin + k for k in request.keep]
            rows.append(SlotRow(request.slot, request.offset, begin, len(ids)))
            request.slot.layers_written = 0
        device = self.device
        clock = self.scheduler.clock
        started = clock()
        with torch.inference_mode():
            out = self._model()(
                input_ids=torch.tensor([ids], device=device),
                position_ids=torch.tensor([positions], device=device),
                attention_mask=self._mask,
                use_cache=False,
                logits_to_keep=torch.tensor(keep, device=device),
                slot_batch=SlotBatch(rows),
            )
        kept = out.logits[0]
        logits = kept.cpu().float()  # the rows cross to the host in the model's dtype (half of fp32's bytes for bf16)
        seconds = clock() - started
        if any(row.slot.layers_written == 0 for row in rows):
            raise RuntimeError(
                f"{self.name} does not run its attention through transformers' attention interface, "
                "so the batched runtime cannot keep its cache"
            )
        self.note_pass(seconds)
        at = 0
        for request, row in zip(batch, rows):
            row.slot.length = row.offset + row.count
            mine = logits[at : at + len(request.keep)]
            request.logits = mine.clone() if len(batch) > 1 else mine  # a memo must not pin the whole pass
            at += len(request.keep)
            request.rows, request.started, request.seconds = len(batch), started, seconds
            request.logit_bytes = len(request.keep) * kept.shape[-1] * kept.element_size()
