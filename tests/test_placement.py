"""Per-model devices and dtypes (`placement.py`): what is checked before loading, and where models land."""

import pytest
import torch
from tiny_pair import tiny_pair_folders

from safe_engine import cli
from safe_engine.contract.errors import ModelLoadError
from safe_engine.models.cache import load_models
from safe_engine.models.loading import LoadOptions, load_model, parameter_count, pick_device
from safe_engine.models.placement import per_model, placed, spread


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    return tiny_pair_folders(tmp_path_factory.mktemp("pair"))


def test_one_value_applies_to_every_model_and_a_list_needs_one_per_model():
    assert per_model("cpu", 3, "device") == ["cpu"] * 3
    assert per_model(("cpu", "cuda:1"), 2, "device") == ["cpu", "cuda:1"]
    with pytest.raises(ModelLoadError, match=r"one dtype for all models or one per model \(3\), not 2"):
        per_model(("float32", "bfloat16"), 3, "dtype")


def test_spread_puts_the_largest_models_on_their_own_gpus_first():
    assert spread([8_000, 7_000], 2) == ["cuda:0", "cuda:1"]
    assert spread([1_000, 8_000, 7_000], 2) == ["cuda:1", "cuda:0", "cuda:1"]  # the two smaller ones share
    assert spread([5, 5, 5], 4) == ["cuda:0", "cuda:1", "cuda:2"]
    assert spread([5, 6], 1) == ["cuda:0", "cuda:0"]


def test_auto_spreads_over_the_visible_gpus_by_parameter_count(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    sizes = {"small": 1, "big": 9, "mid": 5}
    options = placed(list(sizes), LoadOptions(), lambda spec, _: sizes[spec])
    assert [o.device for o in options] == ["cuda:1", "cuda:0", "cuda:1"]
    pinned = placed(list(sizes), LoadOptions(device=("auto", "cuda:1", "auto")), lambda spec, _: sizes[spec])
    assert [o.device for o in pinned] == ["cuda:1", "cuda:1", "cuda:0"]  # only the auto ones are spread


def test_cuda_is_named_as_its_gpu_so_cuda_and_cuda_0_are_one_device(monkeypatch):
    """Executors key the scheduler's devices on a model's device name: `--devices cuda cuda:0` must give one."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert [pick_device(d) for d in ("cuda", "cuda:0", "auto", "cuda:1")] == ["cuda:0", "cuda:0", "cuda:0", "cuda:1"]
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)  # torch.cuda.set_device(1): "cuda" means that one
    assert pick_device("cuda") == "cuda:1"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_a_cuda_device_without_cuda_fails_before_loading(specs):
    with pytest.raises(ModelLoadError, match="CUDA is not available"):
        placed(specs, LoadOptions(device=("cpu", "cuda:1")), lambda spec, _: pytest.fail("nothing is counted"))


def test_each_model_loads_with_its_own_dtype_and_says_so(specs):
    models = load_models(specs, LoadOptions(device="cpu", dtype=("float32", "bfloat16")))
    assert [(m.describe()["device"], m.describe()["dtype"]) for m in models] == [
        ("cpu", "float32"),
        ("cpu", "bfloat16"),
    ]
    assert next(models[1].model.parameters()).dtype == torch.bfloat16


def test_parameters_are_counted_without_loading_weights(specs):
    model = load_model(specs[0], LoadOptions(cpu_linear="streamed"))  # an int8 head holds buffers, not parameters
    assert parameter_count(specs[0]) == sum(p.numel() for p in model.model.parameters())


def test_load_model_takes_one_device_and_one_dtype(specs):
    with pytest.raises(ModelLoadError, match="one device and one dtype"):
        load_model(specs[0], LoadOptions(device=("cpu", "cpu")))


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--devices", "cpu", "cpu", "cpu"], "give one --devices for all models or one per model (2), not 3"),
        (["--dtype", "float32", "float16", "bfloat16"], "give one --dtype for all models or one per model (2), not 3"),
        (["--devices", "gpu0"], "unknown device 'gpu0'"),
        (["--dtype", "int4"], "invalid choice"),
    ],
)
def test_bad_placements_are_one_clear_error(specs, capsys, flags, message):
    assert cli.main(["generate", "--prompt", "hi", "--models", *specs, *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_the_cli_builds_per_model_load_options():
    args = cli.build_parser().parse_args(
        ["generate", "--prompt", "x", "--devices", "cpu", "cuda:1", "--dtype", "bfloat16"]
    )
    assert cli.load_options(args) == LoadOptions(device=("cpu", "cuda:1"), dtype=("bfloat16",))
    assert cli.build_parser().parse_args(["generate", "--prompt", "x", "--device", "cpu"]).devices == ["cpu"]
