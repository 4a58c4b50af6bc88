"""A pool of Ray replicas that runs jobs as replicas free up, and survives replicas that die.

A replica (a `Replica` subclass) is an actor that loads once, and again after Ray restarts it, then runs
one job at a time. A job whose replica dies goes back to the front of the queue and runs again on
whichever replica frees up first (at least once; its result is reported once, since a failed job reports
none); a replica Ray gave up on (past `max_restarts`) is dropped, and the pool fails only when none is
left. A load error, a job that raises, and anything taking longer than `timeout_s` end the pool with an
error saying which.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator

from ..contract.errors import ConfigError
from .ray_cluster import RETRY_S, ActorLost, RemoteTimeout, Replica, check_feasible, connect, remote_error

JOB_TIMEOUT_S = 1800.0
"""Loading a replica, or one job: a large model's 512-token chain of thought on a CPU takes minutes, and
so does a first conversion of an embedded model."""
POLL_S = 1.0  # how often a waiting driver looks at its stop flag


class ReplicaPool:
    """`replicas` actors of a `Replica` subclass built from `args`, each with `cpus`/`gpus` Ray resources."""

    def __init__(
        self,
        replica: type[Replica],
        args: tuple,
        replicas: int = 1,
        cpus: float = 1.0,
        gpus: float = 0.0,
        address: str | None = None,
        timeout_s: float = JOB_TIMEOUT_S,
        max_restarts: int = 3,
    ):
        if replicas < 1:
            raise ConfigError("work on Ray needs at least one replica")
        self.replica, self.args, self.replicas, self.cpus, self.gpus = replica, args, replicas, cpus, gpus
        self.address, self.timeout_s, self.max_restarts = address, timeout_s, max_restarts
        self.lost_jobs = 0  # jobs sent back to the queue because their replica died

    def map(self, jobs: Iterable[tuple], stop: threading.Event | None = None) -> Iterator[tuple[tuple, object]]:
        """(job, result) for each job as it finishes (each job is the arguments of the replica's `run`)."""
        queue = deque(jobs)
        if not queue:
            return
        ray = connect(self.address)
        check_feasible(self.cpus, self.gpus, f"a {self.replica.__name__}")
        actor = ray.remote(self.replica).options(
            num_cpus=self.cpus, num_gpus=self.gpus, max_restarts=self.max_restarts, max_task_retries=0
        )
        replicas = [actor.remote(*self.args) for _ in range(self.replicas)]
        try:
            yield from self._dispatch(ray, replicas, queue, stop or threading.Event())
        finally:
            for replica in replicas:
                ray.kill(replica)

    def _dispatch(self, ray, replicas, queue: deque, stop: threading.Event) -> Iterator[tuple[tuple, object]]:
        waiting: dict = {}  # object ref -> (replica index, job or None for "loaded yet?", deadline)
        again: dict[int, tuple[float, float]] = {}  # restarting replica -> (when to ask again, deadline)
        idle: list[int] = []

        def send(index: int, job=None, deadline: float | None = None) -> None:
            call = replicas[index].ready.remote() if job is None else replicas[index].run.remote(*job)
            waiting[call] = (index, job, deadline or time.monotonic() + self.timeout_s)

        for index in range(len(replicas)):
            send(index)
        while True:
            for index, (at, deadline) in list(again.items()):
                if at <= time.monotonic():
                    del again[index]
                    send(index, deadline=deadline)
            while idle and queue:
                send(idle.pop(0), queue.popleft())
            if (not queue and all(job is None for _, job, _ in waiting.values())) or stop.is_set():
                return
            if not waiting and not again:
                raise ActorLost("every replica died for good (Ray restarted each as often as allowed)")
            ref = self._next_ready(ray, waiting)
            if ref is None:
                continue
            index, job, deadline = waiting.pop(ref)
            try:
                value = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                if job is not None:  # at least once: the job runs again, on whichever replica is free first
                    queue.appendleft(job)
                    self.lost_jobs += 1
                    deadline = time.monotonic() + self.timeout_s
                elif isinstance(exc, ray.exceptions.ActorDiedError):
                    continue  # Ray gave up on this replica
                again[index] = (time.monotonic() + RETRY_S, deadline)  # ask until it has reloaded
                continue
            except ray.exceptions.RayError as exc:
                raise remote_error(exc, _doing(index, job)) from None
            if job is not None:
                yield job, value
            idle.append(index)

    def _next_ready(self, ray, waiting: dict):
        """The first call to finish, within the earliest deadline; None after POLL_S, to look at the stop flag."""
        if not waiting:
            time.sleep(RETRY_S)
            return None
        index, job, deadline = min(waiting.values(), key=lambda entry: entry[2])
        left = deadline - time.monotonic()
        if left <= 0:
            raise RemoteTimeout(f"{_doing(index, job)} gave no answer within {self.timeout_s:g} s")
        ready, _ = ray.wait(list(waiting), num_returns=1, timeout=min(left, POLL_S))
        return ready[0] if ready else None


def _doing(index: int, job) -> str:
    if job is None:
        return f"replica {index} loading"
    return f"replica {index} running {' '.join(map(_short, job))}"


def _short(value) -> str:
    text = str(getattr(value, "id", value))
    return text if len(text) <= 60 else text[:57] + "..."
