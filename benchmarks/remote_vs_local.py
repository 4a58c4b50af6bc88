"""The same runs in-process and with the drafter behind vLLM: share of identical tokens, each difference explained.

    python -m benchmarks.remote_vs_local [--url http://127.0.0.1:8011/v1] [--max-new-tokens 32] [--out out/remote.json]

Gemma-3-270M drafts and SmolLM2-135M verifies, as in the default pair; the remote runs put Gemma behind a vLLM
server (``openai:URL#gemma``; started here with scripts/vllm_serve.py unless --url names a running one) and keep
SmolLM2 in-process. For each of the 20 speed prompts (benchmarks/safe_speed.py) and each strategy (SAFE,
per-token, single; greedy), the committed token ids are compared. Where they differ, the first differing
position is explained by Gemma's own top-2 margin there in both engines: a margin near zero is a near-tie that
the two engines' float sums break differently; a wide margin with the same top token in both engines points at
the ensemble (the union's approximation, docs/models.md "Remote models").
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.safe_speed import HARD, KEPT, write_json
from safe_engine.contract.events import TextCommitted
from safe_engine.models.cache import load_models
from safe_engine.models.loading import LoadOptions, load_model
from safe_engine.strategies.decoding import DecodeConfig, decode

STRATEGIES = ("safe", "per-token", "single")


def committed(models, prompt: str, config: DecodeConfig) -> tuple[list[int], list[str], float]:
    """The drafter's committed ids, each token's decision, and the wall time."""
    began = time.perf_counter()
    tokens = [t for e in decode(models, prompt, config) if isinstance(e, TextCommitted) for t in e.tokens]
    return [i for t in tokens for i in t.ids], [str(t.decision) for t in tokens], time.perf_counter() - began


def top2(lm, ids: list[int]) -> dict:
    """The model's two most likely next tokens after `ids` and their log-probability margin."""
    with lm.open_session() as session:
        logprobs = torch.log_softmax(session.next_token_logits(ids, [len(ids)])[0].float(), 0)
    values, indices = torch.topk(logprobs, 2)
    return {"top": indices.tolist(), "margin": round(float(values[0] - values[1]), 5)}


def explain(local_gemma, remote_gemma, prompt: str, local: list[int], remote: list[int], decisions) -> dict:
    i = next((k for k, (a, b) in enumerate(zip(local, remote)) if a != b), min(len(local), len(remote)))
    ids = local_gemma.encode_prompt(prompt) + local[:i]
    here, there = top2(local_gemma, ids), top2(remote_gemma, ids)
    near_tie = min(here["margin"], there["margin"]) < 0.01
    return {
        "prompt": prompt,
        "first_difference": i,
        "local": local_gemma.tokenizer.decode(local[i : i + 1]),
        "remote": local_gemma.tokenizer.decode(remote[i : i + 1]),
        "local_decision": decisions[i] if i < len(decisions) else None,
        "gemma_in_process": here,
        "gemma_on_vllm": there,
        "why": "near-tie in Gemma (margin < 0.01)" if near_tie else "ensemble decision (see gemma margins)",
    }


def measure(url: str, max_new_tokens: int) -> dict:
    gemma, smollm = load_models(["embedded:gemma-3-270m", "embedded:smollm2-135m-instruct"], LoadOptions())
    remote = load_model(f"openai:{url}#gemma")
    report = {"url": url, "max_new_tokens": max_new_tokens, "strategies": {}}
    for strategy in STRATEGIES:
        config = DecodeConfig(strategy=strategy, max_new_tokens=max_new_tokens, damage_kl_steps=0)
        rows, differences, seconds = 0, [], {"in_process": 0.0, "remote": 0.0}
        for prompt in KEPT + HARD:
            local, decisions, local_s = committed([gemma, smollm], prompt, config)
            served, _, remote_s = committed([remote, smollm], prompt, config)
            seconds["in_process"] += local_s
            seconds["remote"] += remote_s
            if local == served:
                rows += 1
            else:
                differences.append(explain(gemma, remote, prompt, local, served, decisions))
            same = "same" if local == served else f"DIFFERS {differences[-1]}"
            print(strategy, f"{local_s:.1f} s in process, {remote_s:.1f} s remote:", same, flush=True)
        report["strategies"][strategy] = {
            "identical": rows,
            "prompts": len(KEPT + HARD),
            "seconds": {k: round(v, 1) for k, v in seconds.items()},
            "differences": differences,
        }
        print(strategy, rows, "of", len(KEPT + HARD), "identical", seconds, flush=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running vLLM server for Gemma (default: start one on port 8011)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from scripts.vllm_serve import serving

    if args.url:
        write_json(measure(args.url, args.max_new_tokens), args.out)
        return
    with serving({"gemma-3-270m": 8011}) as servers:
        write_json(measure(servers["gemma-3-270m"].url, args.max_new_tokens), args.out)


if __name__ == "__main__":
    main()
