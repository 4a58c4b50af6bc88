"""The GPU check script's parts that need no GPU: its options, its shapes, its message without CUDA, its models at a
tiny width, and its served path against vLLM's CPU build."""

from pathlib import Path

import pytest
import torch
from ci import skip_or_fail

from safe_engine.contract.events import RunFinished
from safe_engine.remote.request_shapes import PER_POSITION, PROMPT_LOGPROBS
from safe_engine.strategies.decoding import DecodeConfig, decode
from scripts import gpu_check
from scripts.vllm_serve import VLLM_PYTHON, Launch, free_port


def test_defaults_read_the_converted_tokenizers_from_the_studio_cache():
    args = gpu_check.parse_args([])
    assert args.tokenizers.name == "tokenizers" and args.layers == 32 and args.prompts >= 1


@pytest.mark.parametrize(
    "flags", [["--layers", "0"], ["--layers", "33"], ["--prompts", "0"], ["--max-new-tokens", "0"]]
)
def test_out_of_range_options_are_refused(flags, capsys):
    with pytest.raises(SystemExit):
        gpu_check.parse_args(flags)
    assert "--layers must be 1..32" in capsys.readouterr().err


@pytest.mark.parametrize("name, billions", [("llama-3", 8.03), ("mistral-7b", 7.24)])
def test_the_shapes_are_the_published_models(name, billions):
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**gpu_check.CONFIGS[name]))
    assert sum(p.numel() for p in model.parameters()) / 1e9 == pytest.approx(billions, abs=0.01)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message is for machines without CUDA")
def test_without_cuda_it_says_so_and_exits_2(capsys, tmp_path):
    assert gpu_check.main(["--tokenizers", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == gpu_check.NO_CUDA


TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    """The check's two families at a tiny width on the CPU, with their real (converted) tokenizers."""
    from families import tokenizer_spec

    torch.manual_seed(0)
    folders = {name: Path(tokenizer_spec(name)) for name in gpu_check.CONFIGS}
    return [gpu_check.random_model(name, folders[name].parent, "cpu", torch.float32, **TINY) for name in folders]


@pytest.mark.families
def test_the_random_models_decode_together(tiny_pair):
    """The models the check builds run SAFE end to end (their construction broke once, unseen without a GPU)."""
    events = list(decode(tiny_pair, "Hello", DecodeConfig(max_new_tokens=6, damage_kl_steps=0)))
    finished = next(e for e in events if isinstance(e, RunFinished))
    assert finished.stats["tokens"] == 6 and [m.name for m in tiny_pair] == list(gpu_check.CONFIGS)


@pytest.mark.families
@pytest.mark.vllm
def test_the_served_path_measures_both_request_shapes_against_a_real_vllm(tiny_pair):
    """The served part on vLLM's CPU build: both shapes' verify rounds at 32 and 1024 tokens of context, and
    SAFE runs with the verifier served by each shape and in process."""
    if gpu_check.vllm_interpreter() is None:
        skip_or_fail(f"no vLLM at {VLLM_PYTHON} (bash scripts/setup.sh --vllm)")
    launch = Launch(Path(), "verifier", free_port(), python=gpu_check.vllm_interpreter())
    config = DecodeConfig(max_new_tokens=8, damage_kl_steps=0)
    report = gpu_check.served_check(*tiny_pair, launch, gpu_check.PROMPTS[:1], config)
    assert set(report["verify_round_s"]) == {PROMPT_LOGPROBS, PER_POSITION, "in_process"}
    assert all(set(row) == {32, 1024} and min(row.values()) > 0 for row in report["verify_round_s"].values())
    runs = report["safe_runs"]
    assert set(runs) == {"in_process", PROMPT_LOGPROBS, PER_POSITION, "measured_choice"}
    assert runs[PER_POSITION]["requests_per_token"] and not runs["in_process"]["requests_per_token"], runs
