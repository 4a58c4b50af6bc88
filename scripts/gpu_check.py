"""SAFE on models of realistic size, for a GPU machine (run by hand; about 10 minutes on one GPU at most).

    python -m scripts.gpu_check [--tokenizers DIR] [--layers 32] [--prompts 4] [--max-new-tokens 96] [--out F.json]

Builds two random-weight models in bf16 from configs written here (Llama-3-8B as the drafter, Mistral-7B
as the verifier), each with its real tokenizer as `scripts/convert_js_tokenizers.py` converts it (folders
DIR/llama-3 and DIR/mistral-7b; default the studio cache). No weights are read or carried: only the two
tokenizer folders (about 20 MiB). With two GPUs or more, each model gets its own; with one, both share it.
Prints, as JSON: seconds per token and tokens/s of the drafter alone, per-token ensembling and SAFE with
overlap off and on; SAFE / drafter and per-token / SAFE; whether overlap changed any output (it must not);
logit bytes handed to the host per token; and each GPU's peak memory.

Where vLLM is installed (VLLM_PYTHON, default /opt/vllm-venv/bin/python, or this interpreter), it also measures
the served path: the verifier, saved to a temporary folder, is served by vLLM on the GPU, and the JSON's
"served" part gives a verify round's seconds after 32 and after 1024 tokens of context with each request shape
(prompt log-probabilities, one request per drafted position) and in process, and whole SAFE runs with that
verifier served against the same runs in process (seconds per token, HTTP requests per token, identical tokens).

Random weights make near-uniform distributions: the models never agree, so SAFE ensembles about once a
round (E/T is printed). The check is of speed and plumbing at real sizes, not of quality. End tokens are
ignored, so every run generates its full length.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from benchmarks.overlap_speed import PROMPTS, measure, variants
from benchmarks.served_verifier import no_end, round_costs, run, verify_shape
from safe_engine.models.embedded import cache_root
from safe_engine.models.loading import LoadedModel, load_model, local_model
from safe_engine.models.specs import ResolvedSpec
from safe_engine.orchestration.comparison import warm_up
from safe_engine.remote.request_shapes import PER_POSITION, PROMPT_LOGPROBS
from safe_engine.strategies.decoding import DecodeConfig
from scripts.vllm_serve import VLLM_PYTHON, Launch, free_port, serving_launches

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


def random_model(name: str, tokenizers: Path, device: str, dtype, **shape) -> LoadedModel:
    """A random-weight model of the family's shape (`shape` overrides it: layers, widths) on `device`, with the
    family's real tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder = tokenizers / name
    tokenizer = AutoTokenizer.from_pretrained(folder)
    config = AutoConfig.for_model(**(CONFIGS[name] | shape))
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    spec = ResolvedSpec(str(folder), "folder", str(folder))
    return local_model(spec, model, tokenizer, device, dtype, use_chat_template=True)


def vllm_interpreter() -> str | None:
    """An interpreter that imports vllm: VLLM_PYTHON's venv where it exists, else this one if it has vllm."""
    if Path(VLLM_PYTHON).is_file():
        return VLLM_PYTHON
    return sys.executable if importlib.util.find_spec("vllm") else None


def served_check(
    drafter: LoadedModel, verifier: LoadedModel, launch: Launch, prompts: Sequence[str], config: DecodeConfig
) -> dict:
    """The verifier served by vLLM (`launch` without its folder: the weights are saved to a temporary one):
    verify rounds after 32 and 1024 tokens of context per request shape, and SAFE runs with it served."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as folder:
        verifier.model.save_pretrained(folder)
        verifier.tokenizer.save_pretrained(folder)
        with serving_launches({verifier.name: replace(launch, folder=Path(folder))}) as servers:
            served = no_end(load_model(f"openai:{servers[verifier.name].url}#{launch.name}"))
            warm_up([served])
            rounds = round_costs(verifier, served, [32, 1024], repeats=3)
            runs = {"in_process": [run([drafter, verifier], p, config) for p in prompts]}
            for shape in (PROMPT_LOGPROBS, PER_POSITION, None):
                with verify_shape(shape):
                    runs[shape or "measured_choice"] = [run([drafter, served], p, config) for p in prompts]
    reference = runs[PROMPT_LOGPROBS]
    return {
        "verify_round_s": {label: {c: row[c]["s"] for c in row} for label, row in rounds.items()},
        "verify_1024_over_32": {label: row[1024]["over_shortest"] for label, row in rounds.items()},
        "safe_runs": {
            label: {
                "s_per_token": statistics.median(r["s_per_token"] for r in results),
                "requests_per_token": results[0]["requests_per_token"],
                "same_ids_as_prompt_logprobs": sum(r["ids"] == f["ids"] for r, f in zip(results, reference)),
            }
            for label, results in runs.items()
        },
    }


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
    models = [
        random_model(name, args.tokenizers, d, torch.bfloat16, num_hidden_layers=args.layers)
        for name, d in zip(CONFIGS, devices)
    ]
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
    }
    python = vllm_interpreter()
    if python is None:
        result["served"] = {"skipped": f"no vLLM: neither {VLLM_PYTHON} nor this interpreter imports vllm"}
    else:
        launch = Launch(Path(), "verifier", free_port(), gpu=1 if gpus > 1 else 0, python=python)
        result["served"] = served_check(*models, launch, PROMPTS[: args.prompts], config)
    result["total_s"] = time.perf_counter() - started
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
