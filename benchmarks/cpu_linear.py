"""The CPU linear layers side by side (`--cpu-linear torch | streamed | int8-head`): speed of one run, and the
40-item benchmark's accuracy (benchmarks/RESULTS.md) and outputs against transformers' own layers.

    python -m benchmarks.cpu_linear [--modes torch,streamed,int8-head] [--prompts 8] [--max-new-tokens 32]
                                    [--bench-limit 10] [--bench-tokens 24] [--batch-size 8] [--out FILE]

Every mode's pair is loaded at once (fp32 CPU), so the speed runs interleave: each speed prompt runs
alone (SAFE defaults, and the drafter by itself) under every mode in turn; the figure per mode is the
median of the runs' own tokens/s, with its ratio to torch's. Then each mode runs the 40 items (four shipped
sets, `--bench-limit` each, SAFE) through `Bench` at `--batch-size`: accuracy, wall time, and how many
predictions equal the torch mode's and the streamed mode's.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.safe_speed import HARD, KEPT, write_json
from safe_engine.bench import Bench, load_results, load_task
from safe_engine.contract.events import RunFinished
from safe_engine.models.cache import load_models
from safe_engine.models.loading import LoadOptions
from safe_engine.models.specs import DEFAULT_MODELS
from safe_engine.orchestration.comparison import warm_up
from safe_engine.strategies.decoding import DecodeConfig, decode

ROOT = Path(__file__).resolve().parents[1]

BENCH_TASKS = ("facts", "arithmetic", "copying", "completion")


def tokens_per_s(models, prompt: str, config: DecodeConfig) -> float:
    finished = [e for e in decode(models, prompt, config) if isinstance(e, RunFinished)][-1]
    return finished.stats["tokens_per_s"]


def speed(pairs: dict, prompts, config: DecodeConfig) -> dict:
    runs = {mode: {"safe": [], "single": []} for mode in pairs}
    for prompt in prompts:
        for mode, models in pairs.items():  # interleaved: noise hits every mode alike
            runs[mode]["safe"].append(tokens_per_s(models, prompt, config))
            runs[mode]["single"].append(tokens_per_s(models[:1], prompt, replace(config, strategy="single")))
    report = {}
    for mode, by in runs.items():
        report[mode] = {f"{kind}_tokens_per_s": statistics.median(values) for kind, values in by.items()} | {
            f"{kind}_vs_torch": statistics.median(values) / statistics.median(runs["torch"][kind])
            for kind, values in by.items()
        }
    return report


def bench(models, examples, config: DecodeConfig, batch_size: int) -> tuple[dict, dict]:
    with tempfile.TemporaryDirectory() as out:
        run = Bench(models, examples, config, ["safe"], out, batch_size=batch_size)
        started = time.perf_counter()
        for _ in run.run():
            pass
        wall = time.perf_counter() - started
        rows = load_results(out)
    predictions = {(r["task"], r["id"]): r["prediction"] for r in rows}
    return {"wall_s": wall, "correct": sum(bool(r["correct"]) for r in rows), "items": len(rows)}, predictions


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="torch,streamed,int8-head")
    parser.add_argument("--prompts", type=int, default=8, help="the first N speed prompts")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--bench-limit", type=int, default=10)
    parser.add_argument("--bench-tokens", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    assert modes[0] == "torch", "torch's own layers are the reference"
    pairs = {mode: load_models(list(DEFAULT_MODELS), LoadOptions(device="cpu", cpu_linear=mode)) for mode in modes}
    config = DecodeConfig(max_new_tokens=args.max_new_tokens, damage_kl_steps=0)
    for models in pairs.values():
        warm_up(models, config)
    report = {"speed": speed(pairs, (KEPT + HARD)[: args.prompts], config), "bench": {}}
    for mode, row in report["speed"].items():
        print(
            f"{mode:10} SAFE {row['safe_tokens_per_s']:.2f} tok/s ({row['safe_vs_torch']:.2f}x torch), "
            f"drafter {row['single_tokens_per_s']:.2f} tok/s ({row['single_vs_torch']:.2f}x)",
            flush=True,
        )
    examples = [e for name in BENCH_TASKS for e in load_task(name, args.bench_limit)]
    bench_config = DecodeConfig(strategy="safe", max_new_tokens=args.bench_tokens)
    predictions = {}
    for mode, models in pairs.items():
        row, predictions[mode] = bench(models, examples, bench_config, args.batch_size)
        for reference in ("torch", "streamed"):
            if reference in predictions:
                same = sum(predictions[mode][k] == predictions[reference][k] for k in predictions[reference])
                row[f"same_as_{reference}"] = same
        report["bench"][mode] = row
        print(
            f"{mode:10} bench: {row['correct']}/{row['items']} correct, {row['wall_s']:.1f} s, "
            f"same as torch {row.get('same_as_torch')}",
            flush=True,
        )
    write_json(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
