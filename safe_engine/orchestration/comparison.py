"""Runs several strategies on one prompt with models loaded once, and summarises each run."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace

from ..contract.events import Event, RunFinished, RunStarted
from ..models.cache import WARM_UP_TEXT, warm_model
from ..models.loading import LoadedModel
from ..strategies.decoding import DecodeConfig, decode
from ..tokenization.canonical import refusal
from .many_runs import DecodeRequest, decode_many


def warm_up(models: Sequence[LoadedModel], config: DecodeConfig | None = None) -> None:
    """Pay every once-per-process cost before anything is timed: each model's own (`warm_model`); with a
    config, two tokens of every run in its comparison plan (tokenizers' first calls, GaC's vocabulary union)."""
    for lm in models:
        warm_model(lm)
    if config is not None and len(models) > 1:
        for _, run_models, run_config in comparison_plan(models, config):
            for _ in decode(run_models, WARM_UP_TEXT, replace(run_config, max_new_tokens=2, force=(), stop=())):
                pass


def summarize(events: Sequence[Event], label: str | None = None) -> dict:
    """The flat record the CLI prints with --json (and the benchmark aggregates)."""
    started = next(e for e in events if isinstance(e, RunStarted))
    finished = next(e for e in events if isinstance(e, RunFinished))
    stats = finished.stats
    return {
        "text": finished.text,
        "strategy": started.strategy,
        "label": label or started.strategy,
        "models": [m["name"] for m in started.models],
        "drafter": started.drafter,
        "tokens": stats["tokens"],
        "ensembled": stats["ensembled"],
        "replaced": stats["replaced"],
        "e_t": stats["e_t"],
        "oov_skips": stats["oov_skips"],
        "consensus_skips": stats["consensus_skips"],
        "sharpened": stats["sharpened"],
        "rounds": stats["rounds"],
        "wall_s": stats["wall_s"],
        "tokens_per_s": stats["tokens_per_s"],
        "overhead_share": stats["overhead_share"],
        "passes_per_token": stats.get("passes_per_token"),  # traces recorded before it: None
        "stop_reason": finished.stop_reason,
        "temperature": started.config.get("temperature", 0.0),
        "seed": started.config.get("seed"),
        "damage": stats.get("damage", {}),
        "stats": stats,
    }


def comparison_plan(
    models: Sequence[LoadedModel], config: DecodeConfig
) -> list[tuple[str, Sequence[LoadedModel], DecodeConfig]]:
    """Each single model; ``byte-level`` when every model's tokenizer turns into an exact byte model (a run over
    only some of them would be no ensemble, at several passes per token); then per-token and SAFE with the
    configured drafter (last, as the pages take the drafter from the last run): (label, models, config)."""
    plan = [
        (
            f"single:{lm.name}",
            [lm],
            replace(config, strategy="single", drafter=0, ensemble=replace(config.ensemble, weights=None)),
        )
        for lm in models
    ]
    if all(refusal(lm.vocab) is None for lm in models):
        plan.append(("byte-level", models, replace(config, strategy="byte-level", force=())))
    plan.append(("per-token", models, replace(config, strategy="per-token")))
    plan.append(("safe", models, replace(config, strategy="safe")))
    return plan


def run_comparison(
    models: Sequence[LoadedModel], prompt: str, config: DecodeConfig, cancel: threading.Event | None = None
) -> Iterator[tuple[str, Event]]:
    """Events of every run in the plan, each tagged with its label, in order (`cancel`: see `decode`)."""
    for label, run_models, run_config in comparison_plan(models, config):
        for event in decode(run_models, prompt, run_config, cancel):
            yield label, event


def run_together(models: Sequence[LoadedModel], prompt: str, config: DecodeConfig) -> Iterator[tuple[str, Event]]:
    """The same runs as `run_comparison`, all at once (their forward passes shared through the batching
    executor), then yielded run by run in plan order. Each run's wall time then includes the others' work."""
    plan = comparison_plan(models, config)
    requests = [DecodeRequest(prompt, run_config, run_models) for _, run_models, run_config in plan]
    for (label, _, _), handle in zip(plan, decode_many(models, requests, max_parallel=len(plan))):
        for event in handle.result():
            yield label, event


def rows_per_pass(summary: dict) -> float:
    """The mean number of runs that shared each of a run's forward passes (1.0: it ran alone)."""
    forward = summary["stats"]["forward"].values()
    passes = sum(entry["passes"] for entry in forward)
    return sum(entry["rows"] for entry in forward) / passes if passes else 1.0


def ratios(summaries: Sequence[dict], drafter: str) -> dict[str, float]:
    """Wall time of each run divided by the drafter decoding alone."""
    base = next(s for s in summaries if s["label"] == f"single:{drafter}")["wall_s"]
    return {s["label"]: s["wall_s"] / base for s in summaries if base > 0}
