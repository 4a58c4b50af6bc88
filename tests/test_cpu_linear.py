"""The CPU linear layers: the same products as nn.Linear (streamed, packed from 4 rows), close ones (int8 head),
and where they go."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from safe_engine.contract.errors import ModelLoadError
from safe_engine.models.cpu_linear import (
    PACKED_FROM_ROWS,
    Int8WeightLinear,
    StreamedLinear,
    install_cpu_linear,
    packing_available,
)
from safe_engine.models.loading import LoadOptions, load_model
from tests.tiny_models import tiny_model_folder, unigram_tokenizer


@pytest.mark.parametrize("shape", [(7,), (1, 7), (1, 1, 7), (3, 7), (2, 5, 7), (1, 40, 7)])
@pytest.mark.parametrize("bias", [True, False])
def test_streamed_linear_computes_what_nn_linear_computes(shape, bias):
    torch.manual_seed(0)
    reference = nn.Linear(7, 11, bias=bias)
    streamed = nn.Linear(7, 11, bias=bias)
    streamed.load_state_dict(reference.state_dict())
    streamed.__class__ = StreamedLinear
    x = torch.randn(shape)
    out = streamed(x)
    assert out.shape == reference(x).shape == (*shape[:-1], 11)
    torch.testing.assert_close(out, reference(x), rtol=1e-5, atol=1e-6)


def test_a_single_row_is_padded_not_changed():
    """One row goes through the two-row product; its answer is the first row's, not the padding's."""
    torch.manual_seed(1)
    layer = nn.Linear(16, 32)
    layer.__class__ = StreamedLinear
    x = torch.randn(1, 16)
    torch.testing.assert_close(layer(x)[0], layer(torch.cat([x, torch.randn(1, 16)]))[0], rtol=1e-5, atol=1e-6)


needs_packing = pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN linear")


def _packed_layer(bias: bool) -> tuple[StreamedLinear, nn.Linear]:
    torch.manual_seed(3)
    reference = nn.Linear(96, 200, bias=bias)
    layer = nn.Linear(96, 200, bias=bias)
    layer.load_state_dict(reference.state_dict())
    layer.__class__ = StreamedLinear
    layer.pack()
    return layer, reference


@needs_packing
@pytest.mark.parametrize("rows", [PACKED_FROM_ROWS, 16, 45])
@pytest.mark.parametrize("bias", [True, False])
def test_packed_rows_compute_what_nn_linear_computes(rows, bias):
    layer, reference = _packed_layer(bias)
    x = torch.randn(1, rows, 96)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), reference(x), rtol=1e-5, atol=1e-5)


@needs_packing
def test_the_packed_copy_serves_from_3_rows_with_gradients_off_only():
    """Pointing the packed copy at other weights shows which form answered each call."""
    layer, _ = _packed_layer(bias=False)
    plain = layer.weight.detach().clone()
    other = torch.randn_like(plain)
    layer.packed = torch.ops.mkldnn._reorder_linear_weight(other, 8)
    for rows in (1, 2, PACKED_FROM_ROWS - 1, PACKED_FROM_ROWS, 9):
        x = torch.randn(rows, 96)
        with torch.inference_mode():
            expected = x @ (other if rows >= PACKED_FROM_ROWS else plain).T
            torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
        with torch.enable_grad():  # autograd cannot go through oneDNN's product: the plain form answers
            torch.testing.assert_close(layer(x).detach(), x @ plain.T, rtol=1e-5, atol=1e-5)


@needs_packing
def test_install_packs_the_streamed_layers_but_not_an_int8_head_nor_the_state_dict(tmp_path):
    for mode in ("streamed", "int8-head"):
        lm = load_model(str(_folder(tmp_path)), LoadOptions(device="cpu", cpu_linear=mode))
        streamed = [m for m in lm.model.modules() if isinstance(m, StreamedLinear)]
        assert streamed and all(m.packed is not None for m in streamed)
        assert isinstance(lm.model.get_output_embeddings(), Int8WeightLinear if mode == "int8-head" else StreamedLinear)
        assert not any("packed" in key for key in lm.model.state_dict())


def test_int8_weights_keep_the_products_close_and_the_argmax():
    torch.manual_seed(2)
    head = nn.Linear(64, 500, bias=False)
    quantized = Int8WeightLinear(head)
    assert quantized.weight_int8.dtype == torch.int8 and quantized.scales.shape == (500,)
    x = torch.randn(4, 3, 64)
    exact, close = head(x), quantized(x)
    assert close.dtype == x.dtype and close.shape == exact.shape
    assert (close - exact).abs().max() < 0.03 * exact.abs().max()
    assert torch.equal(close.argmax(-1), exact.argmax(-1))


def _folder(tmp_path):
    return tiny_model_folder(tmp_path / "m", unigram_tokenizer(["the", "cat"]))


def _linear_types(model) -> set[type]:
    return {type(m) for m in model.modules() if isinstance(m, nn.Linear | Int8WeightLinear)}


def test_streamed_linears_compute_what_transformers_layers_compute(tmp_path):
    folder = _folder(tmp_path)
    streamed = load_model(str(folder), LoadOptions(device="cpu", cpu_linear="streamed"))
    plain = load_model(str(folder), LoadOptions(device="cpu", cpu_linear="torch"))
    assert _linear_types(streamed.model) == {StreamedLinear}
    assert _linear_types(plain.model) == {nn.Linear}
    assert streamed.describe()["cpu_linear"] == "streamed" and plain.describe()["cpu_linear"] == "torch"
    ids = torch.tensor([[3, 5, 7, 9, 4]])
    with torch.inference_mode():
        torch.testing.assert_close(streamed.model(ids).logits, plain.model(ids).logits, rtol=1e-4, atol=1e-5)


def test_cpu_models_load_all_fp32_streamed_by_default_and_say_they_are_exact(tmp_path):
    lm = load_model(str(_folder(tmp_path)), LoadOptions(device="cpu"))
    assert lm.describe()["cpu_linear"] == "streamed" and lm.describe()["approximate"] is False
    assert _linear_types(lm.model) == {StreamedLinear}


def test_an_int8_head_is_one_flag_away_and_says_its_tokens_may_differ(tmp_path):
    lm = load_model(str(_folder(tmp_path)), LoadOptions(device="cpu", cpu_linear="int8-head"))
    assert lm.describe()["cpu_linear"] == "int8-head" and lm.describe()["approximate"] is True
    assert isinstance(lm.model.get_output_embeddings(), Int8WeightLinear)
    body = {type(m) for name, m in lm.model.named_modules() if isinstance(m, nn.Linear)}
    assert body == {StreamedLinear}
    ids = torch.tensor([[3, 5, 7]])
    with torch.inference_mode():
        assert lm.model(ids).logits.shape[-1] == lm.model.config.vocab_size


def test_int8_dynamic_takes_precedence_and_says_so(tmp_path):
    lm = load_model(str(_folder(tmp_path)), LoadOptions(device="cpu", cpu_int8=True))
    assert lm.cpu_linear is None and lm.describe()["dtype"] == "int8" and lm.describe()["approximate"] is True
    assert StreamedLinear not in _linear_types(lm.model)


def test_an_unknown_mode_is_a_clear_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="--cpu-linear is one of streamed, torch, int8-head"):
        load_model(str(_folder(tmp_path)), LoadOptions(device="cpu", cpu_linear="fast"))


def test_install_leaves_other_dtypes_alone():
    model = nn.Sequential(nn.Linear(4, 4).to(torch.bfloat16), nn.Linear(4, 4))
    install_cpu_linear(model, "streamed")
    assert [type(m) for m in model] == [nn.Linear, StreamedLinear]
