"""A served verifier's cost per verify round and per token, with each request shape, beside in-process runs.

    python -m benchmarks.served_verifier [--contexts 32,64,128,256,512,1024] [--repeats 3] [--lengths 32,256,768]
        [--prompts 3] [--concurrent 1,2,4] [--out out/served_verifier.json]

Serves both embedded models with vLLM's CPU build (scripts/vllm_serve.py, one server each) and measures, in
one run:

1. **Verify rounds.** SmolLM2 (the default pair's verifier) scores a 5-token draft after each of `--contexts`
   tokens of prose, in one session, the context growing by 5 tokens a round as in a run: a first round leaves
   the prefix where a run's earlier rounds would (the server's cache, the session's KV), the next `--repeats`
   are timed (median). Served with each request shape (``SAFE_OPENAI_VERIFY``) and in process, with the HTTP
   requests per round; and each length's seconds over the shortest's.
2. **Whole runs** of each of `--lengths` new tokens (greedy; end tokens ignored, so every run has its full
   length) on the first `--prompts` speed prompts: Gemma alone and SAFE (Gemma drafts, SmolLM2 verifies) in
   process; Gemma alone served; SAFE with SmolLM2 served, with each shape and with the measured choice; SAFE
   with both served. Per configuration and length: seconds per token (median over prompts), its growth from
   the shortest length and that growth over the in-process pair's, HTTP requests per token of each served
   model, the calls each shape took, and how many SAFE runs gave the tokens of the ``prompt_logprobs`` shape
   (the served path before the per-position shape).
3. **Concurrent runs** (`--concurrent`): that many SAFE runs at once, both models served, the shortest length
   each: tokens per second over all of them, which shows how far the servers batch the runs' requests.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from benchmarks.safe_speed import KEPT, write_json
from safe_engine.contract.events import RunFinished, TextCommitted
from safe_engine.models.cache import load_models
from safe_engine.models.loading import LoadedModel, LoadOptions, load_model
from safe_engine.models.specs import DEFAULT_MODELS
from safe_engine.orchestration.comparison import warm_up
from safe_engine.orchestration.many_runs import DecodeRequest, decode_many
from safe_engine.remote.request_shapes import PER_POSITION, PROMPT_LOGPROBS
from safe_engine.strategies.decoding import DecodeConfig, decode
from scripts.vllm_serve import served_name, serving

ROOT = Path(__file__).resolve().parents[1]
PROSE = ROOT / "docs" / "algorithm.md"  # any prose over the longest context
PORTS = {"gemma-3-270m": 8021, "smollm2-135m-instruct": 8022}
DRAFT = 5  # the SAFE default lookahead


@contextmanager
def verify_shape(shape: str | None):
    """SAFE_OPENAI_VERIFY set to `shape` (None: the measured choice) for the duration."""
    before = os.environ.get("SAFE_OPENAI_VERIFY")
    os.environ["SAFE_OPENAI_VERIFY"] = shape or "auto"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SAFE_OPENAI_VERIFY")
        else:
            os.environ["SAFE_OPENAI_VERIFY"] = before


def verify_rounds(lm: LoadedModel, text: list[int], context: int, repeats: int) -> dict:
    """Seconds of the timed rounds (median) and HTTP requests per round, the context growing a draft a round."""
    times = []
    with lm.open_session() as session:
        for r in range(repeats + 1):
            start = context + DRAFT * r
            began = time.perf_counter()
            session.next_token_logits(text[: start + DRAFT], list(range(start, start + DRAFT)))
            times.append(time.perf_counter() - began)
        requests = getattr(session.stats, "requests", None)
    return {"s": statistics.median(times[1:]), "requests_per_round": requests and requests / (repeats + 1)}


def round_costs(local: LoadedModel, served: LoadedModel, contexts: list[int], repeats: int) -> dict:
    text = local.tokenizer(PROSE.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    if len(text) < max(contexts) + DRAFT * (repeats + 1):
        raise SystemExit(f"{PROSE} holds {len(text)} tokens: too few for a context of {max(contexts)}")
    rows = {}
    for label, lm, shape in [
        (PROMPT_LOGPROBS, served, PROMPT_LOGPROBS),
        (PER_POSITION, served, PER_POSITION),
        ("in_process", local, None),
    ]:
        with verify_shape(shape):
            rows[label] = {c: verify_rounds(lm, text, c, repeats) for c in contexts}
        first = rows[label][contexts[0]]["s"]
        for c in contexts:
            rows[label][c]["over_shortest"] = rows[label][c]["s"] / first
            print(f"verify round, {label}, context {c}: {rows[label][c]}", flush=True)
    return rows


def no_end(lm: LoadedModel) -> LoadedModel:
    """The model with no end tokens, so a run always generates its full length."""
    return replace(lm, eos_ids=frozenset())


def run(models, prompt: str, config: DecodeConfig) -> dict:
    began = time.perf_counter()
    events = list(decode(models, prompt, config))
    wall = time.perf_counter() - began
    finished = next(e for e in events if isinstance(e, RunFinished))
    tokens = finished.stats["tokens"]
    served = {name: f for name, f in finished.stats["forward"].items() if "requests" in f}
    return {
        "ids": [i for e in events if isinstance(e, TextCommitted) for t in e.tokens for i in t.ids],
        "s_per_token": wall / max(tokens, 1),
        "e_t": finished.stats["e_t"],
        "requests_per_token": {name: f["requests"] / max(tokens, 1) for name, f in served.items()},
        "shapes": {name: f["shapes"] for name, f in served.items()},
    }


def whole_runs(pair, served, lengths: list[int], prompts: list[str]) -> dict:
    """pair, served: (Gemma, SmolLM2) in process and behind the servers."""
    gemma, smollm = map(no_end, pair)
    remote_gemma, remote_smollm = map(no_end, served)
    configurations = [  # label, models, strategy, shape
        ("gemma_in_process", [gemma], "single", None),
        ("safe_in_process", [gemma, smollm], "safe", None),
        ("gemma_served", [remote_gemma], "single", None),
        ("safe_served_verifier_prompt_logprobs", [gemma, remote_smollm], "safe", PROMPT_LOGPROBS),
        ("safe_served_verifier_per_position", [gemma, remote_smollm], "safe", PER_POSITION),
        ("safe_served_verifier", [gemma, remote_smollm], "safe", None),
        ("safe_both_served", [remote_gemma, remote_smollm], "safe", None),
    ]
    report: dict = {}
    for length in lengths:
        runs = {}
        for label, models, strategy, shape in configurations:
            config = DecodeConfig(strategy=strategy, max_new_tokens=length, damage_kl_steps=0)
            with verify_shape(shape):
                runs[label] = [run(models, prompt, config) for prompt in prompts]
        reference = runs["safe_served_verifier_prompt_logprobs"]
        report[length] = {}
        for (label, _, strategy, _), results in zip(configurations, runs.values()):
            same = sum(r["ids"] == ref["ids"] for r, ref in zip(results, reference)) if strategy == "safe" else None
            report[length][label] = {
                "s_per_token": statistics.median(r["s_per_token"] for r in results),
                "e_t": statistics.median(r["e_t"] for r in results),
                "requests_per_token": results[0]["requests_per_token"],
                "shapes": results[0]["shapes"],
                "same_ids_as_prompt_logprobs": same,
            }
            print(f"{length} tokens, {label}: {report[length][label]}", flush=True)
    shortest = lengths[0]
    for length in lengths:
        for label, row in report[length].items():
            row["growth"] = row["s_per_token"] / report[shortest][label]["s_per_token"]
        pair_growth = report[length]["safe_in_process"]["growth"]
        for row in report[length].values():
            row["growth_over_in_process_pair"] = row["growth"] / pair_growth
    return {"prompts": len(prompts), "lengths": report}


def concurrent_runs(served, counts: list[int], length: int) -> dict:
    models = [no_end(m) for m in served]
    config = DecodeConfig(strategy="safe", max_new_tokens=length, damage_kl_steps=0)
    report = {}
    for n in counts:
        requests = [DecodeRequest(KEPT[i % len(KEPT)], config) for i in range(n)]
        began = time.perf_counter()
        handles = decode_many(models, requests, max_parallel=n)
        tokens = sum(next(e for e in h.result() if isinstance(e, RunFinished)).stats["tokens"] for h in handles)
        report[n] = {"tokens_per_s": tokens / (time.perf_counter() - began)}
        report[n]["over_one_run"] = report[n]["tokens_per_s"] / report[counts[0]]["tokens_per_s"]
        print(f"{n} concurrent runs: {report[n]}", flush=True)
    return {"max_new_tokens": length, "runs": report}


def measure(urls: dict[str, str], args: argparse.Namespace) -> dict:
    pair = load_models(list(DEFAULT_MODELS), LoadOptions())
    served = [load_model(f"openai:{urls[name]}#{served_name(name)}") for name in PORTS]
    warm_up(pair, DecodeConfig(damage_kl_steps=0))
    warm_up(served, DecodeConfig(damage_kl_steps=0))
    return {
        "verify_rounds": round_costs(pair[1], served[1], args.contexts, args.repeats),
        "whole_runs": whole_runs(pair, served, args.lengths, KEPT[: args.prompts]),
        "concurrent": concurrent_runs(served, args.concurrent, min(args.lengths)),
    }


def numbers(text: str) -> list[int]:
    values = sorted({int(v) for v in text.split(",")})
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of positive numbers (e.g. 32,256)")
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=numbers, default=[32, 64, 128, 256, 512, 1024])
    parser.add_argument("--repeats", type=int, default=3, help="timed verify rounds per context (default 3)")
    parser.add_argument("--lengths", type=numbers, default=[32, 256, 768], help="new tokens of the whole runs")
    parser.add_argument("--prompts", type=int, default=3, help=f"how many of the {len(KEPT)} speed prompts")
    parser.add_argument("--concurrent", type=numbers, default=[1, 2, 4], help="SAFE runs at once")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.repeats < 1 or not 1 <= args.prompts <= len(KEPT):
        parser.error(f"--repeats must be at least 1 and --prompts 1..{len(KEPT)}")
    with serving(PORTS) as servers:
        report = measure({name: server.url for name, server in servers.items()}, args)
    write_json(report | {"settings": {k: v for k, v in vars(args).items() if k != "out"}}, args.out)


if __name__ == "__main__":
    main()
