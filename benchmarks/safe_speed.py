"""SAFE vs the drafter alone vs per-token ensembling, and each speed lever, side by side in one process.

    python -m benchmarks.safe_speed [--max-new-tokens 48] [--gates 0.1,0.2,0.5] [--no-int8] [--out out/speed.json]

On the embedded pair, for each prompt of two sets (the 10 kept from earlier measurements and 10 hard
ones: rare names, translation, open prose, code), runs: the drafter alone; SAFE as the paper runs it
(`safe-paper`: exact mode, full drafts); SAFE with the defaults (exact mode, draft gate τ = 0.3); SAFE
with each lever (the gate at other τ, fast mode, fast mode with 8-token drafts); per-token ensembling in
both commit modes; and, with int8 weights, the drafter alone, SAFE and per-token. Every ratio is seconds
per generated token (a run that stops early at EOS is not flattered), taken side by side in one process;
medians over prompts. Outputs of each SAFE variant are compared with `safe-paper` (how often they
differ). Damage KL is off: it is measurement, not decoding.

Before timing, every once-per-process cost is paid (`warm_up`), and the drafter-alone run of the first
prompt is timed twice: a first run much slower than the second means the warm-up missed something.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path

from safe_engine.models.cache import load_models
from safe_engine.models.loading import LoadOptions
from safe_engine.models.specs import DEFAULT_MODELS
from safe_engine.orchestration.comparison import summarize, warm_up
from safe_engine.strategies.decoding import DecodeConfig, decode

KEPT = [
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
HARD = [
    "Write a short biography of Nguyễn Thị Minh Khai.",
    "Repeat exactly: Llanfairpwllgwyngyll, Eyjafjallajökull, Tegucigalpa.",
    "Translate to German: The old lighthouse keeper lit the lamp every evening.",
    "Translate to Spanish: We walked along the river until the sun went down.",
    "Write a short story about a fox who learns to read.",
    "Describe a rainy afternoon in Reykjavík in vivid detail.",
    "Write a JavaScript function debounce(fn, waitMs) with a comment for each line.",
    "Write a SQL query that joins customer_orders and order_line_items on order_id.",
    "Explain who Chimamanda Ngozi Adichie is.",
    "Describe the smells and sounds of a spice market in Marrakesh.",
]


def write_json(report: dict, out: Path | None) -> None:
    """A benchmark's report: to `out` (its folder made) or, without one, to stdout."""
    text = json.dumps(report, indent=2)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    else:
        print(text)


def s_per_token(summary: dict) -> float:
    return summary["wall_s"] / max(summary["tokens"], 1)


def variants(gates: list[float]) -> dict[str, DecodeConfig]:
    base = DecodeConfig(damage_kl_steps=0)
    out = {
        "drafter": replace(base, strategy="single"),
        "safe-paper": replace(base, draft_gate=0.0),
        "safe": base,
        "safe-fast": replace(base, safe_mode="fast"),
        "safe-fast-n8": replace(base, safe_mode="fast", lookahead=8),
        "per-token": replace(base, strategy="per-token"),
        "per-token-full": replace(base, strategy="per-token", per_token_commit="full"),
    }
    return out | {f"safe-gate-{tau:g}": replace(base, draft_gate=tau) for tau in gates}


