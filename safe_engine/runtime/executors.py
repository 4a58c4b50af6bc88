"""Which executor serves a model, decided once when it loads: the KV-slot batching runtime where it gives the
model's own logits, else one run at a time on transformers' own cache, else a refusal with a message.

The KV slots (`kv_slots.py`) replace attention, so they hold a model exactly when every layer's state is
the keys and values its attention writes through transformers' attention interface. `runtime_path`
checks that in three steps, cheapest first:

1. the layer kinds transformers' cache would lay out for the model (`layer_types`): only full and
   sliding-window attention fit; a recurrent, convolution or linear-attention state (Qwen3-Next, Jamba,
   Falcon-H1), layers that reuse another layer's keys (Gemma 3n) or chunked attention (Llama 4) do not;
2. the attention goes through the interface: `install_slot_attention` finds what to wrap (Bloom's and
   GPT-J's modeling code has no attention function to wrap);
3. a probe: two rows fed in two passes each, the second at an offset as a decode step is, through the
   batching executor itself; every layer must write each row's slot in every pass (Falcon's attention code
   of its own writes none) and the logits must be the model's own full forward's (within `PROBE_TOLERANCE`:
   sums in another order pass; not compared under `--cpu-int8`, whose activations are quantized per pass).

A model that fails any step runs on its own cache (`own_cache.py`) if a probe of its own passes there: a start,
a continuation and a rollback, each pass's logits the model's own full forward's. A model that fails it too
(a forward that takes no cache; Mamba, whose cache steps one token at a time and gets a chunk wrong) is refused
with what stopped it. What decides is what the model does in these probes, never a parameter's name; how the
cache is handed to transformers, in each version it has, is `transformers_api.py`'s business.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..contract.errors import ModelLoadError, first_line
from .batching import ModelExecutor
from .own_cache import OwnCacheExecutor
from .scheduler import ActiveRun, Request, Scheduler, SlotExecutor
from .transformers_api import UnsupportedTransformers, layer_types
from .weights import Weights

KV_SLOTS = "kv-slots"
OWN_CACHE = "own-cache"
SLOT_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})
# Largest |difference| from the model's own forward, relative to its largest |logit|, that the probe accepts.
# Measured on the tiny models of tests/architectures.py: 0 to 5e-7 in fp32 (sums in another order), 0 in bf16;
# rows given wrong positions in a shared pass: 0.99.
PROBE_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 0.05, torch.float16: 0.05}
_PROBE_ROWS = ([5, 9, 14, 20, 27, 35, 44], [6, 11, 17, 24])  # taken modulo the vocabulary (`_probe_rows`)
_PROBE_SPLITS = (4, 2)  # each row's first pass feeds this many ids, the second the rest
_OWN_CACHE_PASSES = ((0, 3), (3, 5), (4, 7))  # [begin, end) of the first row's ids: a start, two more, a rollback


@dataclass(frozen=True)
class RuntimePath:
    """How a loaded model computes: `name` is KV_SLOTS or OWN_CACHE; `reason` says why not the KV slots."""

    name: str = KV_SLOTS
    reason: str = ""


def model_executor(scheduler: Scheduler, weights: Weights, path: RuntimePath) -> SlotExecutor:
    """The scheduler's executor for the weights (made on first use), of the kind the path names."""
    kind = OwnCacheExecutor if path.name == OWN_CACHE else ModelExecutor
    return scheduler.executor(weights.module, lambda: kind(scheduler, weights))


def runtime_path(weights: Weights) -> RuntimePath:
    """The path the weights take (module docstring); raises ModelLoadError for a model no path runs."""
    config = getattr(weights.module, "config", None)
    if getattr(config, "_attn_implementation", None) is None:
        return RuntimePath()  # not a transformers model (scripted test models read the slots themselves)
    reason = _slot_misfit(weights)
    if reason is None:
        return RuntimePath()
    try:
        _probe_own_cache(weights)
    except UnsupportedTransformers:
        raise  # the library's change, not the model's
    except Exception as exc:
        raise ModelLoadError(f"{weights.name} cannot run here ({reason}; on its own cache: {first_line(exc)})") from exc
    return RuntimePath(OWN_CACHE, reason)


