"""Runs examples × strategies through the engine's comparison plan, one appended result line per run.

Strategies are the labels of `compare.comparison_plan` (``single:NAME``, ``per-token``, ``safe``), plus two
shorthands: ``single`` (the drafter alone, the baseline of every wall-time ratio) and ``singles``.
All strategies of one example run back to back, so an interrupted benchmark still compares like with like.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import asdict, replace

from ..compare import comparison_plan, summarize, warm_up
from ..decoding import DecodeConfig, decode
from ..errors import ConfigError
from ..events import RunFinished, RunStarted
from ..models import LoadedModel
from . import store
from .prompts import STOPS, answer_span, build_prompt
from .scoring import score
from .tasks import Example

DEFAULT_STRATEGIES = ("singles", "per-token", "safe")


def strategy_labels(requested: Sequence[str], model_names: Sequence[str], drafter: int) -> list[str]:
    """Plan labels for the requested strategies, in plan order; model names are known before loading."""
    singles = [f"single:{name}" for name in model_names]
    order = singles + ["per-token", "safe"]
    known = {"single": [singles[drafter]], "singles": singles, **{label: [label] for label in order}}
    unknown = [name for name in requested if name not in known]
    if unknown or not requested:
        raise ConfigError(f"unknown strategy {', '.join(unknown) or '(none)'}; choose from {', '.join(known)}")
    chosen = {label for name in requested for label in known[name]}
    return [label for label in order if label in chosen]


class Bench:
    """One benchmark over an output folder; `done`/`total` count runs, including those resumed."""

    def __init__(
        self,
        models: Sequence[LoadedModel],
        examples: Sequence[Example],
        config: DecodeConfig,
        labels: Sequence[str],
        out_dir,
        style: str = "direct",
    ):
        self.models, self.style, self.out_dir = list(models), style, out_dir
        self.config = config
        self.drafter = self.models[config.drafter].name
        plan = comparison_plan(models, config)
        self.plan = {label: (run_models, run_config) for label, run_models, run_config in plan if label in labels}
        if len(self.plan) < len(labels):
            raise ConfigError(f"strategies {', '.join(sorted(set(labels) - set(self.plan)))} do not match these models")
        settings = {
            "models": [m.spec.spec for m in self.models],
            "drafter": self.drafter,
            "style": style,
            "chat_template": [m.use_chat_template for m in self.models],
            "decode": {k: v for k, v in asdict(config).items() if k != "strategy"},
        }
        store.claim(out_dir, settings)
        finished = {store.result_key(r) for r in store.load_results(out_dir)}
        jobs = [(example, label) for example in examples for label in self.plan]
        self.todo = [(e, label) for e, label in jobs if (e.task, e.id, label) not in finished]
        self.total = len(jobs)
        self.done = self.total - len(self.todo)

    def run(self, stop: threading.Event | None = None) -> Iterator[dict]:
        """Run what is left, yielding each record once it is on disk; a stopped run writes nothing."""
        if not self.todo:
            return
        warm_up(self.models, self.config)
        with store.open_for_append(self.out_dir) as handle:
            while self.todo:
                example, label = self.todo[0]
                record = run_example(example, label, *self.plan[label], self.style, stop)
                if record is None:
                    return
                store.append(handle, record)
                self.todo.pop(0)
                self.done += 1
                yield record


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
