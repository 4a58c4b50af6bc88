"""Who computes when: the scheduler that arbitrates the devices between the executors of every run.

Every run (a `decode()` in its own thread, or a bare `ModelSession`) asks its model sessions for logits;
each request goes to its model's executor (`Executor`; the KV-slot batching one is `batching.ModelExecutor`)
and waits in `Scheduler.answer` until a pass answers it. When a model's waiting requests fire, and which model
a shared device serves next, is the policy (`policy.py`: pure functions of what the scheduler sees); this
module does the rest:

- a pass takes the pending requests oldest first, up to `max_rows` runs and `max_tokens` new tokens;
- passes on one device run one at a time: the cores are shared anyway, and requests that arrive
  meanwhile join the next pass;
- the thread whose request makes a pass due runs it (no scheduler thread); a pass that raises is
  retried row by row, so a failing run fails alone with its own error;
- a run counts as computing while any of its threads does (`set_busy`), which the fire rule reads.

One `Scheduler` owns all of this: which runs compute, which device is held and by whom, when each device
was freed, how often each executor was passed over. Its state changes only under its `lock`, and the
methods that need the lock check that the calling thread holds it (`SchedulerLock.require`). The process
has one (`SCHEDULER`); a run, an `ActiveRun` and a session take the scheduler they use, so a test builds
its own instead of touching the process's.
"""

from __future__ import annotations

import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from . import policy

if TYPE_CHECKING:
    import torch

_ident = threading.get_ident
E = TypeVar("E", bound="Executor")
S = TypeVar("S")  # what a request carries to its executor: a run's slot, or a remote call's question
SlotT = TypeVar("SlotT", bound="Slot")


class LockNotHeld(RuntimeError):
    """Code that needs the scheduler's lock ran without it: a bug in the caller, never a user's error."""


