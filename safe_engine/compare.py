"""Runs several strategies on one prompt with models loaded once, and summarises each run."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import replace

from .decoding import DecodeConfig, decode
from .events import Event, RunFinished, RunStarted
from .many_runs import DecodeRequest, decode_many
from .models import LoadedModel, LoadOptions, load_model
from .placement import placed

_LOADED: dict[tuple[str, LoadOptions], LoadedModel] = {}  # the process's one model cache (CLI, app, benchmarks)
_LOADING = threading.Lock()  # the app loads from request threads; one load at a time, never one model twice
WARM_UP_PROMPT = "a"  # one letter: every tokenizer that can decode anything spells it


def load_models(
    specs: Sequence[str],
    options: LoadOptions = LoadOptions(),
    progress: Callable[[str], None] | None = None,
    warm: bool = False,
) -> list[LoadedModel]:
    """Load each spec once per process; later calls (another run, another UI session) reuse it. `options`:
    a device and a dtype for all or one per spec (`placement.placed`). `warm`: `warm_up` each model as it
    loads, so the first run's timing leaves out its lazy set-up."""
    with _LOADING:
        keys = list(zip(specs, placed(specs, options)))
        for key in keys:
            if key not in _LOADED:
                model = load_model(*key, progress)
                if warm:
                    warm_up([model])
                _LOADED[key] = model
        return [_LOADED[key] for key in keys]


def warm_up(models: Sequence[LoadedModel], config: DecodeConfig | None = None) -> None:
    """Pay every once-per-process cost before anything is timed: each model's token-byte tables (seconds
    for a 262k vocabulary) and first forward pass; with a config, two tokens of every run in its
    comparison plan (tokenizers' first calls, GaC's vocabulary union)."""
    for lm in models:
        _ = lm.vocab.id_of_bytes
        with closing(lm.open_session()) as session:
            session.next_token_logits(lm.encode_prompt(WARM_UP_PROMPT), [1])
    if config is not None and len(models) > 1:
        for _, run_models, run_config in comparison_plan(models, config):
            for _ in decode(run_models, WARM_UP_PROMPT, replace(run_config, max_new_tokens=2, force=(), stop=())):
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
        "stop_reason": finished.stop_reason,
        "temperature": started.config.get("temperature", 0.0),
        "seed": started.config.get("seed"),
        "damage": stats.get("damage", {}),
        "stats": stats,
    }


def comparison_plan(
    models: Sequence[LoadedModel], config: DecodeConfig
) -> list[tuple[str, Sequence[LoadedModel], DecodeConfig]]:
    """Each single model, then per-token and SAFE with the configured drafter: (label, models, config)."""
    plan = [
        (
            f"single:{lm.name}",
            [lm],
            replace(config, strategy="single", drafter=0, ensemble=replace(config.ensemble, weights=None)),
        )
        for lm in models
    ]
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
