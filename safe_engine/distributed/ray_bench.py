"""Benchmark sweeps sharded over Ray: N replicas of the model set, each (example, strategy) job sent to the
next replica that frees up, every row written by this driver alone into the same results folder.

A replica (`BenchReplica`) is one actor that loads the models (in itself, or for ``ray:`` specs into its
own model actors) and runs one job at a time with the single-process bench's `StrategyRunner`. The
store's semantics hold: at-least-once execution, rows deduplicated by (task, id, strategy), appended
line by line, so a crash, a kill or a rerun never loses, duplicates or truncates a row.

Faults: a replica that dies (its process killed) is restarted by Ray and reloads its models, and its
unfinished job goes back to the front of the queue; once Ray gives up on it (past `max_restarts`) it is
dropped, and the sweep fails only when no replica is left. A replica whose models fail to load, a job that raises, and
anything that takes longer than `timeout_s` end the sweep with an error saying which.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence

from ..bench import store
from ..bench.runner import StrategyRunner, Sweep, bench_settings
from ..bench.tasks import Example
from ..compare import load_models
from ..config import DecodeConfig
from ..errors import ConfigError
from ..models import LoadOptions, resolve_spec
from .ray_cluster import RETRY_S, ActorLost, RemoteTimeout, check_feasible, connect, remote_error

JOB_TIMEOUT_S = 1800.0
"""Loading a replica, or one (example, strategy) run: a large model's 512-token chain of thought on a CPU
takes minutes, and so does a first conversion of an embedded model."""
POLL_S = 1.0  # how often a waiting driver looks at its stop flag


class BenchReplica:
    """One copy of the benchmark's models, running the jobs it is sent one at a time."""

    def __init__(
        self, specs: Sequence[str], options: LoadOptions, config: DecodeConfig, labels: Sequence[str], style: str
    ):
        self._runner, self._error = None, None
        try:
            self._runner = StrategyRunner(load_models(specs, options), config, labels, style)
            self._runner.warm_up()
        except Exception as exc:  # kept for `ready`, so the driver gets the load error itself
            self._error = exc

    def ready(self) -> int:
        """This replica's process id, once its models are loaded and warm."""
        if self._error is not None:
            raise self._error
        return os.getpid()

    def run(self, example: Example, label: str) -> dict:
        self.ready()
        return self._runner.run(example, label)


class RayBench:
    """`Bench`'s interface (`done`, `total`, `drafter`, `run`), its jobs run by Ray replicas."""

    def __init__(
        self,
        specs: Sequence[str],
        options: LoadOptions,
        examples: Sequence[Example],
        config: DecodeConfig,
        labels: Sequence[str],
        out_dir,
        style: str = "direct",
        replicas: int = 1,
        cpus: float = 1.0,
        gpus: float = 0.0,
        address: str | None = None,
        timeout_s: float = JOB_TIMEOUT_S,
        max_restarts: int = 3,
    ):
        """`cpus`/`gpus`: Ray resources of each replica; `address`: an existing cluster, else a local one."""
        if replicas < 1:
            raise ConfigError("a sweep on Ray needs at least one replica")
        names = [resolve_spec(spec).short_name for spec in specs]
        self.drafter = names[config.drafter]
        settings = bench_settings(specs, self.drafter, [options.chat_template] * len(specs), style, config)
        self.sweep = Sweep(out_dir, settings, examples, labels)
        self._replica_args = (list(specs), options, config, list(labels), style)
        self.replicas, self.cpus, self.gpus, self.address = replicas, cpus, gpus, address
        self.timeout_s, self.max_restarts = timeout_s, max_restarts
        self.pids: dict[int, int] = {}  # replica index -> its process now (it changes on a restart)
        self.lost_jobs = 0  # jobs sent back to the queue because their replica died

    @property
    def done(self) -> int:
        return self.sweep.done

    @property
    def total(self) -> int:
        return self.sweep.total

    def run(self, stop: threading.Event | None = None) -> Iterator[dict]:
        """Run what is left on the replicas, yielding each record once it is on disk."""
        if not self.sweep.todo:
            return
        ray = connect(self.address)
        check_feasible(self.cpus, self.gpus, "a benchmark replica")
        actor = ray.remote(BenchReplica).options(
            num_cpus=self.cpus,
            num_gpus=self.gpus,
            max_restarts=self.max_restarts,
            max_task_retries=0,
        )
        replicas = [actor.remote(*self._replica_args) for _ in range(self.replicas)]
        try:
            yield from self._dispatch(ray, replicas, stop or threading.Event())
        finally:
            for replica in replicas:
                ray.kill(replica)

    def _dispatch(self, ray, replicas, stop: threading.Event) -> Iterator[dict]:
        queue = deque(self.sweep.todo.values())
        waiting: dict = {}  # object ref -> (replica index, job or None for "loaded yet?", deadline)
        again: dict[int, tuple[float, float]] = {}  # restarting replica -> (when to ask again, deadline)
        idle: list[int] = []

        def send(index: int, job=None, deadline: float | None = None) -> None:
            call = replicas[index].ready.remote() if job is None else replicas[index].run.remote(*job)
            waiting[call] = (index, job, deadline or time.monotonic() + self.timeout_s)

        for index in range(len(replicas)):
            send(index)
        with store.open_for_append(self.sweep.out_dir) as handle:
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
                    raise ActorLost("every benchmark replica died for good (Ray restarted each as often as allowed)")
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
                if job is None:
                    self.pids[index] = value
                elif self.sweep.add(handle, value):
                    yield value
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
        return f"benchmark replica {index} loading its models"
    example, label = job
    return f"benchmark replica {index} running {example.task}/{example.id} with {label}"
