"""SAFE vs the drafter alone vs per-token ensembling, side by side in one process, on the embedded pair.

Prints one row per prompt and the medians: SAFE / drafter alone, per-token / SAFE (both as seconds per
generated token, so a run that stops early at EOS is not flattered), E/T, tokens/s, the share of SAFE's
wall time spent outside model forward passes, and how often paper-exact and fast SAFE outputs differ.

    python benchmarks/safe_speed.py [--max-new-tokens 48] [--attn sdpa|eager] [--adaptive-lookahead]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from safe_engine.compare import load_models, run_comparison, summarize, warm_up  # noqa: E402
from safe_engine.decoding import DecodeConfig, decode  # noqa: E402
from safe_engine.models import DEFAULT_MODELS, LoadOptions  # noqa: E402

PROMPTS = [
    "Tom has 3 apples and buys 5 more. How many apples does he have?",
    "The capital of Madagascar is",
    "Write a Python function that returns the factorial of n.",
    "Repeat exactly: Ouagadougou, Antananarivo, Reykjavik.",
    "List three facts about the Moon.",
    "What is 12 times 4? Think step by step.",
    "Complete the sentence: The quick brown fox",
    "Explain in one paragraph why the sky is blue.",
    "Translate to French: I like green apples.",
    "Name the planets of the solar system in order.",
]


def per_token_s(summary: dict) -> float:
    return summary["wall_s"] / max(summary["tokens"], 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--attn", default=None, choices=["sdpa", "eager"], help="attention kernel (default: the model's)")
    parser.add_argument("--adaptive-lookahead", action="store_true", help="SAFE drafts fewer tokens after a replacement")
    args = parser.parse_args()

    models = load_models(list(DEFAULT_MODELS), LoadOptions(attn_implementation=args.attn))
    warm_up(models)
    drafter = models[0].name
    config = DecodeConfig(max_new_tokens=args.max_new_tokens, adaptive_lookahead=args.adaptive_lookahead)
    rows = []
    print("| prompt | drafter tok/s | SAFE tok/s | SAFE / drafter | per-token / SAFE | SAFE E/T | outside forward | exact = fast |")
    print("|---|---|---|---|---|---|---|---|")
    for prompt in PROMPTS[: args.prompts]:
        runs: dict[str, list] = {}
        for label, event in run_comparison(models, prompt, config):
            runs.setdefault(label, []).append(event)
        s = {label: summarize(events, label) for label, events in runs.items()}
        exact = summarize(list(decode(models, prompt, replace(config, safe_mode="exact"))), "safe-exact")
        alone, safe, per_token = s[f"single:{drafter}"], s["safe"], s["per-token"]
        row = {
            "safe_vs_drafter": per_token_s(safe) / per_token_s(alone),
            "per_token_vs_safe": per_token_s(per_token) / per_token_s(safe),
            "e_t": safe["e_t"],
            "per_token_e_t": per_token["e_t"],
            "drafter_tps": alone["tokens_per_s"],
            "safe_tps": safe["tokens_per_s"],
            "exact_tps": exact["tokens_per_s"],
            "per_token_tps": per_token["tokens_per_s"],
            "overhead": safe["overhead_share"],
            "same": exact["text"] == safe["text"],
        }
        rows.append(row)
        print(
            f"| {prompt[:40]} | {row['drafter_tps']:.1f} | {row['safe_tps']:.1f} | {row['safe_vs_drafter']:.2f} | "
            f"{row['per_token_vs_safe']:.2f} | {row['e_t']:.0%} | {row['overhead']:.1%} | {'yes' if row['same'] else 'no'} |",
            flush=True,
        )

    def median(key):
        return statistics.median(r[key] for r in rows)

    print()
    print(f"medians over {len(rows)} prompts, {args.max_new_tokens} new tokens, attention {args.attn or 'default'}"
          f"{', adaptive lookahead' if args.adaptive_lookahead else ''}:")
    print(f"- SAFE / drafter alone (s per token): {median('safe_vs_drafter'):.2f}  (target <= 1.3)")
    print(f"- per-token / SAFE (s per token):     {median('per_token_vs_safe'):.2f}  (target > 1)")
    print(f"- SAFE E/T: {median('e_t'):.1%}   per-token E/T: {median('per_token_e_t'):.0%}")
    print(f"- tokens/s: drafter {median('drafter_tps'):.1f}, SAFE fast {median('safe_tps'):.1f}, "
          f"SAFE exact {median('exact_tps'):.1f}, per-token {median('per_token_tps'):.1f}")
    print(f"- SAFE wall time outside forward passes: {median('overhead'):.1%}  (target <= 10 %)")
    print(f"- paper-exact and fast SAFE outputs differ on {sum(not r['same'] for r in rows)} of {len(rows)} prompts")


if __name__ == "__main__":
    main()
