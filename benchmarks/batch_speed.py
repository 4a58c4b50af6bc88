"""Many runs at once: aggregate tokens/s at batch sizes 1, 2, 4, 8, outputs against batch 1, memory.

    python benchmarks/batch_speed.py [--max-new-tokens 32] [--sizes 1,2,4,8] [--strategies single,per-token,safe]
                                     [--prompts 20] [--out out/batch_speed.json]

For each strategy (defaults otherwise; damage KL off) the speed prompts of `safe_speed.py` run through
`decode_many` with at most B runs decoding at a time; aggregate tokens/s is every run's tokens over
the wall time of the whole set. Batch 1 is the reference: a run at a larger B is identical when it
commits the same ids. For every run that differs, the first differing committed token, how the batch-1
run decided it, and the drafter's top-2 logit gap there (alone, recomputed): a near-tie is a gap
below 1e-3 on a drafted token; an ensembled token is decided by the ensemble, whose table shows its
own margin. Memory: the peak bytes of the KV slots, and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from safe_speed import HARD, KEPT  # noqa: E402

from safe_engine import DecodeRequest, decode_many  # noqa: E402
from safe_engine.compare import load_models, warm_up  # noqa: E402
from safe_engine.decoding import DecodeConfig  # noqa: E402
from safe_engine.events import RunFinished, TextCommitted  # noqa: E402
from safe_engine.models import DEFAULT_MODELS, LoadOptions  # noqa: E402
from safe_engine.runtime import SCHEDULER, ModelSession  # noqa: E402


def committed(events) -> list[tuple[list[int], str]]:
    return [(list(t.ids), t.decision) for e in events if isinstance(e, TextCommitted) for t in e.tokens]


class SlotPeak:
    """Samples the KV slots' bytes of every model while a batch size runs."""

    def __init__(self, models):
        self.executors = [SCHEDULER.executor(lm) for lm in models]
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, sum(e.slot_bytes() for e in self.executors))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def run_set(models, prompts, config: DecodeConfig, size: int) -> dict:
    run_models = models[:1] if config.strategy == "single" else models
    with SlotPeak(run_models) as memory:
        started = time.perf_counter()
        handles = decode_many(run_models, [DecodeRequest(p, config) for p in prompts], max_parallel=size)
        runs = [handle.result() for handle in handles]
        wall = time.perf_counter() - started
    finished = [events[-1] for events in runs]
    assert all(isinstance(f, RunFinished) for f in finished)
    tokens = sum(f.stats["tokens"] for f in finished)
    forward = [f.stats["forward"][name] for f in finished for name in f.stats["forward"]]
    return {
        "wall_s": wall,
        "tokens": tokens,
        "tokens_per_s": tokens / wall,
        "mean_rows_per_pass": sum(f["rows"] for f in forward) / max(sum(f["passes"] for f in forward), 1),
        "kv_peak_mib": memory.peak / 2**20,
        "outputs": [committed(events) for events in runs],
    }


def first_difference(models, prompt: str, alone, batched) -> dict:
    index = next((i for i, (a, b) in enumerate(zip(alone, batched)) if a[0] != b[0]), min(len(alone), len(batched)))
    drafter = models[0]
    ids = drafter.encode_prompt(prompt) + [i for piece, _ in alone[:index] for i in piece]
    with ModelSession(drafter) as session:
        top = session.next_token_logits(ids, [len(ids)])[0].topk(2).values.tolist()
    decision = alone[index][1] if index < len(alone) else "ended"
    return {"prompt": prompt, "token": index, "decision_alone": decision, "drafter_top2_gap": top[0] - top[1]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--sizes", default="1,2,4,8")
    parser.add_argument("--strategies", default="single,per-token,safe")
    parser.add_argument("--prompts", type=int, default=len(KEPT + HARD), help="the first N speed prompts")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    assert sizes[0] == 1, "batch 1 is the reference"
    prompts = (KEPT + HARD)[: args.prompts]
    models = load_models(list(DEFAULT_MODELS), LoadOptions(device="cpu"))
    base = DecodeConfig(max_new_tokens=args.max_new_tokens, damage_kl_steps=0)
    warm_up(models, base)
    report = {"prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "strategies": {}}
    for strategy in args.strategies.split(","):
        config = replace(base, strategy=strategy)
        rows, reference = {}, None
        for size in sizes:
            result = run_set(models, prompts, config, size)
            outputs = result.pop("outputs")
            if reference is None:
                reference = outputs
            same = [a == b for a, b in zip(reference, outputs)]
            result["identical"] = sum(same) / len(same)
            result["differences"] = [
                first_difference(models, p, a, b) for p, a, b, s in zip(prompts, reference, outputs, same) if not s
            ]
            result["speedup_vs_1"] = result["tokens_per_s"] / rows[1]["tokens_per_s"] if rows else 1.0
            rows[size] = result
            print(
                f"{strategy:9} B={size}: {result['tokens_per_s']:.2f} tok/s ({result['speedup_vs_1']:.2f}x), "
                f"{result['mean_rows_per_pass']:.1f} rows/pass, identical {result['identical']:.0%}, "
                f"KV peak {result['kv_peak_mib']:.0f} MiB",
                flush=True,
            )
        report["strategies"][strategy] = rows
    report["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
