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


GATES = {"auto": None, "on": True, "off": False}  # GaC's gate: "auto" is on for GaC only


def build(prompt: str, *form, **named) -> tuple[list[str], DecodeConfig]:
    """Raise a SafeEngineError subclass whose message the page can show as is."""
    if not (prompt or "").strip():
        raise ConfigError("the prompt is empty: type one or pick an example")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ConfigError(f"the prompt is {len(prompt)} characters; the limit here is {MAX_PROMPT_CHARS}")
    return decoding(*form, **named)


def decoding(
    models_text: str,
    drafter: str | None,
    strategy: str,
    max_new_tokens,
    lookahead,
    top_k,
    sharpen: str,
    sharpen_lambda,
    method: str,
    safe_mode: str,
    draft_gate,
    per_token_commit: str,
    gate: str,
    temperature,
    top_p,
    seed,
) -> tuple[list[str], DecodeConfig]:
    """The form without a prompt (the Benchmark tab's prompts come from task files), in the Live tab's order."""
    specs = parse_specs(models_text)
    if not specs:
        raise ConfigError("no models given: type at least one model spec")
    for spec in specs:
        resolve_spec(spec)
    if drafter and drafter not in specs:
        raise ConfigError(f"the drafter {drafter} is not one of the models")
    if max_new_tokens is None or max_new_tokens != int(max_new_tokens) or not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise ConfigError(f"max new tokens must be a whole number from 1 to {MAX_NEW_TOKENS}")
    if seed is not None and (seed != int(seed) or seed < 0):
        raise ConfigError("the seed must be a whole number ≥ 0, or empty for a fresh one")
    ensemble = EnsembleConfig(
        method=method, top_k=int(top_k), sharpen=sharpen, sharpen_lambda=float(sharpen_lambda), gate=GATES[gate]
    )
    config = DecodeConfig(
        strategy=strategy,
        max_new_tokens=int(max_new_tokens),
        lookahead=int(lookahead),
        drafter=specs.index(drafter) if drafter else 0,
        safe_mode=safe_mode,
        per_token_commit=per_token_commit,
        ensemble=ensemble,
        temperature=float(temperature or 0),
        top_p=float(top_p),
        seed=None if seed is None else int(seed),
        draft_gate=float(draft_gate or 0),
    )
    config.validate(len(specs))
    return specs, config
