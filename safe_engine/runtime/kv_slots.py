"""Per-run KV storage and the attention that reads it, so one forward pass can serve many runs.

A pass packs the new tokens of every row (run) into one sequence, without padding: the linear layers,
norms and rotary embeddings are per token, so only attention needs to know where a row starts and what
it has seen. Our attention function (registered with transformers' `AttentionInterface` and switched
on for the model) writes each row's new keys and values into that run's own `KVSlot`, at the run's own
offset, and attends that row alone over its slot, with a mask built in the row's logical positions:
causal, and for sliding-window layers (Gemma 3) the window. Rolling a run back only shortens its slot.

With one row the pass is the batch-1 computation: the same input shape, the same masks as
transformers builds for a `DynamicCache` below the sliding window (none when one query token sees
everything, `is_causal` from an empty cache), the same attention kernel. Called without a batch (a
plain `model(ids)`), the function is the model's original attention, with the original masks.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .transformers_api import attention_api

GROW_BY = 256  # positions a slot grows by when it runs out of room
_PREFIX = "safe-slots-"


class KVSlot:
    """One run's keys and values for every layer of one model: [kv heads, capacity, head dim] buffers
    holding positions 0..length-1; grown in steps of `GROW_BY`, never past what the run has asked for."""

    def __init__(self):
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.length = 0
        self.layers_written = 0  # layers that wrote into the slot during the current pass
        self.ids: list[int] = []  # a free slot's tokens at positions 0..length-1 (set when its run closes)

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor, at: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Store keys/values [kv heads, count, head dim] at positions at..at+count-1 of `layer`; returns
        views of the layer's keys and values for positions 0..at+count-1."""
        end = at + keys.shape[1]
        if layer == len(self.layers):
            self.layers.append((_empty_like(keys, end), _empty_like(values, end)))
        stored_k, stored_v = self.layers[layer]
        if stored_k.shape[1] < end:
            stored_k, stored_v = _grown(stored_k, end, at), _grown(stored_v, end, at)
            self.layers[layer] = stored_k, stored_v
        stored_k[:, at:end] = keys
        stored_v[:, at:end] = values
        self.layers_written += 1
        return stored_k[:, :end], stored_v[:, :end]

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _empty_like(states: torch.Tensor, length: int) -> torch.Tensor:
    capacity = -(-length // GROW_BY) * GROW_BY
    return states.new_empty((states.shape[0], capacity, states.shape[2]))


def _grown(stored: torch.Tensor, length: int, keep: int) -> torch.Tensor:
    bigger = _empty_like(stored, length)
    bigger[:, :keep] = stored[:, :keep]
    return bigger


@dataclass(frozen=True)
class SlotRow:
    """One run's part of a packed pass: its slot, the logical position of its first new token, and the
    range of its new tokens in the packed sequence."""

    slot: KVSlot
    offset: int
    begin: int
    end: int

    @property
    def count(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class SlotBatch:
    """The rows of one pass, passed to the model as the `slot_batch` keyword (it reaches attention)."""

    rows: Sequence[SlotRow]


def row_mask(offset: int, count: int, window: int | None, is_causal_ok: bool) -> tuple[int, torch.Tensor | None]:
    """(first key position, boolean mask [1, 1, count, keys] or None) for `count` queries at logical
    positions offset..offset+count-1 over keys 0..offset+count-1.

    A key is visible when it is not in the future and, with a sliding `window`, less than `window`
    positions back (transformers' rule); keys no query can see are cut off instead of masked. None means
    every key is visible to every query, or (`is_causal_ok`: the kernel applies causality itself) a
    plain causal square from position 0.
    """
    first = 0 if window is None else max(0, offset - window + 1)
    keys = offset + count - first
    if count == 1 or (is_causal_ok and offset == 0 and (window is None or count <= window)):
        return first, None
    query = torch.arange(offset, offset + count)[:, None]
    key = torch.arange(first, first + keys)[None, :]
    visible = key <= query
    if window is not None:
        visible &= query - key < window
    return first, visible[None, None]


def _slot_attention(base, sdpa: bool, module, query, key, value, attention_mask, slot_batch=None, **kwargs):
    """`base`: the model's own attention, SDPA (`sdpa`: boolean masks, `is_causal` for a square from 0)
    or eager (additive float masks). Without a batch, it is called as transformers would."""
    if slot_batch is None:
        return base(module, query, key, value, attention_mask, **kwargs)
    window = kwargs.get("sliding_window")
    outputs = []
    for row in slot_batch.rows:
        span = slice(row.begin, row.end)
        keys, values = row.slot.write(module.layer_idx, key[0, :, span], value[0, :, span], row.offset)
        first, mask = row_mask(row.offset, row.count, window, is_causal_ok=sdpa)
        if mask is not None:
            mask = mask.to(query.device)
            if not sdpa:  # eager attention adds a float mask
                mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(
                    ~mask, torch.finfo(query.dtype).min
                )
        # A contiguous query keeps SDPA on its fused CPU kernel (a strided slice falls back to the math path).
        rows_query = query[:, :, span].contiguous()
        out, _ = base(module, rows_query, keys[None, :, first:], values[None, :, first:], mask, **kwargs)
        outputs.append(out)
    return torch.cat(outputs, dim=1), None


def install_slot_attention(model) -> None:
    """Route the model's attention through `_slot_attention` (once). Models outside transformers'
    attention interface (scripted test models) read `slot_batch` themselves, or fail the pass's check;
    `executors.runtime_path` keeps every other such model off the KV slots."""
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if current is None or current.startswith(_PREFIX):
        return
    api = attention_api()
    base_name = "eager" if current == "eager" else "sdpa"  # other kernels: sdpa per row (flash kernels on CUDA)
    if base_name == "eager":  # each family has its own eager function
        base, name = _eager_attention(model), f"{_PREFIX}eager-{type(model).__module__}"
    else:
        base, name = api.sdpa, _PREFIX + "sdpa"

    def attention(*args, **kwargs):
        return _slot_attention(base, base_name == "sdpa", *args, **kwargs)

    api.attention.register(name, attention)
    api.masks.register(name, api.mask_functions[base_name])
    config._attn_implementation = name


def _eager_attention(model):
    """The model family's own eager attention (Gemma's handles soft-capping), from its modeling module."""
    for module in model.modules():
        found = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
        if found is not None:
            return found
    raise ValueError(
        f"{type(model).__name__}'s attention does not go through transformers' attention interface "
        "(its modeling code has no eager attention function to wrap)"
    )
