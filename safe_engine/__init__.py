"""SAFE engine: token-level ensembling of LLMs with different tokenizers (no UI imports here).

The library in a few names (docs/architecture.md has the layers behind them)::

    from safe_engine import DecodeConfig, decode, load_models

    models = load_models(["embedded:gemma-3-270m", "embedded:smollm2-135m-instruct"])
    for event in decode(models, "Why is the sky blue?", DecodeConfig(strategy="safe")):
        print(event.to_json())

- models: `load_models` (loaded once per process), `load_model`, `load_tokenizer`, `LoadOptions`, `LoadedModel`,
  `DEFAULT_MODELS` (the embedded pair, offline).
- one run: `decode(models, prompt, config)` yields typed events (`safe_engine.contract.events`); `DecodeConfig`
  and `EnsembleConfig` say what it is asked to do; `decode_ahead` runs it in a thread of its own.
- many runs at once, sharing forward passes: `decode_many(requests)` with `DecodeRequest`s, each a `RunHandle`.
- comparisons: `run_comparison` (each model alone, per-token and SAFE on one prompt) and `summarize`.
- errors: every error meant for a person is a `SafeEngineError` (`ConfigError`, `ModelSpecError`,
  `ModelLoadError`).
"""

from . import (
    distributed,  # noqa: F401 -- registers the ``ray:`` model spec (Ray itself loads only when an actor starts)
    remote,  # noqa: F401 -- registers the ``openai:`` model spec (a model behind an OpenAI-compatible server)
)
from .contract.config import DecodeConfig, EnsembleConfig
from .contract.errors import ConfigError, ModelLoadError, ModelSpecError, SafeEngineError
from .models.cache import load_models
from .models.loading import LoadedModel, LoadOptions, load_model, load_tokenizer
from .models.specs import DEFAULT_MODELS
from .orchestration.comparison import run_comparison, summarize
from .orchestration.many_runs import DecodeRequest, RunHandle, decode_ahead, decode_many
from .strategies.decoding import decode

__all__ = [
    "DEFAULT_MODELS",
    "ConfigError",
    "DecodeConfig",
    "DecodeRequest",
    "EnsembleConfig",
    "LoadOptions",
    "LoadedModel",
    "ModelLoadError",
    "ModelSpecError",
    "RunHandle",
    "SafeEngineError",
    "decode",
    "decode_ahead",
    "decode_many",
    "load_model",
    "load_models",
    "load_tokenizer",
    "run_comparison",
    "summarize",
]
