"""The run form → model specs and a DecodeConfig, checked before anything loads so bad input fails fast."""

from __future__ import annotations

import re

from safe_engine.decoding import DecodeConfig
from safe_engine.ensemble import EnsembleConfig
from safe_engine.errors import ConfigError
from safe_engine.models import resolve_spec

MAX_PROMPT_CHARS = 4000
MAX_NEW_TOKENS = 512  # the engine allows more; on a CPU 512 tokens already take minutes


def parse_specs(text: str) -> list[str]:
    """One spec per line or comma-separated."""
    return [s.strip() for s in re.split(r"[,\n]", text or "") if s.strip()]


def build(prompt: str, models_text: str, drafter: str | None, strategy: str, max_new_tokens, lookahead, top_k,
          sharpen: str, sharpen_lambda, method: str, safe_mode: str) -> tuple[list[str], DecodeConfig]:
    """Raise a SafeEngineError subclass whose message the page can show as is."""
    if not (prompt or "").strip():
        raise ConfigError("the prompt is empty: type one or pick an example")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ConfigError(f"the prompt is {len(prompt)} characters; the limit here is {MAX_PROMPT_CHARS}")
    return decoding(models_text, drafter, strategy, max_new_tokens, lookahead, top_k, sharpen, sharpen_lambda, method, safe_mode)


def decoding(models_text: str, drafter: str | None, strategy: str, max_new_tokens, lookahead, top_k,
             sharpen: str, sharpen_lambda, method: str, safe_mode: str) -> tuple[list[str], DecodeConfig]:
    """The form without a prompt: the Benchmark tab's prompts come from task files."""
    specs = parse_specs(models_text)
    if not specs:
        raise ConfigError("no models given: type at least one model spec")
    for spec in specs:
        resolve_spec(spec)
    if drafter and drafter not in specs:
        raise ConfigError(f"the drafter {drafter} is not one of the models")
    if max_new_tokens is None or max_new_tokens != int(max_new_tokens) or not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise ConfigError(f"max new tokens must be a whole number from 1 to {MAX_NEW_TOKENS}")
    ensemble = EnsembleConfig(method=method, top_k=int(top_k), sharpen=sharpen, sharpen_lambda=float(sharpen_lambda))
    config = DecodeConfig(strategy, int(max_new_tokens), int(lookahead), specs.index(drafter) if drafter else 0, safe_mode, ensemble)
    config.validate(len(specs))
    return specs, config
