"""Ray on one machine: what a call to a model actor costs, and a sweep on 2 CPU replicas vs 1.

    python -m benchmarks.ray_replicas [--calls 50] [--limit 10] [--max-new-tokens 16] [--cpus 2] [--out FILE]

Per-call overhead: each embedded model decodes `--calls` one-token steps through an in-process session
and through a Ray actor's session (same ids, the same forward passes); the medians and their difference
are the cost of one round trip, its logits row included (262k floats for Gemma, 49k for SmolLM2).

Replicas: the facts set (`--limit` items × singles, per-token and SAFE) swept by one replica with all
`--cpus` CPUs, then by two with half each, on a local Ray cluster of `--cpus` CPUs. Reported: seconds
from start to the last row (loading included) and from the first row to the last (steady state).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import ray
import torch

from safe_engine.bench import load_task, strategy_labels
from safe_engine.contract.config import DecodeConfig
from safe_engine.distributed.ray_bench import RayBench
from safe_engine.models.loading import LoadOptions, load_model
from safe_engine.models.specs import DEFAULT_MODELS, resolve_spec


def step_seconds(lm, calls: int) -> list[float]:
    """Seconds of each of `calls` one-token steps, after two untimed ones."""
    session, ids = lm.open_session(), lm.encode_prompt("Count: one, two, three,")
    times = []
    for _ in range(calls + 2):
        started = time.perf_counter()
        row = session.next_token_logits(ids, [len(ids)])[0]
        times.append(time.perf_counter() - started)
        ids.append(int(row.argmax()))
        session.forget_before(len(ids))
    return times[2:]


def call_overhead(spec: str, calls: int) -> dict:
    local = load_model(spec)
    remote = load_model(f"ray:cpus={torch.get_num_threads()}:{spec}")  # as many threads as in this process
    try:
        here, there = statistics.median(step_seconds(local, calls)), statistics.median(step_seconds(remote, calls))
    finally:
        remote.sessions.close()
    return {
        "model": local.name,
        "in_process_ms": here * 1e3,
        "actor_ms": there * 1e3,
        "overhead_ms": (there - here) * 1e3,
    }


def sweep(replicas: int, cpus: float, limit: int, config: DecodeConfig) -> dict:
    names = [resolve_spec(spec).short_name for spec in DEFAULT_MODELS]
    labels = strategy_labels(["singles", "per-token", "safe"], names, 0)
    with tempfile.TemporaryDirectory() as out:
        bench = RayBench(
            list(DEFAULT_MODELS),
            LoadOptions(),
            load_task("facts", limit),
            config,
            labels,
            out,
            replicas=replicas,
            cpus=cpus,
        )
        started, stamps = time.perf_counter(), []
        for _ in bench.run():
            stamps.append(time.perf_counter() - started)
    return {
        "replicas": replicas,
        "cpus_each": cpus,
        "rows": len(stamps),
        "total_s": stamps[-1],
        "first_to_last_s": stamps[-1] - stamps[0],
        "rows_per_min_steady": 60 * (len(stamps) - 1) / max(stamps[-1] - stamps[0], 1e-9),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--cpus", type=int, default=2, help="the local cluster's CPUs, split among the replicas")
    parser.add_argument("--skip-calls", action="store_true", help="only the replica sweep")
    parser.add_argument("--out", help="also write the results as JSON here")
    args = parser.parse_args()
    ray.init(num_cpus=args.cpus, include_dashboard=False)
    try:
        result = {"calls": [] if args.skip_calls else [call_overhead(spec, args.calls) for spec in DEFAULT_MODELS]}
        config = DecodeConfig(max_new_tokens=args.max_new_tokens)
        result["sweeps"] = [sweep(n, args.cpus / n, args.limit, config) for n in (1, 2)]
    finally:
        ray.shutdown()
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
