"""transformers' cache and attention API as the installed version offers it: the one place the runtime touches it.

Versions the package admits differ, and each difference is found here by looking at what the installed version
has, never by comparing version strings:

- the keyword a causal LM's `forward` takes its cache by, and the output field it returns it in: `cache` from
  transformers 5.24, `past_key_values` before it (state-space models said `cache_params`). A model's own
  `forward` (remote code written for another version) may declare either; the one it declares is used.
- the cache `generate` would make for a model (`_supports_default_dynamic_cache` may go), the layer kinds its
  config lays out, the attention and mask interfaces the KV slots register with.

Only a cache whose every layer is a plain growing `DynamicLayer` is cropped: 5.24's `is_croppable` flag is not
trusted, since its sliding-window layers claim it and then refuse a crop past the window.

A version missing one of these gets `UnsupportedTransformers`, whose message names the version and what it
lacks, so a refused model is never blamed for the library's change.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache

from ..contract.errors import ModelLoadError

CACHE_NAMES = ("cache", "past_key_values", "cache_params")  # every name transformers has used, newest first


class UnsupportedTransformers(ModelLoadError):
    """The installed transformers lacks a piece of API the runtime needs (the message says which)."""


def version() -> str:
    import transformers

    return transformers.__version__


def _missing(what: str) -> UnsupportedTransformers:
    return UnsupportedTransformers(f"transformers {version()} {what}; this version is not supported")


@cache
def installed_cache_name() -> str:
    """The cache's name in this version's causal-LM outputs (and so in its models' `forward`)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    fields = {field.name for field in dataclasses.fields(CausalLMOutputWithPast)}
    for name in CACHE_NAMES:
        if name in fields:
            return name
    raise _missing(f"names a causal LM's cache none of {', '.join(CACHE_NAMES)} (its outputs hold {sorted(fields)})")


def cache_keyword(model) -> str:
    """The keyword `model.forward` takes its cache by: the one its signature declares, else the installed
    version's (a `forward(**kwargs)` hands it on). Raises TypeError for a forward that takes no cache."""
    installed = installed_cache_name()  # first: a version that renamed it again is the library's change
    parameters = inspect.signature(model.forward).parameters
    for name in CACHE_NAMES:
        if name in parameters:
            return name
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return installed
    raise TypeError(f"{type(model).__name__}.forward takes no cache (no argument named {', '.join(CACHE_NAMES)})")


def returned_cache(output):
    """The cache a forward pass returned (None if it returned none)."""
    keys = set(output.keys()) if hasattr(output, "keys") else set(vars(output))
    for name in CACHE_NAMES:
        if name in keys:
            return output[name] if hasattr(output, "keys") else getattr(output, name)
    return None


def layer_types(config) -> list[str]:
    """The kind of each layer transformers' cache lays out for the model ("full_attention", "sliding_attention",
    "conv", "linear_attention", ...)."""
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs
    except ImportError:
        raise _missing("has no cache_utils.get_layer_types_and_kwargs") from None
    types, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    return list(types)


def fresh_cache(model):
    """The cache `generate` would give this model: a `DynamicCache` laid out from its config, or None where the
    model makes its own (`_supports_default_dynamic_cache`, absent in a version that lets every model take one)."""
    from transformers import DynamicCache

    supports = getattr(model, "_supports_default_dynamic_cache", None)
    if supports is not None and not supports():
        return None
    return DynamicCache(config=model.config.get_text_config(decoder=True))


def croppable(cache) -> bool:
    """Whether the cache can drop its last positions exactly: every layer a plain growing `DynamicLayer`."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    return isinstance(cache, DynamicCache) and all(type(layer) is DynamicLayer for layer in cache.layers)


@dataclass(frozen=True)
class AttentionApi:
    """What the KV slots register their attention with: the attention and mask interfaces, the mask function of
    each implementation, and SDPA's attention."""

    attention: type
    masks: type
    mask_functions: Mapping[str, Callable]
    sdpa: Callable


@cache
def attention_api() -> AttentionApi:
    try:
        from transformers import AttentionInterface
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    except ImportError as exc:
        raise _missing(f"lacks the attention interface the batched runtime registers with ({exc})") from None
    return AttentionApi(
        AttentionInterface, AttentionMaskInterface, ALL_MASK_ATTENTION_FUNCTIONS, sdpa_attention_forward
    )
