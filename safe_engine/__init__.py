"""SAFE engine: token-level ensembling of LLMs with different tokenizers (no UI imports here)."""

from .compare import load_models, run_comparison, summarize
from .decoding import DecodeConfig, decode
from .ensemble import EnsembleConfig
from .errors import ConfigError, ModelLoadError, ModelSpecError, SafeEngineError
from .many_runs import DecodeRequest, RunHandle, decode_ahead, decode_many
from .models import DEFAULT_MODELS, LoadedModel, LoadOptions, load_model, load_tokenizer

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
