"""Many runs at once: aggregate tokens/s at batch sizes 1, 2, 4, 8, outputs against batch 1, memory; the app
under concurrent clients; the 40-item bench at --batch-size 8 against 1.

    python -m benchmarks.batch_speed [--sections engine,app,bench] [--out out/batch_speed.json]
        engine: [--max-new-tokens 32] [--sizes 1,2,4,8] [--strategies single,per-token,safe] [--prompts 20]
        app:    [--clients 1,4,8] [--app-tokens 24] [--app-repeats 3]
        bench:  [--bench-sizes 1,8] [--bench-strategies safe] [--bench-limit 10] [--bench-tokens 24]

For each strategy (defaults otherwise; damage KL off) the speed prompts of `safe_speed.py` run through
`decode_many` with at most B runs decoding at a time; aggregate tokens/s is every run's tokens over
the wall time of the whole set. Batch 1 is the reference: a run at a larger B is identical when it
commits the same ids. For every run that differs, the first differing committed token, how the batch-1
run decided it, and the drafter's top-2 logit gap there (alone, recomputed): a near-tie is a gap
below 1e-3 on a drafted token; an ensembled token is decided by the ensemble, whose table shows its
own margin. Memory: the peak bytes of the KV slots, and the process's peak RSS.

app: `python app.py` on a free local port; C clients (gradio_client, one session each) call `/generate` at
once, each with its own speed prompt, SAFE at the form's defaults, `--app-tokens` tokens; p50 and max time
to finish against client 1 alone, and the worst client's time against its own prompt run alone (prompts
differ: the longest alone takes longer than client 1's); each alone time is the median of `--app-repeats`
runs; with each count, the CPU seconds the app's process and this one (the clients) spent meanwhile. Then
the same through `python -m safe_engine serve` (C plain HTTP clients, a chat completion each, not streamed:
serving with no UI), and the same runs with no server (`decode_many` in this process, the form's config,
its CPU seconds): the floor both sit on, since a server only adds its own work to the engine's.
bench: the 40 items of benchmarks/RESULTS.md (four shipped sets, `--bench-limit` each) run by `Bench` at each
`--bench-sizes` batch size into a fresh folder; wall time against batch 1, and how many rows equal batch 1's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import astuple, replace
from pathlib import Path

from benchmarks.safe_speed import HARD, KEPT, write_json
from components.settings import RunSettings, decoding
from safe_engine import DecodeRequest, decode_many
from safe_engine.bench import Bench, load_results, load_task
from safe_engine.contract.events import RunFinished, TextCommitted
from safe_engine.models.cache import load_models
from safe_engine.models.loading import LoadOptions
from safe_engine.models.specs import DEFAULT_MODELS
from safe_engine.orchestration.comparison import warm_up
from safe_engine.runtime.session import SCHEDULER
from safe_engine.strategies.decoding import DecodeConfig

ROOT = Path(__file__).resolve().parents[1]


def committed(events) -> list[tuple[list[int], str]]:
    return [(list(t.ids), t.decision) for e in events if isinstance(e, TextCommitted) for t in e.tokens]


class SlotPeak:
    """Samples the KV slots' bytes of every model while a batch size runs."""

    def __init__(self, models):
        self.executors = [lm.sessions.executor(SCHEDULER) for lm in models]
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
    with closing(drafter.open_session()) as session:
        top = session.next_token_logits(ids, [len(ids)])[0].topk(2).values.tolist()
    decision = alone[index][1] if index < len(alone) else "ended"
    return {"prompt": prompt, "token": index, "decision_alone": decision, "drafter_top2_gap": top[0] - top[1]}


