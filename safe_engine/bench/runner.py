"""Runs examples × strategies through the engine's comparison plan, one appended result line per run.

Strategies are the labels of `compare.comparison_plan` (``single:NAME``, ``per-token``, ``safe``), plus two
shorthands: ``single`` (the drafter alone, the baseline of every wall-time ratio) and ``singles``.
All strategies of one example run back to back, so an interrupted benchmark still compares like with like.
With `batch_size` N > 1, up to N jobs (in the same order) decode at once in threads and share forward passes
through the batching executor; each row is appended as its job finishes (so rows may land out of job order),
and a stop or a failure discards the jobs still running.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, replace

from ..contract.errors import ConfigError
from ..contract.events import RunFinished, RunStarted
from ..models.loading import LoadedModel
from ..orchestration.comparison import comparison_plan, summarize, warm_up
from ..strategies.decoding import DecodeConfig, decode
from . import store
from .prompts import STOPS, answer_span, build_prompt
from .scoring import score
from .tasks import Example

DEFAULT_STRATEGIES = ("singles", "per-token", "safe")
DEFAULT_BATCH_SIZE = 8  # jobs at once: a CPU pass of 8 rows costs 2-2.5x one row's; past 8, little more to gain


def strategy_labels(requested: Sequence[str], model_names: Sequence[str], drafter: int) -> list[str]:
    """Plan labels for the requested strategies, in plan order; model names are known before loading."""
    singles = [f"single:{name}" for name in model_names]
    order = singles + ["byte-level", "per-token", "safe"]
    known = {"single": [singles[drafter]], "singles": singles, **{label: [label] for label in order}}
    unknown = [name for name in requested if name not in known]
    if unknown or not requested:
        raise ConfigError(f"unknown strategy {', '.join(unknown) or '(none)'}; choose from {', '.join(known)}")
    chosen = {label for name in requested for label in known[name]}
    return [label for label in order if label in chosen]


def bench_settings(
    specs: Sequence[str], drafter: str, chat_template: Sequence[bool], style: str, config: DecodeConfig
) -> dict:
    """What a results folder's rows depend on (its run.json): one folder holds rows of one setting only."""
    return {
        "models": list(specs),
        "drafter": drafter,
        "style": style,
        "chat_template": list(chat_template),
        "decode": {k: v for k, v in asdict(config).items() if k != "strategy"},
    }


class StrategyRunner:
    """The runs a benchmark makes of each example: each label's models and config, one (example, label) job
    at a time (a Ray replica holds one of these and runs the jobs it is sent)."""

    def __init__(self, models: Sequence[LoadedModel], config: DecodeConfig, labels: Sequence[str], style: str):
        self.models, self.config, self.style = list(models), config, style
        plan = comparison_plan(models, config)
        self.plan = {label: (run_models, run_config) for label, run_models, run_config in plan if label in labels}
        if len(self.plan) < len(labels):
            raise ConfigError(f"strategies {', '.join(sorted(set(labels) - set(self.plan)))} do not match these models")

    def warm_up(self) -> None:
        warm_up(self.models, self.config)

    def run(self, example: Example, label: str, stop: threading.Event | None = None) -> dict | None:
        return run_example(example, label, *self.plan[label], self.style, stop)


class Jobs:
    """A results folder's progress over (example, label) jobs: which are done, which are left (in order), and
    the one place rows are appended, each (task, id, strategy) at most once however often it was run."""

    def __init__(self, out_dir, settings: dict, examples: Sequence[Example], labels: Sequence[str]):
        store.claim(out_dir, settings)
        self.out_dir = out_dir
        self._finished = {store.result_key(r) for r in store.load_results(out_dir)}
        jobs = {(e.task, e.id, label): (e, label) for e in examples for label in labels}
        self.todo = {key: job for key, job in jobs.items() if key not in self._finished}
        self.total = len(jobs)
        self.done = self.total - len(self.todo)

    def add(self, handle, record: dict) -> bool:
        """Append a finished job's row unless its key is already stored; True when it was written."""
        key = store.result_key(record)
        if key in self._finished:
            return False
        store.append(handle, record)
        self._finished.add(key)
        self.todo.pop(key, None)
        self.done += 1
        return True


