"""Benchmark sweeps sharded over Ray: N replicas of the model set, each (example, strategy) job run by the
next replica that frees up (`ray_pool`), every row written by this driver alone into the same folder.

A replica (`BenchReplica`) loads the models (in itself, or for ``ray:`` specs into its own model actors)
and runs jobs with the single-process bench's `StrategyRunner`. The store's semantics hold: at-least-once
execution, rows deduplicated by (task, id, strategy) and appended line by line, so a crash, a kill or a
rerun never loses, duplicates or truncates a row. Faults are the pool's: a killed replica's job runs
again elsewhere, a replica whose models fail to load ends the sweep with that error.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

from ..bench import store
from ..bench.runner import Jobs, Progress, StrategyRunner, bench_settings
from ..bench.tasks import Example
from ..contract.config import DecodeConfig
from ..models.cache import load_models
from ..models.loading import LoadOptions
from ..models.specs import resolve_spec
from .ray_pool import JOB_TIMEOUT_S, Replica, ReplicaPool


class BenchReplica(Replica):
    """One copy of the benchmark's models, warm, running (example, label) jobs."""

    def load(
        self, specs: Sequence[str], options: LoadOptions, config: DecodeConfig, labels: Sequence[str], style: str
    ) -> None:
        self._runner = StrategyRunner(load_models(specs, options), config, labels, style)
        self._runner.warm_up()

    def run(self, example: Example, label: str) -> dict:
        self.ready()
        return self._runner.run(example, label)


class RayBench(Progress):
    """`Bench`'s interface (`done`, `total`, `out_dir`, `drafter`, `run`), its jobs run by a pool of Ray replicas."""

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
    ):
        """`cpus`/`gpus`: Ray resources of each replica; `address`: an existing cluster, else a local one."""
        args = (list(specs), options, config, list(labels), style)
        self.pool = ReplicaPool(BenchReplica, args, replicas, cpus, gpus, address, timeout_s)
        self.drafter = resolve_spec(specs[config.drafter]).short_name
        settings = bench_settings(specs, self.drafter, [options.chat_template] * len(specs), style, config)
        self.jobs = Jobs(out_dir, settings, examples, labels)

    def run(self, stop: threading.Event | None = None) -> Iterator[dict]:
        """Run what is left on the replicas, yielding each record once it is on disk."""
        if not self.jobs.todo:
            return
        with store.open_for_append(self.jobs.out_dir) as handle:
            for _, record in self.pool.map(list(self.jobs.todo.values()), stop):
                if self.jobs.add(handle, record):
                    yield record