def engine_section(args, models) -> dict:
    sizes = [int(s) for s in args.sizes.split(",")]
    assert sizes[0] == 1, "batch 1 is the reference"
    prompts = (KEPT + HARD)[: args.prompts]
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
    return report


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(arguments: list[str], ready_path: str) -> Iterator[tuple[str, int]]:
    """Run `python ARGUMENTS --port P` (its output discarded) on a free port; yield its base URL and pid once
    `ready_path` answers; end it afterwards."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, *arguments, "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                urllib.request.urlopen(base + ready_path, timeout=2)
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{' '.join(arguments)} did not start") from None
                time.sleep(1)
        yield base, process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def clients_at_once(url: str, count: int, prompts, settings) -> list[float]:
    """Seconds each of `count` clients (a session each, connected first) took to finish its /generate call."""
    from gradio_client import Client

    clients = [Client(url, verbose=False) for _ in range(count)]
    return finish_times(
        [
            lambda c=c, i=i: c.predict(prompts[i % len(prompts)], *settings, api_name="/generate")
            for i, c in enumerate(clients)
        ]
    )


def requests_at_once(url: str, count: int, prompts, tokens: int) -> list[float]:
    """Seconds each of `count` plain HTTP clients (stdlib, next to no CPU of their own) took to get its
    chat completion, not streamed, from the OpenAI-compatible server."""

    def ask(prompt: str) -> None:
        body = {"model": "safe", "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens}
        request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as response:
            json.load(response)

    chosen = [prompts[i % len(prompts)] for i in range(count)]
    return finish_times([lambda p=p: ask(p) for p in chosen])


def runs_at_once(models, count: int, prompts, config: DecodeConfig) -> list[float]:
    """Seconds each of `count` runs started together in this process (no app) took to finish."""
    requests = [DecodeRequest(prompts[i % len(prompts)], config) for i in range(count)]
    return finish_times([handle.result for handle in decode_many(models, requests, max_parallel=count)])


def finish_times(calls) -> list[float]:
    """Seconds from now until each call, all made at once (a thread each), returned."""
    times = [0.0] * len(calls)
    started = time.perf_counter()

    def call(i):
        calls[i]()
        times[i] = time.perf_counter() - started

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return times


def sharing_rows(at_once, counts, prompts, repeats: int, where: str, cpu) -> dict:
    """For each count: p50 / max time to finish against client 1 alone, the worst client against its own
    prompt alone, and the CPU seconds each process spent meanwhile; `at_once(count, prompts)` gives the
    finish times, `cpu()` the processes' CPU seconds by name; alone times are medians of `repeats`."""
    own = [statistics.median(at_once(1, [p])[0] for _ in range(repeats)) for p in prompts[: max(counts)]]
    report = {"alone_s": own, "clients": {}}
    for count in counts:
        before = cpu()
        times = at_once(count, prompts)
        spent = {name: seconds - before[name] for name, seconds in cpu().items()}
        row = {"p50_s": statistics.median(times), "max_s": max(times), "cpu_s": spent}
        row |= {
            "p50_vs_alone": row["p50_s"] / own[0],
            "max_vs_alone": row["max_s"] / own[0],
            "max_vs_own_alone": max(t / own[i] for i, t in enumerate(times)),
        }
        report["clients"][count] = row
        print(
            f"{where}, {count} clients: p50 {row['p50_s']:.1f} s, max {row['max_s']:.1f} s "
            f"({row['max_vs_alone']:.2f}x client 1 alone, {own[0]:.1f} s; worst client vs its own prompt alone "
            f"{row['max_vs_own_alone']:.2f}x); CPU "
            + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in spent.items()),
            flush=True,
        )
    return report


