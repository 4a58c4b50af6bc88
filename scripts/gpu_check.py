"""SAFE on models of realistic size, for a GPU machine (run by hand; about 10 minutes on one GPU at most).

    python -m scripts.gpu_check [--tokenizers DIR] [--layers 32] [--prompts 4] [--max-new-tokens 96] [--out F.json]

Builds two random-weight models in bf16 from configs written here (Llama-3-8B as the drafter, Mistral-7B
as the verifier), each with its real tokenizer as `scripts/convert_js_tokenizers.py` converts it (folders
DIR/llama-3 and DIR/mistral-7b; default the studio cache). No weights are read or carried: only the two
tokenizer folders (about 20 MiB). With two GPUs or more, each model gets its own; with one, both share it.
Prints, as JSON: seconds per token and tokens/s of the drafter alone, per-token ensembling and SAFE with
overlap off and on; SAFE / drafter and per-token / SAFE; whether overlap changed any output (it must not);
logit bytes handed to the host per token; and each GPU's peak memory.

Random weights make near-uniform distributions: the models never agree, so SAFE ensembles about once a
round (E/T is printed). The check is of speed and plumbing at real sizes, not of quality. End tokens are
ignored, so every run generates its full length.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.overlap_speed import PROMPTS, measure, variants
from safe_engine.models.embedded import cache_root
from safe_engine.models.loading import LoadedModel
from safe_engine.models.specs import ResolvedSpec
from safe_engine.orchestration.comparison import warm_up
from safe_engine.strategies.decoding import DecodeConfig

ROOT = Path(__file__).resolve().parents[1]

CONFIGS = {  # the published shapes; the vocabularies are the converted tokenizers'
    "llama-3": dict(
        model_type="llama",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
    ),
    "mistral-7b": dict(
        model_type="mistral",
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=32768,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        sliding_window=None,
    ),
}
NO_CUDA = "error: gpu_check needs a CUDA GPU, and torch sees none here (torch.cuda.is_available() is False)"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tokenizers",
        type=Path,
        default=cache_root() / "tokenizers",
        help="folder holding the converted llama-3 and mistral-7b tokenizers (default: %(default)s)",
    )
    parser.add_argument("--layers", type=int, default=32, help="layers per model (32: the real depth)")
    parser.add_argument("--prompts", type=int, default=4, help=f"how many of the {len(PROMPTS)} prompts")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    if not 1 <= args.layers <= 32 or not 1 <= args.prompts <= len(PROMPTS) or args.max_new_tokens < 1:
        parser.error(f"--layers must be 1..32, --prompts 1..{len(PROMPTS)}, --max-new-tokens at least 1")
    return args


def random_model(name: str, tokenizers: Path, layers: int, device: str) -> LoadedModel:
    """A random-weight bf16 model of the family's shape on `device`, with the family's real tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder = tokenizers / name
    tokenizer = AutoTokenizer.from_pretrained(folder)
    shape = dict(CONFIGS[name], num_hidden_layers=layers)
    config = AutoConfig.for_model(**shape)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    spec = ResolvedSpec(str(folder), "folder", str(folder))
    return LoadedModel(spec, name, model, tokenizer, device, torch.bfloat16, use_chat_template=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(NO_CUDA, file=sys.stderr)
        return 2
    missing = [n for n in CONFIGS if not (args.tokenizers / n / "tokenizer.json").is_file()]
    if missing:
        print(f"error: no converted tokenizer for {', '.join(missing)} in {args.tokenizers}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    gpus = torch.cuda.device_count()
    devices = ["cuda:0", "cuda:1" if gpus > 1 else "cuda:0"]
    models = [random_model(name, args.tokenizers, args.layers, d) for name, d in zip(CONFIGS, devices)]
    built_s = time.perf_counter() - started
    for d in set(devices):
        torch.cuda.reset_peak_memory_stats(d)
    config = DecodeConfig(max_new_tokens=args.max_new_tokens, damage_kl_steps=0)
    warm_up(models, config)
    result = measure(models, PROMPTS[: args.prompts], variants(config, baselines=True))
    median = result["median_s_per_token"]
    result |= {
        "gpus": gpus,
        "models": [m.describe() | {"layers": args.layers} for m in models],
        "safe_over_drafter": median["safe"] / median["drafter"],
        "safe_overlap_over_drafter": median["safe-overlap"] / median["drafter"],
        "per_token_over_safe": median["per-token"] / median["safe"],
        "peak_gib": {d: torch.cuda.max_memory_allocated(d) / 2**30 for d in sorted(set(devices))},
        "build_s": built_s,
        "total_s": time.perf_counter() - started,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
