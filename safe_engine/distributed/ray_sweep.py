"""A sweep on Ray replicas: every runs folder's (example, strategy) jobs through one pool of N replicas of the
model set (`ray_pool`), each job carrying its grid point's config, so the models load once per replica for the
whole grid. Rows are written by this driver alone into the folders a local sweep writes (`bench.grid`), with
the bench's store semantics: deduplicated by key, appended line by line, resumable.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence

from ..bench import store
from ..bench.grid import SweepPlan
from ..bench.runner import Jobs, StrategyRunner, bench_settings
from ..bench.tasks import Example
from ..contract.config import DecodeConfig
from ..models.loading import LoadOptions
from .ray_bench import BenchReplica
from .ray_pool import JOB_TIMEOUT_S, ReplicaPool


class SweepReplica(BenchReplica):
    """One copy of the models, warm, running (example, strategy, config) jobs of any grid point."""

    def load(self, specs: Sequence[str], options: LoadOptions, config: DecodeConfig, style: str) -> None:
        super().load(specs, options, config, [], style)
        self._runners: dict[tuple[DecodeConfig, str], StrategyRunner] = {}

    def run(self, example: Example, label: str, config: DecodeConfig) -> dict:
        self.ready()
        key = (config, label)
        if key not in self._runners:
            self._runners[key] = StrategyRunner(self._runner.models, config, [label], self._runner.style)
        return self._runners[key].run(example, label)


class RaySweep:
    """`GridSweep`'s interface (`done`, `total`, `out_dir`, `run`), its jobs run by one pool of Ray replicas."""

    def __init__(
        self,
        specs: Sequence[str],
        options: LoadOptions,
        plan: SweepPlan,
        base: DecodeConfig,
        replicas: int = 1,
        cpus: float = 1.0,
        gpus: float = 0.0,
        address: str | None = None,
        timeout_s: float = JOB_TIMEOUT_S,
    ):
        """`base`: the config the replicas warm up with; `cpus`/`gpus`: Ray resources of each replica."""
        self.out_dir, self.plan = plan.out_dir, plan
        self.pool = ReplicaPool(
            SweepReplica, (list(specs), options, base, plan.style), replicas, cpus, gpus, address, timeout_s
        )
        drafter, chat = plan.manifest["drafter"], [options.chat_template] * len(specs)
        self.jobs = {
            name: Jobs(
                plan.folder(name),
                bench_settings(specs, drafter, chat, plan.style, runs.config),
                plan.examples,
                runs.labels,
            )
            for name, runs in plan.runs.items()
        }
        plan.write_manifest()

    @property
    def done(self) -> int:
        return sum(jobs.done for jobs in self.jobs.values())

    @property
    def total(self) -> int:
        return sum(jobs.total for jobs in self.jobs.values())

    def run(self, stop: threading.Event | None = None) -> Iterator[dict]:
        """Run what is left of every folder on the replicas, yielding each record once it is on disk."""
        owner = {(runs.config, label): name for name, runs in self.plan.runs.items() for label in runs.labels}
        todo = [
            (example, label, self.plan.runs[name].config)
            for name, jobs in self.jobs.items()
            for example, label in jobs.todo.values()
        ]
        if not todo:
            return
        with contextlib.ExitStack() as stack:
            handles = {
                name: stack.enter_context(store.open_for_append(jobs.out_dir)) for name, jobs in self.jobs.items()
            }
            for (_, label, config), record in self.pool.map(todo, stop):
                name = owner[(config, label)]
                if self.jobs[name].add(handles[name], record):
                    yield record
