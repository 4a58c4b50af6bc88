"""The run form by name: `RunSettings` holds what the Live tab's form says, `Form` the components that say
it, and `build` / `decoding` turn it into model specs and a checked DecodeConfig before anything loads.

Adding an option touches `RunSettings` (a field) and `decoding` (where it goes in the config); the Live tab
passes one component per field, and `Form` refuses a missing or unknown one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, fields

from safe_engine.contract.config import EnsembleConfig
from safe_engine.contract.errors import ConfigError
from safe_engine.models.specs import resolve_spec
from safe_engine.strategies.decoding import DecodeConfig

MAX_PROMPT_CHARS = 4000
MAX_NEW_TOKENS = 512  # the engine allows more; on a CPU 512 tokens already take minutes
GATES = {"auto": None, "on": True, "off": False}  # GaC's gate: "auto" is on for GaC only


@dataclass(frozen=True)
class RunSettings:
    """The form's values as Gradio hands them over (numbers may be floats or None), in the form's order,
    which is also the order of the `generate` API's parameters after the prompt."""

    models_text: str
    drafter: str | None
    strategy: str
    max_new_tokens: float | None
    lookahead: float
    top_k: float
    sharpen: str
    sharpen_lambda: float
    method: str
    safe_mode: str
    draft_gate: float | None
    per_token_commit: str
    gate: str
    temperature: float | None
    top_p: float
    seed: float | None
    stop: str  # stop sequences, one per line, with \n, \t and \\ written as escapes (`stop_sequences`)

    @staticmethod
    def defaults(specs: Sequence[str], strategy: str = "safe", max_new_tokens: int = 48) -> RunSettings:
        """The form as it opens (the engine's defaults) for these models: what a `generate` API client sends,
        as `astuple(...)` after the prompt."""
        c = DecodeConfig()
        e = c.ensemble
        return RunSettings(
            models_text="\n".join(specs),
            drafter=specs[0],
            strategy=strategy,
            max_new_tokens=max_new_tokens,
            lookahead=c.lookahead,
            top_k=e.top_k,
            sharpen=e.sharpen,
            sharpen_lambda=e.sharpen_lambda,
            method=e.method,
            safe_mode=c.safe_mode,
            draft_gate=c.draft_gate,
            per_token_commit=c.per_token_commit,
            gate="auto",
            temperature=c.temperature,
            top_p=c.top_p,
            seed=None,
            stop="",
        )


FIELDS = tuple(f.name for f in fields(RunSettings))


class Form:
    """The form's components by RunSettings field; `inputs` lists them in field order for an event, and
    `read` turns the values Gradio passes back into RunSettings."""

    def __init__(self, **components):
        if set(components) != set(FIELDS):
            raise TypeError(f"the form needs exactly the fields {FIELDS}, got {tuple(components)}")
        self.components = components
        self.inputs = [components[name] for name in FIELDS]

    @staticmethod
    def read(values: Sequence) -> RunSettings:
        return RunSettings(*values)


def parse_specs(text: str) -> list[str]:
    """One spec per line or comma-separated."""
    return [s.strip() for s in re.split(r"[,\n]", text or "") if s.strip()]


def build(prompt: str, settings: RunSettings) -> tuple[list[str], DecodeConfig]:
    """Raise a SafeEngineError subclass whose message the page can show as is."""
    if not (prompt or "").strip():
        raise ConfigError("the prompt is empty: type one or pick an example")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ConfigError(f"the prompt is {len(prompt)} characters; the limit here is {MAX_PROMPT_CHARS}")
    return decoding(settings)


def decoding(s: RunSettings) -> tuple[list[str], DecodeConfig]:
    """The form without a prompt (the Benchmark tab's prompts come from task files)."""
    specs = parse_specs(s.models_text)
    if not specs:
        raise ConfigError("no models given: type at least one model spec")
    for spec in specs:
        resolve_spec(spec)
    if s.drafter and s.drafter not in specs:
        raise ConfigError(f"the drafter {s.drafter} is not one of the models")
    length = s.max_new_tokens
    if length is None or length != int(length) or not 1 <= length <= MAX_NEW_TOKENS:
        raise ConfigError(f"max new tokens must be a whole number from 1 to {MAX_NEW_TOKENS}")
    if s.seed is not None and (s.seed != int(s.seed) or s.seed < 0):
        raise ConfigError("the seed must be a whole number ≥ 0, or empty for a fresh one")
    ensemble = EnsembleConfig(
        method=s.method,
        top_k=int(s.top_k),
        sharpen=s.sharpen,
        sharpen_lambda=float(s.sharpen_lambda),
        gate=GATES[s.gate],
    )
    config = DecodeConfig(
        strategy=s.strategy,
        max_new_tokens=int(length),
        lookahead=int(s.lookahead),
        drafter=specs.index(s.drafter) if s.drafter else 0,
        safe_mode=s.safe_mode,
        per_token_commit=s.per_token_commit,
        ensemble=ensemble,
        temperature=float(s.temperature or 0),
        top_p=float(s.top_p),
        seed=None if s.seed is None else int(s.seed),
        draft_gate=float(s.draft_gate or 0),
        stop=stop_sequences(s.stop),
    )
    config.validate(len(specs))
    return specs, config


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def stop_sequences(text: str | None) -> tuple[str, ...]:
    """The form's stop box: one sequence per line, `\\n` a newline, `\\t` a tab and `\\\\` a backslash (a line
    cannot hold a newline itself)."""
    lines = (text or "").splitlines()
    return tuple(re.sub(r"\\([nt\\])", lambda m: _ESCAPES[m[1]], line) for line in lines if line)


def stop_text(sequences) -> str:
    """`stop_sequences`' inverse: the box's text for these sequences."""
    return "\n".join(s.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t") for s in sequences)
