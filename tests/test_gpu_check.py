"""The GPU check script's parts that need no GPU: its options, its shapes, and its message without CUDA."""

import pytest
import torch

from scripts import gpu_check


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
