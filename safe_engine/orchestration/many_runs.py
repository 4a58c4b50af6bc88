"""Many prompts at once: each request is an ordinary `decode()` in a thread of its own, so their forward
passes batch (`batching.py`) while every run keeps its own strategy, cache, sampler and events. A single run
can be driven the same way (`decode_ahead`) when its consumer is slow between events."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from ..contract.config import DecodeConfig
from ..contract.events import Event
from ..models.loading import LoadedModel
from ..strategies.decoding import decode

if TYPE_CHECKING:
    from ..runtime.scheduler import Scheduler

_END = object()


@dataclass(frozen=True)
class DecodeRequest:
    """One run: a prompt, its config, and its own models when they differ from the batch's."""

    prompt: str
    config: DecodeConfig = DecodeConfig()
    models: Sequence[LoadedModel] | None = None


class RunHandle:
    """One run of `decode_many`: its events as they come, its outcome, and a way to stop it alone."""

    def __init__(self, index: int, request: DecodeRequest, stop: threading.Event | None = None):
        self.index, self.request = index, request
        self.stop = stop or threading.Event()
        self.error: Exception | None = None  # why the run failed (bad input, a model error), once done
        self.history: list[Event] = []
        self._stream: queue.Queue = queue.Queue()
        self._finished = threading.Event()

    def cancel(self) -> None:
        """End this run at its next step (its RunFinished says "stopped"); the others go on."""
        self.stop.set()

    @property
    def done(self) -> bool:
        return self._finished.is_set()

    def events(self) -> Iterator[Event]:
        """This run's events as they happen (once); raises the run's error after its last event."""
        while (event := self._stream.get()) is not _END:
            yield event
        if self.error is not None:
            raise self.error

    def result(self, timeout: float | None = None) -> list[Event]:
        """Every event of the run, when it has ended; raises the run's error."""
        if not self._finished.wait(timeout):
            raise TimeoutError(f"run {self.index} has not finished")
        if self.error is not None:
            raise self.error
        return list(self.history)

    def _run(self, events: Callable[[], Iterator[Event]]) -> None:
        try:
            for event in events():
                self.history.append(event)
                self._stream.put(event)
        except Exception as exc:  # reported through the handle: one run's failure is its own
            self.error = exc
        finally:
            self._finished.set()
            self._stream.put(_END)


def decode_many(
    models: Sequence[LoadedModel],
    requests: Sequence[DecodeRequest],
    max_parallel: int = 8,
    scheduler: Scheduler | None = None,
) -> list[RunHandle]:
    """Start every request (at most `max_parallel` decoding at a time; the next joins when one ends)
    and return one handle per request, in order. Each run gives the tokens it gives alone, except
    where float differences between batch shapes flip a near-tie. `scheduler`: the one the runs share
    (the process's unless given another)."""
    handles = [RunHandle(i, request) for i, request in enumerate(requests)]
    pool = ThreadPoolExecutor(max_workers=max(1, max_parallel), thread_name_prefix="decode-many")
    for handle in handles:
        r = handle.request
        pool.submit(handle._run, partial(decode, r.models or models, r.prompt, r.config, handle.stop, scheduler))
    pool.shutdown(wait=False)
    return handles


def decode_ahead(
    models: Sequence[LoadedModel],
    prompt: str,
    config: DecodeConfig = DecodeConfig(),
    cancel: threading.Event | None = None,
    scheduler: Scheduler | None = None,
) -> Iterator[Event]:
    """`decode()` whose events are made in a thread of their own and queued as they come, so a consumer that
    is slow between events (a page rendering and sending an update) stalls neither this run nor the passes
    it shares with others. Bad input raises here, as with `decode`; closing the iterator before the end
    cancels the run."""
    handle = RunHandle(0, DecodeRequest(prompt, config), cancel)
    events = decode(models, prompt, config, handle.stop, scheduler)
    threading.Thread(target=handle._run, args=(lambda: events,), name="decode-ahead", daemon=True).start()
    return _cancelled_on_close(handle)


def _cancelled_on_close(handle: RunHandle) -> Iterator[Event]:
    try:
        yield from handle.events()
    finally:
        if not handle.done:
            handle.cancel()