def run(models, prompt: str, config: DecodeConfig) -> dict:
    return summarize(list(decode(models if config.strategy != "single" else models[:1], prompt, config)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--gates", default="0.1,0.2,0.5", help="draft-gate τ values to sweep besides the default")
    parser.add_argument("--no-int8", action="store_true", help="skip the int8 runs")
    parser.add_argument("--sets", default="kept,hard", help="which prompt sets: kept, hard")
    parser.add_argument("--out", default="out/speed.json", help="every row, for later analysis")
    args = parser.parse_args()
    gates = [float(x) for x in args.gates.split(",") if x]
    configs = {name: replace(c, max_new_tokens=args.max_new_tokens) for name, c in variants(gates).items()}

    models = load_models(list(DEFAULT_MODELS))
    warm_up(models, configs["safe"])
    int8 = None
    if not args.no_int8:
        int8 = load_models(list(DEFAULT_MODELS), LoadOptions(cpu_int8=True))
        warm_up(int8, configs["safe"])
    first = KEPT[0]
    once, twice = (s_per_token(run(models, first, configs["drafter"])) for _ in range(2))
    print(
        f"warm-up check: first / second identical drafter run = {once / twice:.2f}"
        + ("  (> 1.15: the warm-up missed a one-time cost)" if once / twice > 1.15 else ""),
        flush=True,
    )

    sets = {"kept": KEPT, "hard": HARD}
    rows = []
    for set_name in args.sets.split(","):
        for prompt in sets[set_name]:
            results = {name: run(models, prompt, config) for name, config in configs.items()}
            if int8:
                results["drafter-int8"] = run(int8, prompt, configs["drafter"])
                results["safe-int8"] = run(int8, prompt, configs["safe"])
                results["per-token-int8"] = run(int8, prompt, configs["per-token"])
            row = {
                "set": set_name,
                "prompt": prompt,
                "s_per_token": {name: s_per_token(r) for name, r in results.items()},
                "e_t": {name: r["e_t"] for name, r in results.items()},
                "overhead": {name: r["overhead_share"] for name, r in results.items()},
                "text": {name: r["text"] for name, r in results.items()},
            }
            rows.append(row)
            t = row["s_per_token"]
            print(
                f"| {set_name} | {prompt[:38]} | drafter {1 / t['drafter']:.1f} tok/s "
                f"| SAFE/drafter {t['safe'] / t['drafter']:.2f} | "
                f"per-token/SAFE {t['per-token'] / t['safe']:.2f} | SAFE E/T {row['e_t']['safe']:.0%} |",
                flush=True,
            )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, ensure_ascii=False, indent=1), encoding="utf-8")
    for set_name in args.sets.split(","):
        report([r for r in rows if r["set"] == set_name], set_name, args.max_new_tokens)


def report(rows: list[dict], set_name: str, tokens: int) -> None:
    names = list(rows[0]["s_per_token"])

    def median(values):
        return statistics.median(values)

    print(
        f"\n### {set_name} prompts ({len(rows)}), {tokens} new tokens, medians over prompts "
        "(int8 rows against the int8 drafter and per-token)\n"
    )
    print(
        "| run | tokens/s | / drafter alone | per-token / this | faster than per-token | E/T | outside forwards | "
        "output differs (SAFE variants: from safe-paper; int8: from the same run in fp32) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        spt = [r["s_per_token"][name] for r in rows]
        suffix = "-int8" if name.endswith("-int8") else ""
        drafter, per_token = "drafter" + suffix, "per-token" + suffix
        vs_drafter = median(r["s_per_token"][name] / r["s_per_token"][drafter] for r in rows)
        vs_per_token = median(r["s_per_token"][per_token] / r["s_per_token"][name] for r in rows)
        wins = sum(r["s_per_token"][per_token] > r["s_per_token"][name] for r in rows)
        reference = (
            name.removesuffix("-int8") if name.endswith("-int8") else "safe-paper" if name.startswith("safe") else None
        )
        differs = None if reference in (None, name) else sum(r["text"][name] != r["text"][reference] for r in rows)
        print(
            f"| {name} | {1 / median(spt):.1f} | {vs_drafter:.2f}× | {vs_per_token:.2f} | {wins} of {len(rows)} | "
            f"{median(r['e_t'][name] for r in rows):.0%} | {median(r['overhead'][name] for r in rows):.1%} | "
            f"{'—' if differs is None else f'{differs} of {len(rows)}'} |"
        )


if __name__ == "__main__":
    main()