class Progress:
    """What the app and the CLI read of any benchmark (in process or on Ray): its folder and its `Jobs`'
    counts; `done`/`total` count runs, including those resumed."""

    jobs: Jobs

    @property
    def done(self) -> int:
        return self.jobs.done

    @property
    def total(self) -> int:
        return self.jobs.total

    @property
    def out_dir(self):
        return self.jobs.out_dir


class Bench(Progress):
    """One benchmark over an output folder, in this process."""

    def __init__(
        self,
        models: Sequence[LoadedModel],
        examples: Sequence[Example],
        config: DecodeConfig,
        labels: Sequence[str],
        out_dir,
        style: str = "direct",
        batch_size: int = 1,
    ):
        if batch_size < 1:
            raise ConfigError("the batch size must be at least 1")
        self.batch_size = batch_size
        self.runner = StrategyRunner(models, config, labels, style)
        self.drafter = models[config.drafter].name
        settings = bench_settings(
            [m.spec.spec for m in models], self.drafter, [m.use_chat_template for m in models], style, config
        )
        self.jobs = Jobs(out_dir, settings, examples, list(self.runner.plan))

    def run(self, stop: threading.Event | None = None) -> Iterator[dict]:
        """Run what is left, yielding each record once it is on disk; a stopped run writes nothing."""
        if not self.jobs.todo:
            return
        self.runner.warm_up()
        with store.open_for_append(self.jobs.out_dir) as handle:
            records = self._one_at_a_time(stop) if self.batch_size == 1 else self._together(stop)
            for record in records:
                self.jobs.add(handle, record)
                yield record

    def _one_at_a_time(self, stop: threading.Event | None) -> Iterator[dict]:
        while self.jobs.todo:
            example, label = next(iter(self.jobs.todo.values()))
            record = self.runner.run(example, label, stop)
            if record is None:
                return
            yield record

    def _together(self, stop: threading.Event | None, poll_s: float = 0.1) -> Iterator[dict]:
        """Every job left, `batch_size` at a time, each record as its job finishes. The jobs watch a flag of
        their own: raised when `stop` is, when a job fails, and when the caller stops reading."""
        halt = threading.Event()
        pool = ThreadPoolExecutor(max_workers=self.batch_size, thread_name_prefix="bench")
        try:
            pending = {pool.submit(self.runner.run, example, label, halt) for example, label in self.jobs.todo.values()}
            while pending:
                done, pending = wait(pending, timeout=poll_s, return_when=FIRST_COMPLETED)
                if stop is not None and stop.is_set():
                    return
                for future in done:
                    record = future.result()  # a job's error ends the benchmark, as it does one at a time
                    if record is not None:
                        yield record
        finally:
            halt.set()
            pool.shutdown(wait=True, cancel_futures=True)


def run_example(
    example: Example,
    label: str,
    models: Sequence[LoadedModel],
    config: DecodeConfig,
    style: str,
    stop: threading.Event | None = None,
) -> dict | None:
    """Decode one prompt with one strategy and score it; None when `stop` was set meanwhile."""
    prompt = build_prompt(example, style)
    config = replace(config, stop=config.stop + STOPS[style])
    ends = [event for event in decode(models, prompt, config, stop) if isinstance(event, (RunStarted, RunFinished))]
    if stop is not None and stop.is_set():
        return None
    run = summarize(ends, label)
    answer, correct = score(example.scorer, answer_span(run["text"], style), example.gold)
    return {
        "task": example.task,
        "id": example.id,
        "strategy": label,
        "prompt": prompt,
        "gold": example.gold,
        "prediction": run["text"],
        "answer": answer,
        "correct": correct,
        "tokens": run["tokens"],
        "ensembled": run["ensembled"],
        "replaced": run["replaced"],
        "e_t": run["e_t"],
        "oov_skips": sum(run["oov_skips"].values()),
        "consensus_skips": sum(run["consensus_skips"].values()),
        "wall_s": run["wall_s"],
        "tokens_per_s": run["tokens_per_s"],
        "stop_reason": run["stop_reason"],
    }