class SchedulerLock:
    """The scheduler's reentrant lock and the condition its waiters sleep on, knowing which thread holds it.

    `with lock:` takes it (again, in the thread holding it); `require()` raises `LockNotHeld` unless this
    thread holds it, one comparison; `wait` and `wait_for` sleep until `notify_all`, giving the lock up
    meanwhile; `released()` gives it up for a block (a pass runs without it).
    """

    __slots__ = ("_lock", "_condition", "_owner", "_depth")

    def __init__(self):
        self._lock = threading.RLock()
        self._condition = threading.Condition(self._lock)
        self._owner: int | None = None  # the holding thread's id; only that thread sets or clears it
        self._depth = 0

    def __enter__(self) -> SchedulerLock:
        self._lock.acquire()
        self._owner = _ident()
        self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if not self._depth:
            self._owner = None
        self._lock.release()

    def held(self) -> bool:
        """Whether the calling thread holds the lock."""
        return self._owner == _ident()

    def require(self) -> None:
        if self._owner != _ident():
            raise LockNotHeld("this needs the scheduler's lock: call it inside `with scheduler.lock:`")

    def wait(self, timeout: float | None = None) -> bool:
        """Give the lock up until `notify_all` (or `timeout` seconds), then hold it again as before."""
        self.require()
        depth, self._depth, self._owner = self._depth, 0, None
        try:
            return self._condition.wait(timeout)
        finally:
            self._owner, self._depth = _ident(), depth

    def wait_for(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            self.wait()

    def notify_all(self) -> None:
        self.require()
        self._condition.notify_all()

    @contextmanager
    def released(self) -> Iterator[None]:
        """Inside, the calling thread (which holds the lock) does not; it holds it again afterwards."""
        self.require()
        depth, self._depth, self._owner = self._depth, 0, None
        for _ in range(depth):
            self._lock.release()
        try:
            yield
        finally:
            for _ in range(depth):
                self._lock.acquire()
            self._owner, self._depth = _ident(), depth


class Slot(Protocol):
    """A run's state on a model served in this process, kept by the run's session from its first feed to its
    close: positions 0..length-1 are computed; a rollback only lowers `length`, and the next pass makes the
    state agree (`kv_slots.KVSlot`, `own_cache.OwnCache`)."""

    length: int


@dataclass
class Request(Generic[S]):
    """Feed `chunk` at logical positions offset.. into `slot`; logits after each chunk index in `keep`.

    The scheduler reads `run`, `submitted`, `done`, `resumed` and `error`; the rest is the executor's: `slot`
    is what its pass needs of the run (a `KVSlot` for the batching executor)."""

    run: ActiveRun
    slot: S
    offset: int
    chunk: list[int]
    keep: list[int]
    submitted: float = 0.0  # on the scheduler's clock: stamped by `Scheduler.answer`
    done: bool = False
    logits: torch.Tensor | None = None  # [len(keep), vocab], fp32, CPU
    error: Exception | None = None
    rows: int = 0  # runs that shared the pass that answered
    resumed: bool = False  # its run counts as computing again (set with `done`)
    started: float = 0.0
    seconds: float = 0.0
    logit_bytes: int = 0  # the answer's logits as they left the model's device


class Executor(ABC, Generic[S]):
    """What the scheduler drives: one model's queue of requests, and how a pass answers a batch of them.

    The scheduler decides when a pass fires and on which device it runs; the executor decides what a pass
    is. The KV-slot batching executor (`batching.ModelExecutor`) packs the rows of many runs into one forward
    pass; an executor for a model kept on transformers' own cache, or for a model behind an HTTP server,
    implements `run_pass` its own way. The queue's methods need the scheduler's lock; `run_pass` runs
    without it, on the device the scheduler handed over (`device_key`: passes on one key go one at a time).
    An executor whose runs each keep a state on the model is a `SlotExecutor`.
    """

    def __init__(self, scheduler: Scheduler, name: str, device_key: str):
        self.scheduler, self.name, self.device_key = scheduler, name, device_key
        self.recent_pass_s: float | None = None  # a recent pass's wall time (the fire rule waits half of it)
        self._queue: list[Request[S]] = []

    def note_pass(self, seconds: float) -> None:
        """Fold a pass's wall time into `recent_pass_s`, a moving average: one slow pass barely moves the wait."""
        self.recent_pass_s = seconds if self.recent_pass_s is None else 0.8 * self.recent_pass_s + 0.2 * seconds

    def enqueue(self, request: Request[S]) -> None:
        self.scheduler.lock.require()
        self._queue.append(request)

    def withdraw(self, request: Request[S]) -> None:
        """Take back a request no pass has taken (its thread was interrupted while waiting)."""
        self.scheduler.lock.require()
        if request in self._queue:
            self._queue.remove(request)

    def waiting(self) -> int:
        """Requests waiting for a pass."""
        self.scheduler.lock.require()
        return len(self._queue)

    def oldest_submitted(self) -> float:
        """When the oldest waiting request was submitted (on the scheduler's clock)."""
        self.scheduler.lock.require()
        return self._queue[0].submitted

    def take_batch(self, max_rows: int, max_tokens: int) -> list[Request[S]]:
        """The next pass's requests, oldest first: up to `max_rows`, and `max_tokens` new tokens past the first."""
        self.scheduler.lock.require()
        taken, tokens = [], 0
        while self._queue and len(taken) < max_rows:
            if taken and tokens + len(self._queue[0].chunk) > max_tokens:
                break
            taken.append(self._queue.pop(0))
            tokens += len(taken[-1].chunk)
        return taken

    @abstractmethod
    def run_pass(self, batch: list[Request[S]]) -> None:
        """Answer every request of the batch in one pass, without the scheduler's lock: set each one's
        `logits`, `rows`, `started`, `seconds`, `logit_bytes`; raise if the pass fails (the scheduler then
        runs the requests one by one, so each failing run gets its own error)."""


class SlotExecutor(Executor[SlotT]):
    """An executor of a model in this process, whose runs each hold a `Slot` from their session's first feed
    to its close: what a `session.ModelSession` drives. The slot methods take the scheduler's lock themselves."""

    @abstractmethod
    def take_slot(self, ids: Sequence[int] = ()) -> tuple[SlotT, int]:
        """A slot for a run about to feed `ids`, and how many of them it already holds (a prefix a closed run
        left, where the executor keeps closed runs' slots)."""

    @abstractmethod
    def release(self, slot: SlotT, ids: Sequence[int] = ()) -> None:
        """A closed run's slot, holding `ids`, comes back: kept for a next run, or freed."""

    @abstractmethod
    def open_slots(self) -> int:
        """Slots of open runs."""

    @abstractmethod
    def free_slots(self) -> int:
        """Closed runs' slots kept for the next runs."""

    @abstractmethod
    def slot_bytes(self) -> int:
        """Memory held by the slots, open runs' and kept ones' (0 where the executor does not track it)."""


class Scheduler:
    """Device arbitration for every executor that asks it: the fire rule, whose turn a device is, and the
    runs computing. Passes go through `answer`; everything else reads or changes that state for it."""

    def __init__(
        self,
        max_wait_s: float = 0.02,
        max_rows: int = 16,
        max_tokens: int = 2048,
        patience: int = 4,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.max_wait_s, self.max_rows, self.max_tokens, self.patience = max_wait_s, max_rows, max_tokens, patience
        self.clock = clock  # requests' arrival, devices' release, the fire rule's waits (tests pass their own)
        self.lock = SchedulerLock()  # guards everything below and every executor's queue
        self._executors: weakref.WeakKeyDictionary[object, Executor] = weakref.WeakKeyDictionary()
        self._passed_over: weakref.WeakKeyDictionary[Executor, int] = weakref.WeakKeyDictionary()
        self._holders: dict[str, object] = {}  # device -> who holds it (an executor's pass, or `device()`)
        self._freed: dict[str, float] = {}  # device -> when its last pass ended
        self._busy: set[ActiveRun] = set()  # runs with a thread computing (`ActiveRun.threads_computing` > 0)
        self._runs: weakref.WeakSet[ActiveRun] = weakref.WeakSet()  # runs that opened a session

    # ------------------------------------------------------------ executors and runs
    def executor(self, key: object, make: Callable[[], E]) -> E:
        """The executor registered under `key`, made by `make` the first time. The key is held weakly (a model's
        weights for the batching executor), so an executor goes with what it serves."""
        with self.lock:
            found = self._executors.get(key)
            if found is None:
                found = self._executors[key] = make()
            return found

    def register_run(self, run: ActiveRun) -> None:
        """A run opened a session: `runs_on` counts it while it holds one."""
        with self.lock:
            self._runs.add(run)

    def runs_on(self, keys: Iterable[object]) -> int:
        """How many runs hold an open session on the executor of any of these keys right now: the runs sharing
        their passes (a run using two of them, or one twice, counts once)."""
        with self.lock:
            executors = [e for e in map(self._executors.get, keys) if e is not None]
            return sum(any(run.holds(e) for e in executors) for run in list(self._runs))

    def set_busy(self, run: ActiveRun, busy: bool) -> None:
        """A thread of the run starts (True) or stops (False) computing: the run is busy while any of its
        threads computes (a driven run has one; SAFE's overlap adds helpers, `ActiveRun.helper`)."""
        with self.lock:
            run.threads_computing += 1 if busy else -1
            if run.threads_computing > 0:
                self._busy.add(run)
            else:
                self._busy.discard(run)
            self.lock.notify_all()

    def is_busy(self, run: ActiveRun) -> bool:
        """Whether a thread of the run computes right now."""
        with self.lock:
            return run in self._busy

    # ------------------------------------------------------------ the fire rule (`policy.py` decides)
    def _view(self, executor: Executor) -> policy.Queue | None:
        """The executor's waiting requests as the policy sees them now (under the lock); None if none wait."""
        waiting = executor.waiting()
        if not waiting:
            return None
        return policy.Queue(
            waiting=waiting,
            oldest=executor.oldest_submitted(),
            freed=self._freed.get(executor.device_key, 0.0),
            recent_pass_s=executor.recent_pass_s,
            holder_computes=any(run.holds(executor) for run in self._busy),
            passed_over=self._passed_over.get(executor, 0),
        )

    def is_due(self, executor: Executor) -> bool:
        """Whether the executor's waiting requests should go now (under the lock; `policy.is_due`)."""
        queue = self._view(executor)
        return queue is not None and policy.is_due(queue, self.clock(), self.max_wait_s)

    def seconds_until_due(self, executor: Executor) -> float:
        """Until the oldest of the executor's waiting requests has waited long enough (under the lock; some
        must wait; `policy.seconds_until_due`)."""
        return policy.seconds_until_due(self._view(executor), self.clock(), self.max_wait_s)

    # ------------------------------------------------------------ devices
    def has_turn(self, executor: Executor) -> bool:
        """Whether the executor, with requests waiting, may take its device now (under the lock): the device is
        free and no other due executor on it comes first (`policy.next_on_device`; a tie goes to the asker, whose
        thread takes the device under the same lock)."""
        self.lock.require()
        if executor.device_key in self._holders:
            return False
        mine = self._view(executor)
        if mine is None:
            return False
        now = self.clock()
        rivals = [self._view(e) for e in self._on(executor.device_key) if e is not executor]
        due = [q for q in rivals if q is not None and policy.is_due(q, now, self.max_wait_s)]
        return policy.next_on_device([mine, *due], self.patience) == 0

    def take_device(self, executor: Executor) -> None:
        """The executor's pass holds its device (under the lock, when it `has_turn`); every other due executor
        on the device was passed over once more."""
        self.lock.require()
        device = executor.device_key
        if device in self._holders:
            raise RuntimeError(f"{device} is held by {self._holders[device]!r}")
        self._holders[device] = executor
        for e in self._on(device):
            if e is not executor and self.is_due(e):
                self._passed_over[e] = self._passed_over.get(e, 0) + 1
        self._passed_over[executor] = 0

    def release_device(self, device: str) -> None:
        """The pass (or hold) on the device ended: the next may take it."""
        with self.lock:
            del self._holders[device]
            self._freed[device] = self.clock()
            self.lock.notify_all()

    def _on(self, device: str) -> list[Executor]:
        return [e for e in self._executors.values() if e.device_key == device]

    def passed_over(self, executor: Executor) -> int:
        """Passes of other executors on its device that went while it was due, since its own last pass."""
        with self.lock:
            return self._passed_over.get(executor, 0)

    @contextmanager
    def device(self, device: str) -> Iterator[None]:
        """Hold the device: passes on it wait (tests use this to gather requests into one pass)."""
        holder, device = object(), str(device)
        with self.lock:
            self.lock.wait_for(lambda: device not in self._holders)
            self._holders[device] = holder
        try:
            yield
        finally:
            self.release_device(device)

    # ------------------------------------------------------------ passes
    def answer(self, executor: Executor[S], request: Request[S]) -> Request[S]:
        """Queue the request and return when a pass answered it (this thread may run that pass); raises the
        request's own error. Call it without the lock: it waits."""
        lock = self.lock
        if lock.held():
            raise RuntimeError("Scheduler.answer waits for a pass: call it without the scheduler's lock")
        with lock:
            request.submitted = self.clock()
            executor.enqueue(request)
            self.set_busy(request.run, False)  # this thread of the run now waits
            try:
                while not request.done:
                    if not self.is_due(executor):
                        lock.wait(self.seconds_until_due(executor) if executor.waiting() else None)
                        continue
                    if not self.has_turn(executor):
                        lock.wait(self.max_wait_s)  # woken when the device frees; the timeout is a net
                        continue
                    self.take_device(executor)
                    batch = executor.take_batch(self.max_rows, self.max_tokens)
                    with lock.released():
                        self._fire(executor, batch)
            finally:
                if not request.done:  # interrupted while waiting
                    executor.withdraw(request)
                if not request.resumed:
                    self.set_busy(request.run, True)
        if request.error is not None:
            raise request.error
        return request

    def _fire(self, executor: Executor[S], batch: list[Request[S]]) -> None:
        """Run the pass on the device the executor holds, then hand the device back. Due is decided with
        the device taken, under the lock, so runs answered by the pass just ended (computing from that
        moment) are not left behind: two runs alternating between two models fall into step."""
        try:
            self._answer_batch(executor, batch)
        except BaseException as exc:  # interrupted: no request may wait forever
            for request in batch:
                request.error = request.error or RuntimeError(f"the forward pass was interrupted: {exc!r}")
            raise
        finally:
            with self.lock:
                for request in batch:
                    request.done = True
                    self.set_busy(request.run, True)  # it computes from here, not once it wakes
                    request.resumed = True
                self.release_device(executor.device_key)

    @staticmethod
    def _answer_batch(executor: Executor[S], batch: list[Request[S]]) -> None:
        """One pass for the batch; if it raises, each request alone (one run's error stays its own)."""
        try:
            executor.run_pass(batch)
        except Exception as exc:
            if len(batch) == 1:
                batch[0].error = exc
                return
            for request in batch:
                try:
                    executor.run_pass([request])
                except Exception as alone:
                    request.error = alone


_CURRENT = threading.local()


class ActiveRun:
    """One run's claim on the executors: its open sessions, and whether it is computing right now.

    `decode()` makes one per run and drives the run's events through `drive`, so the run counts as
    computing only while its strategy code runs (not while it waits on a pass, nor while its consumer
    holds an event). Sessions opened while a run is current belong to it (and use its scheduler); a session
    opened elsewhere gets a run of its own that never holds up anyone's pass.
    """

    def __init__(self, scheduler: Scheduler | None = None):
        self.scheduler = SCHEDULER if scheduler is None else scheduler
        self.sessions: weakref.WeakSet = weakref.WeakSet()
        # Its threads computing now, counted by `Scheduler.set_busy` under the lock: below 0 while a bare
        # session's run, never marked computing, waits on a pass.
        self.threads_computing = 0

    @staticmethod
    def current() -> ActiveRun | None:
        """The run this thread is opening sessions for or driving, if any."""
        return getattr(_CURRENT, "run", None)

    def holds(self, executor: Executor) -> bool:
        """Whether one of its open sessions is on the executor (under the scheduler's lock)."""
        self.scheduler.lock.require()
        return any(session.executor is executor for session in list(self.sessions))

    def attach(self, session) -> None:
        with self.scheduler.lock:
            self.sessions.add(session)
            self.scheduler.register_run(self)

    def detach(self, session) -> None:
        with self.scheduler.lock:
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
        with self.scheduler.lock:
            sessions = list(self.sessions)
        for session in sessions:
            session.close()


SCHEDULER = Scheduler()
"""The process's scheduler: every run and session uses it unless given another."""
