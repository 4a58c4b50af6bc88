"""Linear layers for decoding on a CPU, where a step is bound by reading the weights from memory.

A decode step multiplies a few rows (one per run, a handful of drafted tokens) by every weight matrix.
`nn.Linear` computes `x @ W.T`, which for one or two rows makes the BLAS pack or stream W slowly; the same
product written `(W @ x.T).T`, one row padded to two, is a plain GEMM over W's rows that streams W near the
memory's speed. From 3 rows on that GEMM is compute-bound, while oneDNN's product over a copy of W prepacked in
its blocked layout stays near the cost of reading W. So a streamed layer keeps both: the plain weight for 1–2
rows, the packed copy for 3 or more (batched decode steps, a verifier's chunk, a prompt), at the price of a
second copy of every fp32 matrix in memory (the figures: benchmarks/RESULTS.md, "CPU linear layers"). Sums run
in other orders, so logits move by ~1e-4 (a near-tie can flip); `--cpu-linear torch` keeps transformers' own
layers and memory.

`int8-head` adds weight-only int8 with per-row scales for the output layer (gpt-fast's
scheme: activations stay in bf16, so nothing is quantized on the fly; Gemma's 262k-row head is the
largest matrix of a step). It changes a few answers of the 40-item benchmark and keeps its accuracy
(`benchmarks/cpu_linear.py`, benchmarks/RESULTS.md); tokens may differ from the fp32 computation where
two candidates nearly tie, so it is opt-in: `--cpu-linear streamed`, the fp32 computation, is the default.
"""

from __future__ import annotations

import torch
from torch import nn


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """x as [rows, features], and whether a zero row was added (a single row is padded to two)."""
    flat = x.reshape(-1, x.shape[-1])
    if flat.shape[0] == 1:
        return torch.cat([flat, torch.zeros_like(flat)]), True
    return flat, False


PACKED_FROM_ROWS = 3  # at 2 rows the plain GEMM is mostly the faster, from 3 the packed copy (RESULTS.md)
_PACKED_FOR_ROWS = 8  # oneDNN's layout hint: a batched decode step's rows (4 to 16 run alike)


def packing_available() -> bool:
    """Whether this torch build has oneDNN's prepacked linear product (x86 and ARM builds with mkldnn)."""
    mkldnn = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(mkldnn, "_reorder_linear_weight")
        and hasattr(mkldnn, "_linear_pointwise")
    )


class StreamedLinear(nn.Linear):
    """`nn.Linear` with the same weights, computed as `(W @ x.T).T` for 1–2 rows and over `packed`, W in
    oneDNN's blocked layout (set by `pack`), for 3 or more with gradients off. The packed copy is a plain
    attribute, not a buffer: it never reaches a state dict or another device."""

    packed: torch.Tensor | None = None

    def pack(self) -> None:
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), _PACKED_FOR_ROWS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat, padded = _rows(x)
        if self.packed is not None and flat.shape[0] >= PACKED_FROM_ROWS and not torch.is_grad_enabled():
            out = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")
            return out.reshape(*x.shape[:-1], out.shape[-1])
        out = (self.weight @ flat.T).T
        if padded:
            out = out[:1]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], out.shape[-1])


class Int8WeightLinear(nn.Module):
    """Weights in int8 with one scale per output row (bf16, as the kernel takes them); inputs cast to bf16
    (the fast kernel's form); outputs, bf16 values, back in the input's dtype."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()
        scales = weight.abs().amax(dim=1).clamp(min=1e-12) / 127
        self.register_buffer("weight_int8", torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scales", scales.to(torch.bfloat16))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        out = torch._weight_int8pack_mm(flat, self.weight_int8, self.scales).to(x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], out.shape[-1])


def install_cpu_linear(model: nn.Module, mode: str) -> None:
    """Swap the model's fp32 `nn.Linear` layers for those of `mode` (one of `models.CPU_LINEAR_MODES`), in
    place, each with its packed copy where this torch build can pack. The weights are shared, so a head
    tied to the embeddings stays tied; int8-head gives the head int8 weights of its own (and no packed
    copy: its int8 product is the fastest up to 4 rows, and one form at every row count keeps a run's
    logits the same whatever it is batched with)."""
    if mode == "torch":
        return
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if mode == "int8-head" and isinstance(head, nn.Linear):
        model.set_output_embeddings(Int8WeightLinear(head))
    pack = packing_available()
    for module in model.modules():
        if type(module) is nn.Linear and module.weight.dtype == torch.float32:
            module.__class__ = StreamedLinear
            if pack:
                module.pack()
