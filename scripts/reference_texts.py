"""Write tests/reference_texts.json: the embedded pair's token ids on the reference prompts for SAFE, per-token and
each model alone, made with transformers' own fp32 layers (`--cpu-linear torch`) at the tested pins.

    python -m scripts.reference_texts [--check]

`--check` writes nothing and exits 1 when a run's ids differ from the file's. The test that reads the file
(tests/test_reference_texts.py) decodes on the default path, so the file pins both that the default numerics
are fp32's and, run in the venvs at the newest and the oldest admitted dependencies, that they give the same
tokens as the pins (tests/test_dependency_ends.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from safe_engine import DEFAULT_MODELS, DecodeConfig, LoadOptions, decode, load_models
from safe_engine.contract.events import TextCommitted

FILE = Path(__file__).resolve().parents[1] / "tests" / "reference_texts.json"
ABOUT = (
    "The embedded pair (Gemma drafts, SmolLM2 verifies), greedy, 48 new tokens, made with transformers' own fp32 "
    "layers (--cpu-linear torch) by python -m scripts.reference_texts at the pins of requirements.txt. SAFE in the "
    "configuration that gave the SAFE authors' code's token ids on 7 of 8 prompts (docs/algorithm.md): exact "
    "mode, full drafts (draft_gate 0), n = 5, k = 10, heuristic sharpening. The prompts are those whose SAFE "
    "tokens the int8 head changes."
)
PROMPTS = (
    "Write one sentence about the history of Kyoto.",
    "What is 2+2?",
    "What is the capital of Madagascar?",
    "Why is the sky blue?",
    "Translate 'good morning' into French.",
    "Explain what a prime number is.",
    "List two uses of copper.",
)
CONFIGS = {  # a run's name: its DecodeConfig's fields
    "safe": {"strategy": "safe", "safe_mode": "exact", "draft_gate": 0.0, "max_new_tokens": 48},
    "per-token": {"strategy": "per-token", "max_new_tokens": 48},
    "single:gemma-3-270m": {"strategy": "single", "drafter": 0, "max_new_tokens": 48},
    "single:smollm2-135m-instruct": {"strategy": "single", "drafter": 1, "max_new_tokens": 48},
}


def committed_ids(models, prompt: str, config: dict) -> tuple[list[int], str]:
    events = list(decode(models, prompt, DecodeConfig(**config)))
    ids = [i for e in events if isinstance(e, TextCommitted) for token in e.tokens for i in token.ids]
    return ids, events[-1].text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the file instead of writing it")
    args = parser.parse_args(argv)
    models = load_models(DEFAULT_MODELS, LoadOptions(cpu_linear="torch"))
    runs = []
    for name, config in CONFIGS.items():
        for prompt in PROMPTS:
            ids, text = committed_ids(models, prompt, config)
            runs.append({"name": name, "config": config, "prompt": prompt, "text": text, "ids": ids})
            print(f"{name:30} {len(ids):3} tokens  {prompt}", flush=True)
    if args.check:
        kept = {(r["name"], r["prompt"]): r["ids"] for r in json.loads(FILE.read_text(encoding="utf-8"))["runs"]}
        differ = [f"{r['name']}: {r['prompt']}" for r in runs if kept.get((r["name"], r["prompt"])) != r["ids"]]
        print("\n".join(differ) or "every run gives the file's ids")
        return 1 if differ else 0
    FILE.write_text(json.dumps({"about": ABOUT, "runs": runs}, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
