"""The same runs in-process and with models behind vLLM: share of identical tokens, each difference explained.

    python -m benchmarks.remote_vs_local [--served pair|gemma] [--max-new-tokens 32] [--out out/remote.json]

Gemma-3-270M drafts and SmolLM2-135M verifies, as in the default pair. The remote runs put both behind vLLM
servers (``--served pair``: ``openai:URL#gemma`` and ``openai:URL#smollm2``, one server each, started here with
scripts/vllm_serve.py) or only Gemma, with SmolLM2 in-process (``--served gemma``). For each of the 20 speed
prompts (benchmarks/safe_speed.py) and each strategy (SAFE, per-token, single; greedy), the committed token ids
and each token's decision are compared. Where the ids differ, the first differing
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
from scripts.vllm_serve import served_name, serving

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


SERVED = {"pair": ("gemma-3-270m", "smollm2-135m-instruct"), "gemma": ("gemma-3-270m",)}
PORTS = {"gemma-3-270m": 8011, "smollm2-135m-instruct": 8012}


def measure(urls: dict[str, str], max_new_tokens: int) -> dict:
    """`urls`: embedded model -> the API root serving it; the others run in-process in the remote runs too."""
    gemma, smollm = load_models(["embedded:gemma-3-270m", "embedded:smollm2-135m-instruct"], LoadOptions())
    remote, remote_smollm = (
        load_model(f"openai:{urls[name]}#{served_name(name)}") if name in urls else local
        for name, local in (("gemma-3-270m", gemma), ("smollm2-135m-instruct", smollm))
    )
    report = {"served": sorted(urls.values()), "max_new_tokens": max_new_tokens, "strategies": {}}
    for strategy in STRATEGIES:
        config = DecodeConfig(strategy=strategy, max_new_tokens=max_new_tokens, damage_kl_steps=0)
        same_ids, same_decisions, differences = 0, 0, []
        seconds = {"in_process": 0.0, "remote": 0.0}
        for prompt in KEPT + HARD:
            local, decisions, local_s = committed([gemma, smollm], prompt, config)
            served, served_decisions, remote_s = committed([remote, remote_smollm], prompt, config)
            seconds["in_process"] += local_s
            seconds["remote"] += remote_s
            same_ids += local == served
            same_decisions += decisions == served_decisions
            if local != served:
                differences.append(explain(gemma, remote, prompt, local, served, decisions))
            same = "same" if local == served else f"DIFFERS {differences[-1]}"
            decided = "same decisions" if decisions == served_decisions else "OTHER DECISIONS"
            print(strategy, f"{local_s:.1f} s in process, {remote_s:.1f} s remote:", same, decided, flush=True)
        report["strategies"][strategy] = {
            "identical_ids": same_ids,
            "identical_decisions": same_decisions,
            "prompts": len(KEPT + HARD),
            "seconds": {k: round(v, 1) for k, v in seconds.items()},
            "differences": differences,
        }
        print(strategy, same_ids, "ids and", same_decisions, "decisions of", len(KEPT + HARD), seconds, flush=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--served", choices=SERVED, default="pair", help="the models behind servers (default: pair)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with serving({name: PORTS[name] for name in SERVED[args.served]}) as servers:
        urls = {name: server.url for name, server in servers.items()}
        write_json(measure(urls, args.max_new_tokens), args.out)


if __name__ == "__main__":
    main()