def _slot_misfit(weights: Weights) -> str | None:
    """Why the KV slots cannot hold the model, or None when they give its own logits (steps 1-3)."""
    config = weights.module.config
    kinds = layer_types(config)
    others = sorted(set(kinds) - SLOT_LAYER_TYPES)
    if others:
        return f"its layers of kind {', '.join(others)} keep what the KV slots do not hold"
    original = config._attn_implementation
    try:
        reason = _probe_slots(weights, len(kinds))
    except UnsupportedTransformers:
        raise
    except Exception as exc:  # the attention cannot be wrapped, or the model fails inside a batched pass
        reason = first_line(exc)
    if reason is not None:
        config._attn_implementation = original  # its own attention back, as loaded
    return reason


def _probe_slots(weights: Weights, layers: int) -> str | None:
    scheduler = Scheduler()  # the probe's own: no run in the process sees it
    executor = ModelExecutor(scheduler, weights)
    rows = _probe_rows(weights)
    slots = [executor.take_slot()[0] for _ in rows]
    for second in (False, True):
        batch = []
        for ids, split, slot in zip(rows, _PROBE_SPLITS, slots):
            begin, end = (split, len(ids)) if second else (0, split)
            batch.append(Request(ActiveRun(scheduler), slot, begin, ids[begin:end], list(range(end - begin))))
        executor.run_pass(batch)
        written = [slot.layers_written for slot in slots]
        if written != [layers] * len(slots):
            return f"its attention wrote the KV slots in {min(written)} of its {layers} layers"
    for ids, split, request in zip(rows, _PROBE_SPLITS, batch):
        reason = _unlike_own_forward(weights, ids[:split], ids[split:], request.logits, "through the KV slots")
        if reason is not None:
            return reason
    return None


def _probe_own_cache(weights: Weights) -> None:
    """Feed a few ids, continue with two more, roll back one and feed three on transformers' cache, as a run
    does; raises if the model cannot, or if any pass's logits are not its own full forward's (a state-space
    model's cache that only steps one token at a time gets a chunk wrong)."""
    scheduler = Scheduler()
    executor = OwnCacheExecutor(scheduler, weights)
    state, _ = executor.take_slot()
    ids = _probe_rows(weights)[0]
    try:
        for begin, end in _OWN_CACHE_PASSES:
            request = Request(ActiveRun(scheduler), state, begin, ids[begin:end], list(range(end - begin)))
            executor.run_pass([request])
            reason = _unlike_own_forward(weights, ids[:begin], ids[begin:end], request.logits, "on its own cache")
            if reason is not None:
                raise RuntimeError(reason)
    finally:
        executor.release(state)


def _unlike_own_forward(weights: Weights, before: list[int], fed: list[int], logits, path: str) -> str | None:
    """Why `logits` (one row per id of `fed`, after `before`) are not the model's own full forward's, or None."""
    if weights.int8:  # activations quantized per pass: a row's logits depend on what shares it, by design
        return None
    tolerance = PROBE_TOLERANCE.get(next(weights.module.parameters()).dtype, max(PROBE_TOLERANCE.values()))
    with torch.inference_mode():
        own = weights.module(torch.tensor([before + fed], device=weights.device)).logits[0, len(before) :].float().cpu()
    finite = torch.isfinite(own)  # rows past the tokenizer are -inf in both (loading.py masks them)
    if not torch.equal(finite, torch.isfinite(logits)):
        return f"its logits {path} are not finite where its own forward's are"
    worst = float((logits - own)[finite].abs().max() / own[finite].abs().max())
    if not worst <= tolerance:
        return f"its logits {path} differ from its own forward's (by {worst:.2g} of the largest)"
    return None


def _probe_rows(weights: Weights) -> list[list[int]]:
    """The probe's ids inside the model's vocabulary (a test model's may hold 30 tokens)."""
    size = weights.tokens
    return [[i % size for i in row] for row in _PROBE_ROWS]