def process_cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system) of this process, or of process `pid` (Linux's /proc)."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def app_section(args) -> dict:
    """Time to finish of C clients at once, for each C, against one client alone: through the app, through
    the OpenAI-compatible server, then the same runs started at once in this process with no server: the
    least either could take."""
    from gradio_client import Client

    prompts = KEPT + HARD
    chosen = RunSettings.defaults(list(DEFAULT_MODELS), "safe", args.app_tokens)
    counts = [int(c) for c in args.clients.split(",")]
    report = {"tokens": args.app_tokens, "repeats": args.app_repeats}

    def measure(where: str, at_once, cpu) -> dict:
        return sharing_rows(at_once, counts, prompts, args.app_repeats, where, cpu)

    with serving(["app.py", "--cpu-linear", args.cpu_linear], "/gradio_api/info") as (base, pid):
        url, settings = base + "/", astuple(chosen)
        Client(url, verbose=False).predict(prompts[0], *settings, api_name="/generate")  # loads, warms the models
        report["app"] = measure(
            "app",
            lambda count, ps: clients_at_once(url, count, ps, settings),
            lambda: {"app": process_cpu_s(pid), "clients": process_cpu_s()},
        )
    with serving(["-m", "safe_engine", "serve", "--cpu-linear", args.cpu_linear], "/health") as (base, pid):
        url = base + "/v1/chat/completions"
        report["server"] = measure(
            "server",
            lambda count, ps: requests_at_once(url, count, ps, args.app_tokens),
            lambda: {"server": process_cpu_s(pid), "clients": process_cpu_s()},
        )
    models = load_models(list(DEFAULT_MODELS), LoadOptions(device="cpu", cpu_linear=args.cpu_linear))
    _, config = decoding(chosen)
    runs_at_once(models, 2, prompts, config)  # warms this process's models
    report["engine"] = measure(
        "no server", lambda count, ps: runs_at_once(models, count, ps, config), lambda: {"engine": process_cpu_s()}
    )
    return report


BENCH_TASKS = ("facts", "arithmetic", "copying", "completion")  # RESULTS.md's 40-item benchmark at --limit 10


def bench_section(args, models) -> dict:
    """The bench's wall time over the same items at each batch size, in fresh folders; rows against batch 1."""
    examples = [e for name in BENCH_TASKS for e in load_task(name, args.bench_limit)]
    config = DecodeConfig(strategy="safe", max_new_tokens=args.bench_tokens)
    labels = [f"single:{models[0].name}" if s == "single" else s for s in args.bench_strategies.split(",")]
    report, reference = {"items": len(examples), "strategies": labels, "sizes": {}}, None
    for size in [int(s) for s in args.bench_sizes.split(",")]:
        with tempfile.TemporaryDirectory() as out:
            bench = Bench(models, examples, config, labels, out, batch_size=size)
            bench.runner.warm_up()
            started = time.perf_counter()
            for _ in bench.run():
                pass
            wall = time.perf_counter() - started
            rows = {(r["task"], r["id"], r["strategy"]): r["prediction"] for r in load_results(out)}
        reference = reference or rows
        same = sum(rows[key] == reference[key] for key in reference) / len(reference)
        first = next(iter(report["sizes"].values()), {"wall_s": wall})["wall_s"]
        report["sizes"][size] = {"wall_s": wall, "vs_first": wall / first, "rows_identical": same}
        print(f"bench, {len(examples)} items, batch {size}: {wall:.1f} s ({wall / first:.2f}x), rows same {same:.0%}")
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="engine,app,bench", help="which parts to run, comma-separated")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--sizes", default="1,2,4,8")
    parser.add_argument("--strategies", default="single,per-token,safe")
    parser.add_argument("--prompts", type=int, default=len(KEPT + HARD), help="the first N speed prompts")
    parser.add_argument("--clients", default="1,4,8", help="app: concurrent clients (1 first: the reference)")
    parser.add_argument("--app-tokens", type=int, default=24)
    parser.add_argument("--app-repeats", type=int, default=3, help="app: runs alone whose median is the reference")
    parser.add_argument("--bench-sizes", default="1,8", help="bench: batch sizes (the first is the reference)")
    parser.add_argument("--bench-strategies", default="safe")
    parser.add_argument("--bench-limit", type=int, default=10, help="bench: items of each of the four sets")
    parser.add_argument("--bench-tokens", type=int, default=24)
    parser.add_argument(
        "--cpu-linear", default="streamed", help="the models' CPU linear layers (default: fp32, as the targets are)"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    sections = set(args.sections.split(","))
    report = {}
    if sections & {"engine", "bench"}:
        models = load_models(list(DEFAULT_MODELS), LoadOptions(device="cpu", cpu_linear=args.cpu_linear))
    if "engine" in sections:
        report |= engine_section(args, models)
    if "app" in sections:
        report["app"] = app_section(args)
    if "bench" in sections:
        report["bench"] = bench_section(args, models)
    report["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    write_json(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
