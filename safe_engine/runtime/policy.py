"""When a model's waiting requests go, and which model a shared device serves next: the scheduler's policy.

- A model's requests go as soon as no run holding an open session on it is still computing (every such run
  waits on some executor, or has handed an event to its consumer): a run alone never waits.
- Otherwise they go when the oldest has waited `max_wait_s` (20 ms) or half the model's recent pass,
  whichever is shorter, counted from its arrival or from the end of the pass on the device it arrived
  behind. A row joining costs far less than a pass of its own (the weights are read once), so waiting up to
  half a pass for a run still computing pays.
- When several models on a device are due, the one with the most rows waiting goes first, unless another
  has been passed over `patience` times: runs that wait on the verifier while others still draft then
  verify together, in one pass instead of several.

Pure functions of a `Queue` (one executor's waiting requests seen at one moment) and the time `now`: no
locks, no threads, no clock. `scheduler.Scheduler` holds the lock, the waits and the passes; at each decision
it takes a view of the executors concerned and asks here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Queue:
    """An executor's waiting requests (at least one) at one moment; times are on the scheduler's clock."""

    waiting: int  # requests waiting for a pass
    oldest: float  # when the oldest of them was submitted
    freed: float  # when the last pass on the executor's device ended (0.0: none has run)
    recent_pass_s: float | None  # a recent pass's wall time on this executor (None before its first)
    holder_computes: bool  # a run holding an open session on the executor computes right now
    passed_over: int = 0  # passes of others on its device that went while it was due, since its own last


def seconds_until_due(queue: Queue, now: float, max_wait_s: float) -> float:
    """Until the oldest request has waited long enough: `max_wait_s`, or half a recent pass if shorter, from when
    it could first have gone: its arrival, or the end of the pass it arrived behind (else runs that alternate
    with each other never meet)."""
    recent = queue.recent_pass_s
    wait = max_wait_s if recent is None else min(max_wait_s, 0.5 * recent)
    return max(queue.oldest, queue.freed) + wait - now


def is_due(queue: Queue, now: float, max_wait_s: float) -> bool:
    """Whether the requests go now: no run holding the model computes (so a run alone never waits), or the
    oldest has waited long enough."""
    return not queue.holder_computes or seconds_until_due(queue, now, max_wait_s) <= 0


def next_on_device(due: Sequence[Queue], patience: int) -> int:
    """Which of the due queues on one device takes it (its index): one passed over `patience` times, then the
    most rows waiting, then the oldest request, then the first listed."""
    return max(range(len(due)), key=lambda i: (due[i].passed_over >= patience, due[i].waiting, -due[i].oldest, -i))
