"""SAFE with overlap on vs off (`safe_engine/strategies/overlap.py`): seconds per token, side by side in one process.

    python -m benchmarks.overlap_speed [--prompts 5] [--max-new-tokens 48] [--devices D ...] [--out FILE.json]

On the embedded pair (or `--models`), for each prompt: SAFE with overlap off and on, in alternating order,
after `warm_up`; medians over prompts of seconds per generated token, and whether the outputs are the
same (they must be). `variants` and `measure` also serve `scripts/gpu_check.py`. On one CPU overlap is
expected to be slower (the models share the cores and the memory bandwidth); it is meant for one GPU
per model.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from benchmarks.safe_speed import write_json
from safe_engine.models.cache import load_models
from safe_engine.models.loading import LoadedModel, LoadOptions
from safe_engine.models.specs import DEFAULT_MODELS
from safe_engine.orchestration.comparison import summarize, warm_up
from safe_engine.strategies.decoding import DecodeConfig, decode

PROMPTS = [
    "Tom has 3 apples and buys 5 more. How many apples does he have?",
    "Write a Python function that returns the factorial of n.",
    "List three facts about the Moon.",
    "Explain in one paragraph why the sky is blue.",
    "Translate to French: I like green apples.",
    "Name the planets of the solar system in order.",
    "Write a short story about a fox who learns to read.",
    "Repeat exactly: Ouagadougou, Antananarivo, Reykjavik.",
]


def variants(config: DecodeConfig, baselines: bool = False) -> dict[str, DecodeConfig]:
    """SAFE with overlap off and on; `baselines`: also the drafter alone and per-token ensembling before them."""
    out = {}
    if baselines:
        out = {"drafter": replace(config, strategy="single"), "per-token": replace(config, strategy="per-token")}
    safe = replace(config, strategy="safe")
    return out | {"safe": replace(safe, overlap=False), "safe-overlap": replace(safe, overlap=True)}


def measure(models: Sequence[LoadedModel], prompts: Sequence[str], plan: dict[str, DecodeConfig]) -> dict:
    """Medians over the prompts (the order of the variants rotates per prompt) of each variant's seconds per
    token, E/T and logit bytes handed to the host per token; tokens/s; and how many outputs of each SAFE
    variant equal plain SAFE's."""
    runs: dict[str, list[dict]] = {name: [] for name in plan}
    names = list(plan)
    for i, prompt in enumerate(prompts):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            runs[name].append(summarize(list(decode(models, prompt, plan[name]))))

    def median(value) -> dict[str, float]:
        return {name: statistics.median(value(s) for s in summaries) for name, summaries in runs.items()}

    per_token = median(lambda s: s["wall_s"] / max(s["tokens"], 1))
    texts = {name: [s["text"] for s in summaries] for name, summaries in runs.items()}
    return {
        "prompts": len(prompts),
        "median_s_per_token": per_token,
        "tokens_per_s": {name: 1 / value for name, value in per_token.items()},
        "e_t": median(lambda s: s["e_t"]),
        "logit_bytes_per_token": median(
            lambda s: sum(f["logit_bytes"] for f in s["stats"]["forward"].values()) / max(s["tokens"], 1)
        ),
        "same_text_as_safe": {
            name: sum(a == b for a, b in zip(texts[name], texts["safe"])) for name in plan if name.startswith("safe")
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument("--devices", nargs="+", default=["auto"])
    parser.add_argument("--prompts", type=int, default=5, help=f"how many of the {len(PROMPTS)} prompts")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    models = load_models(args.models, LoadOptions(device=tuple(args.devices)))
    config = DecodeConfig(max_new_tokens=args.max_new_tokens, damage_kl_steps=0)
    warm_up(models, config)
    result = measure(models, PROMPTS[: args.prompts], variants(config))
    result |= {"models": [m.describe() for m in models], "max_new_tokens": args.max_new_tokens}
    write_json(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
