"""SAFE's passes overlapped when the models sit on their own devices (`DecodeConfig.overlap`).

Two overlaps, and neither changes what a run decodes:
- `each`: the verifiers' passes of a round run at once, one thread each (each verifier's model has its own
  executor; passes on different devices do not wait for each other);
- `drafting_ahead`: while the round is verified and ensembled, the drafter drafts the next round in a
  thread, as if the whole draft will be kept. Only its logits matter: they land in the drafter session's
  memo, and the next round's real draft reads them back where its prefix matches. A commit that differs
  (a replacement, an exact-mode cut, a forced text) leaves them unread; the session drops them when it
  rolls back. The thread stops and is joined before the commit, so one thread uses a session at a time.

The run's random stream is untouched: drafting ahead picks argmaxes (no draw). A greedy run drafts ahead a
whole round; a sampled run only its first position, the one logit row that needs no token picked.

Auto (`overlap=None`) is on only when every model of the run sits on a device of its own and none on the
CPU: on one CPU the models share the cores and the memory bandwidth, and overlapping was measured slower.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

from ..decisions.sampling import Sampler
from ..run.drafting import Draft, draft_after
from ..run.state import Run
from ..runtime.scheduler import ActiveRun

T = TypeVar("T")


def wanted(run: Run) -> bool:
    """Whether this run overlaps: as configured, else only with every model on its own non-CPU device."""
    if run.config.overlap is not None:
        return run.config.overlap
    devices = [str(p.lm.device) for p in run.parts]  # pick_device's names: one per GPU
    return len(devices) > 1 and len(set(devices)) == len(devices) and not any(d.startswith("cpu") for d in devices)


def each(run: Run, jobs: Sequence[Callable[[], T]]) -> list[T]:
    """The jobs' results in order: at once, one thread each, when the run overlaps; else one after another."""
    if len(jobs) < 2 or not wanted(run):
        return [job() for job in jobs]
    active = _active()
    with ThreadPoolExecutor(len(jobs), thread_name_prefix="safe-verify") as pool:
        futures = [pool.submit(_helping, active, job) for job in jobs]
        with active.waiting():
            return [future.result() for future in futures]


def _active() -> ActiveRun:
    """The run this thread drives; a run of no session (whose helpers hold up no pass) when there is none."""
    return ActiveRun.current() or ActiveRun()


def _helping(active: ActiveRun, job: Callable[[], T]) -> T:
    with active.helper():
        return job()


@contextmanager
def drafting_ahead(run: Run, draft: Draft) -> Iterator[None]:
    """Inside, the drafter drafts the round after this one (when the run overlaps and one will follow)."""
    count = min(run.config.lookahead, run.remaining() - len(draft))
    if not wanted(run) or count <= 0 or draft.ids[-1] in run.drafter.lm.eos_ids:
        yield
        return
    base = run.response.ids + draft.ids
    stop, failed = threading.Event(), []
    active = _active()
    greedy = Sampler()  # argmaxes: no random number is drawn ahead

    def work() -> None:
        with active.helper():
            try:
                draft_after(run.drafter, base, count if run.sampler.greedy else 1, run.config.draft_gate, greedy, stop)
            except Exception as exc:  # raised in the run's own thread at the join
                failed.append(exc)

    thread = threading.Thread(target=work, name="safe-draft-ahead", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        with active.waiting():
            thread.join()
    if failed:
        raise failed[0]
