"""One forward pass for the waiting requests of every run: a batching executor per model.

Every run (a `decode()` in its own thread, or a bare `ModelSession`) asks its model sessions for
logits; each request goes to its model's `ModelExecutor`, shared by the whole process. When to fire
(the rule the README's "Many runs at once" describes):

- fire model M's pending requests as soon as no run holding an open session on M is still computing
  (every such run is waiting on some executor, or has handed an event to its consumer); a run alone
  never waits;
- otherwise fire when the oldest pending request has waited `Scheduler.max_wait_s` (20 ms) or half
  of M's recent pass time, whichever is shorter, counted from its arrival or from the end of the pass
  on the device it arrived behind. A row joining costs far less than a pass of its own (the weights
  are read once), so waiting up to half a pass for a run still computing pays; the wait ends as soon as
  every run holding M is waiting somewhere;
- a pass takes the pending requests oldest first, up to `max_rows` runs and `max_tokens` new tokens;
- passes on one device run one at a time: the cores are shared anyway, and requests that arrive
  meanwhile join the next pass. When several models on a device are due, the one with the most rows
  waiting goes first, unless another has been passed over `Scheduler.patience` times: runs that wait
  on the verifier while others still draft then verify together, in one pass instead of several.

The thread whose request makes a pass due runs it (no scheduler thread). A pass that raises is
retried row by row, so a failing run fails alone with its own error.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from .kv_slots import KVSlot, SlotBatch, SlotRow, common_prefix, install_slot_attention

_PLACEHOLDER_MASK = torch.ones(1, 1, 1, 1, dtype=torch.bool)  # a prepared 4D mask stops transformers building one


class Scheduler:
    """The process-wide state the executors share: which runs are computing, one lock per device."""

    def __init__(
        self,
        max_wait_s=0.02,
        max_rows=16,
        max_tokens=2048,
        patience=4,
        keep_free=8,
        keep_free_bytes=256 * 2**20,
        min_shared=8,
    ):
        self.min_shared = min_shared  # prompt tokens a run must share with a free slot to adopt its prefix
        self.max_wait_s, self.max_rows, self.max_tokens, self.patience = max_wait_s, max_rows, max_tokens, patience
        self.keep_free, self.keep_free_bytes = keep_free, keep_free_bytes  # free slots kept per model, at most
        self.changed = threading.Condition()  # guards everything below and every executor's queue
        self.busy: set[ActiveRun] = set()
        self._using: dict[str, object] = {}  # device -> who holds it (an executor's pass, or `device()`)
        self.freed: dict[str, float] = {}  # device -> when its last pass ended
        self._executors: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.runs: weakref.WeakSet[ActiveRun] = weakref.WeakSet()  # runs that opened a session

    def executor(self, lm) -> ModelExecutor:
        with self.changed:
            if lm.model not in self._executors:
                self._executors[lm.model] = ModelExecutor(self, lm)
            return self._executors[lm.model]

    def runs_on(self, models) -> int:
        """How many runs hold an open session on any of these loaded models right now: the runs sharing
        their passes (a run using two of them, or one twice, counts once)."""
        with self.changed:
            executors = [self._executors[lm.model] for lm in models if lm.model in self._executors]
            return sum(any(run.holds(e) for e in executors) for run in list(self.runs))

    @contextmanager
    def device(self, device: str) -> Iterator[None]:
        """Hold the device: passes on it wait (tests use this to gather requests into one pass)."""
        holder, device = object(), str(device)
        with self.changed:
            self.changed.wait_for(lambda: device not in self._using)
            self._using[device] = holder
        try:
            yield
        finally:
            self._release(device)

    def _release(self, device: str) -> None:
        with self.changed:
            del self._using[device]
            self.freed[device] = time.perf_counter()
            self.changed.notify_all()

    def _turn(self, executor: ModelExecutor) -> bool:
        """Whether the due `executor` may take its device now (called under the lock): the device is free
        and no other due executor on it comes first (passed over `patience` times, then more rows waiting,
        then the older request)."""
        device = str(executor.device)
        if device in self._using:
            return False
        rivals = [e for e in self._executors.values() if str(e.device) == device and e is not executor and e._due()]

        def rank(e: ModelExecutor):
            return (e.passed_over >= self.patience, len(e.queue), -e.queue[0].submitted, id(e))

        return all(rank(executor) > rank(e) for e in rivals)

    def _take_device(self, executor: ModelExecutor) -> None:
        device = str(executor.device)
        self._using[device] = executor
        for e in self._executors.values():
            if str(e.device) == device and e is not executor and e._due():
                e.passed_over += 1
        executor.passed_over = 0

    def set_busy(self, run: ActiveRun, busy: bool) -> None:
        """A thread of the run starts (True) or stops (False) computing: the run is busy while any of its
        threads computes (a driven run has one; SAFE's overlap adds helpers, `ActiveRun.helper`)."""
        with self.changed:
            run.computing += 1 if busy else -1
            if run.computing > 0:
                self.busy.add(run)
            else:
                self.busy.discard(run)
            self.changed.notify_all()


@dataclass
class Request:
    """Feed `chunk` at logical positions offset.. into `slot`; logits after each chunk index in `keep`."""

    run: ActiveRun
    slot: KVSlot
    offset: int
    chunk: list[int]
    keep: list[int]
    submitted: float = field(default_factory=time.perf_counter)
    done: bool = False
    logits: torch.Tensor | None = None  # [len(keep), vocab], fp32, CPU
    error: Exception | None = None
    rows: int = 0  # runs that shared the pass that answered
    resumed: bool = False  # its run counts as computing again (set with `done`)
    started: float = 0.0
    seconds: float = 0.0
    logit_bytes: int = 0  # the answer's logits as they left the model's device


class ModelExecutor:
    """Pending requests, free slots and the forward pass of one model."""

    def __init__(self, scheduler: Scheduler, lm):
        self.scheduler = scheduler
        self._model = weakref.ref(lm.model)  # the scheduler's registry must not keep a model alive
        self.device, self.name = lm.device, lm.name
        self.queue: list[Request] = []
        self.passed_over = 0  # passes of other models on the device that went while this one was due
        self.live: weakref.WeakSet[KVSlot] = weakref.WeakSet()
        self.free: list[KVSlot] = []
        self.recent_pass_s: float | None = None
        self._mask = _PLACEHOLDER_MASK.to(lm.device)
        install_slot_attention(lm.model)

    # ------------------------------------------------------------ slots
    def take_slot(self, ids: Sequence[int] = ()) -> tuple[KVSlot, int]:
        """A slot for a run about to feed `ids`, and how many of them it already holds: the free slot
        whose tokens share the longest prefix with `ids` (at least `Scheduler.min_shared`, never all: the
        last id is fed for its logits), its keys and values for that prefix kept; else a free slot
        emptied, or a new one. Free slots only: no pass writes into them, so a prefix cannot change while
        it is adopted."""
        with self.scheduler.changed:
            slot, shared = None, 0
            for candidate in self.free:
                n = min(common_prefix(candidate.ids, ids), len(ids) - 1)
                if n >= max(shared + 1, self.scheduler.min_shared):
                    slot, shared = candidate, n
            if slot is not None:
                self.free.remove(slot)
            elif self.free:
                slot = self.free.pop()
            else:
                slot = KVSlot()
            self.live.add(slot)
        slot.length, slot.ids = shared, []
        return slot, shared

    def release(self, slot: KVSlot, ids: Sequence[int] = ()) -> None:
        """A closed run's slot, holding `ids`: kept (buffers and all) for the next run, up to `keep_free` of
        them and `keep_free_bytes` in all (a run whose prompt starts the same way adopts its prefix);
        otherwise its memory is freed."""
        slot.ids = list(ids[: slot.length])
        with self.scheduler.changed:
            self.live.discard(slot)
            kept = sum(s.nbytes for s in self.free) + slot.nbytes
            if len(self.free) < self.scheduler.keep_free and kept <= self.scheduler.keep_free_bytes:
                self.free.append(slot)

    def slot_bytes(self) -> int:
        """Memory held by this model's KV slots, open runs' and kept free ones'."""
        with self.scheduler.changed:
            return sum(s.nbytes for s in [*self.live, *self.free])

    # ------------------------------------------------------------ requests
    def compute(self, request: Request) -> Request:
        """Queue the request and return when a pass answered it (this thread may run that pass)."""
        changed = self.scheduler.changed
        with changed:
            self.queue.append(request)
            self.scheduler.set_busy(request.run, False)  # this thread of the run now waits
            try:
                while not request.done:
                    if not self._due():
                        changed.wait(self._time_left() if self.queue else None)
                        continue
                    if not self.scheduler._turn(self):
                        changed.wait(self.scheduler.max_wait_s)  # woken when the device frees; the timeout is a net
                        continue
                    self.scheduler._take_device(self)
                    batch = self._take()
                    changed.release()
                    try:
                        self._fire(batch)
                    finally:
                        changed.acquire()
            finally:
                if not request.done and request in self.queue:  # interrupted while waiting
                    self.queue.remove(request)
                if not request.resumed:
                    self.scheduler.set_busy(request.run, True)
        if request.error is not None:
            raise request.error
        return request

    def _wait_s(self) -> float:
        if self.recent_pass_s is None:
            return self.scheduler.max_wait_s
        return min(self.scheduler.max_wait_s, 0.5 * self.recent_pass_s)

    def _due(self) -> bool:
        if not self.queue:
            return False
        if not any(run.holds(self) for run in self.scheduler.busy):
            return True
        return self._time_left() <= 0

    def _time_left(self) -> float:
        """The wait runs from when the oldest request could first have gone: its arrival, or the end of the
        pass it arrived behind (else runs that alternate with each other would never meet)."""
        since = max(self.queue[0].submitted, self.scheduler.freed.get(str(self.device), 0.0))
        return since + self._wait_s() - time.perf_counter()

    def _take(self) -> list[Request]:
        taken, tokens = [], 0
        while self.queue and len(taken) < self.scheduler.max_rows:
            if taken and tokens + len(self.queue[0].chunk) > self.scheduler.max_tokens:
                break
            taken.append(self.queue.pop(0))
            tokens += len(taken[-1].chunk)
        return taken

    def _fire(self, batch: list[Request]) -> None:
        """Run the pass on the device this executor holds, then hand the device back. Due is decided with
        the device taken, under the lock, so runs answered by the pass just ended (computing from that
        moment) are not left behind: two runs alternating between two models fall into step."""
        try:
            self._answer(batch)
        except BaseException as exc:  # interrupted: no request may wait forever
            for request in batch:
                request.error = request.error or RuntimeError(f"the forward pass was interrupted: {exc!r}")
            raise
        finally:
            with self.scheduler.changed:
                for request in batch:
                    request.done = True
                    self.scheduler.set_busy(request.run, True)  # it computes from here, not once it wakes
                    request.resumed = True
                self.scheduler._release(str(self.device))

    def _answer(self, batch: list[Request]) -> None:
        """One pass for the batch; if it raises, each request alone (one run's error stays its own)."""
        try:
            self._pass(batch)
        except Exception as exc:
            if len(batch) == 1:
                batch[0].error = exc
                return
            for request in batch:
                try:
                    self._pass([request])
                except Exception as alone:
                    request.error = alone

    def _pass(self, batch: list[Request]) -> None:
        ids, positions, keep, rows = [], [], [], []
        for request in batch:
            begin = len(ids)
            ids += request.chunk
            positions += range(request.offset, request.offset + len(request.chunk))
            keep += [begin + k for k in request.keep]
            rows.append(SlotRow(request.slot, request.offset, begin, len(ids)))
            request.slot.layers_written = 0
        device = self.device
        started = time.perf_counter()
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
        seconds = time.perf_counter() - started
        if any(row.slot.layers_written == 0 for row in rows):
            raise RuntimeError(
                f"{self.name} does not run its attention through transformers' attention interface, "
                "so the batched runtime cannot keep its cache"
            )
        self.recent_pass_s = seconds if self.recent_pass_s is None else 0.8 * self.recent_pass_s + 0.2 * seconds
        at = 0
        for request, row in zip(batch, rows):
            row.slot.length = row.offset + row.count
            mine = logits[at : at + len(request.keep)]
            request.logits = mine.clone() if len(batch) > 1 else mine  # a memo must not pin the whole pass
            at += len(request.keep)
            request.rows, request.started, request.seconds = len(batch), started, seconds
            request.logit_bytes = len(request.keep) * kept.shape[-1] * kept.element_size()


_CURRENT = threading.local()


class ActiveRun:
    """One run's claim on the executors: its open sessions, and whether it is computing right now.

    `decode()` makes one per run and drives the run's events through `drive`, so the run counts as
    computing only while its strategy code runs (not while it waits on a pass, nor while its consumer
    holds an event). Sessions opened while a run is current belong to it; a session opened elsewhere
    gets a run of its own that never holds up anyone's pass.
    """

    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self.sessions: weakref.WeakSet = weakref.WeakSet()
        self.computing = 0  # its threads running strategy code right now (not waiting on a pass or a consumer)

    @staticmethod
    def current(scheduler: Scheduler) -> ActiveRun:
        return getattr(_CURRENT, "run", None) or ActiveRun(scheduler)

    def holds(self, executor: ModelExecutor) -> bool:
        """Whether one of its open sessions is on the executor's model (called under the scheduler lock)."""
        return any(session.executor is executor for session in list(self.sessions))

    def attach(self, session) -> None:
        with self.scheduler.changed:
            self.sessions.add(session)
            self.scheduler.runs.add(self)

    def detach(self, session) -> None:
        with self.scheduler.changed:
            self.sessions.discard(session)

    @contextmanager
    def opening(self) -> Iterator[None]:
        """Sessions opened inside belong to this run; if the block fails, they are closed."""
        previous, _CURRENT.run = getattr(_CURRENT, "run", None), self
        try:
            yield
        except BaseException:
            self.close()
            raise
        finally:
            _CURRENT.run = previous

    def drive(self, events: Iterator) -> Iterator:
        """Yield the run's events; computing while producing one; its sessions close when it ends (held here,
        since the run's own objects go with its finished iterator, and a closed session's slot goes back
        to its executor with its tokens, for the next run to reuse)."""
        held: list = []
        try:
            while True:
                previous, _CURRENT.run = getattr(_CURRENT, "run", None), self
                self.scheduler.set_busy(self, True)
                try:
                    event = next(events)
                except StopIteration:
                    return
                finally:
                    self.scheduler.set_busy(self, False)
                    _CURRENT.run = previous
                held = list(self.sessions)
                yield event
        finally:
            events.close()
            self.close()
            del held

    @contextmanager
    def helper(self) -> Iterator[None]:
        """A thread the run started computes for it inside (SAFE's overlap: a verifier's pass, the next draft)."""
        self.scheduler.set_busy(self, True)
        try:
            yield
        finally:
            self.scheduler.set_busy(self, False)

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """This thread of the run waits inside (on its helpers), so it does not hold up anyone's pass."""
        self.scheduler.set_busy(self, False)
        try:
            yield
        finally:
            self.scheduler.set_busy(self, True)

    def close(self) -> None:
        with self.scheduler.changed:
            sessions = list(self.sessions)
        for session in sessions:
            session.close()
