"""The run form by name: `RunSettings` holds what the Live tab's form says, `Form` the components that say
it, and `build` / `decoding` turn it into model specs and a checked DecodeConfig before anything loads.

Each field is named after its row of the engine's option table (`safe_engine.options.OPTIONS`): the widgets take
their label, range and help from the row (`option_widgets.py`), and `decoding` hands the values to the same
`parse_options` the command line's mapping readers, the server and lm-eval use, so the app builds no
`DecodeConfig` of its own. Adding a decoding option to the form is a field here and a widget in the Live tab;
`Form` refuses a missing or unknown one.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import dataclass, fields

from safe_engine.contract.errors import ConfigError
from safe_engine.options import OPTIONS, Option, options_from_mapping, parse_options
from safe_engine.strategies.decoding import DecodeConfig

MAX_PROMPT_CHARS = 4000
MAX_NEW_TOKENS = int(OPTIONS["max_new_tokens"].bounds[1])
TOGGLES = {"auto": None, "on": True, "off": False}  # a toggle option's three states: its default, on, off
NOT_IN_THE_FORM = {  # options the app takes elsewhere, and where
    "devices": "a launch flag (python app.py --devices ...)",
    "dtype": "a launch flag",
    "cpu_linear": "a launch flag",
    "cpu_int8": "a launch flag",
    "trust_remote_code": "a launch flag",
    "no_chat_template": "a launch flag",
    "placement": "a spec: ray:SPEC in the Models box puts that model in a Ray actor",
    "ray_address": "Ray's own RAY_ADDRESS environment variable, read when the app starts a ray: model",
}


@dataclass(frozen=True)
class RunSettings:
    """The form's values as Gradio hands them over (numbers may be floats or None; None or an empty box is the
    option's default), in the form's order, which is also the order of the `generate` API's parameters after
    the prompt. Each field is the option of the same name."""

    models: str  # one spec per line, or comma-separated
    drafter: str | None
    strategy: str
    max_new_tokens: float | None
    lookahead: float | None
    top_k: float | None
    sharpen: str
    sharpen_lambda: float | None
    ensemble_method: str
    safe_mode: str
    draft_gate: float | None
    per_token_commit: str
    gate: str  # a TOGGLES key
    temperature: float | None
    top_p: float | None
    seed: float | None
    stop: str  # stop sequences, one per line, with \n, \t and \\ written as escapes (`stop_sequences`)
    weights: str  # one per model, in the models' order, spaces or commas between; empty: equal weights
    damage_kl_steps: float | None
    overlap: str  # a TOGGLES key
    consensus_threshold: float | None
    byte_combine: str
    core_score: str
    core_beta: float | None
    core_alpha: float | None
    eva_top: float | None
    eva_drop: float | None
    core_space: str  # last: a new field goes at the end, so API clients' positions hold

    @staticmethod
    def defaults(specs: Sequence[str], strategy: str = "safe", max_new_tokens: int = 48) -> RunSettings:
        """The form as it opens (the option table's defaults) for these models: what a `generate` API client
        sends, as `astuple(...)` after the prompt."""
        values = {name: form_value(OPTIONS[name]) for name in FIELDS}
        values |= {"models": "\n".join(specs), "drafter": specs[0], "strategy": strategy}
        return RunSettings(**values | {"max_new_tokens": max_new_tokens})


FIELDS = tuple(f.name for f in fields(RunSettings))


def form_value(option: Option) -> object:
    """An option's default as its widget holds it."""
    if option.kind == "toggle":
        return "auto"
    if option.kind in ("values", "append"):
        return ""
    return option.default


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
    """The form without a prompt (the Benchmark tab's prompts come from task files), checked by the option
    table's own reader."""
    _, config = parse_options(_given(s))
    return parse_specs(s.models), config


def options(s: RunSettings) -> argparse.Namespace:
    """The form's options as the option table reads them, unchecked (what a sweep's grid points start from)."""
    return options_from_mapping(_given(s))


def _given(s: RunSettings) -> dict[str, object]:
    if not parse_specs(s.models):
        raise ConfigError("no models given: type at least one model spec")
    given = {name: _read(OPTIONS[name], getattr(s, name)) for name in FIELDS}
    return {name: value for name, value in given.items() if value is not None}


def _read(option: Option, value: object) -> object:
    """A widget's value as the option table's reader takes it; None (an empty box) leaves the default."""
    if value is None or value == "":
        return None
    if option.kind == "toggle":
        return TOGGLES[value]
    if option.name == "models":
        return parse_specs(value)
    if option.name == "stop":
        return list(stop_sequences(value))
    if option.kind == "values":
        return re.split(r"[,\s]+", str(value).strip())
    if option.type in (int, float):
        low, high = option.bounds or (None, None)
        whole = option.type is int
        if (whole and value != int(value)) or (low is not None and value < low) or (high is not None and value > high):
            raise ConfigError(f"{option.label}: {bounds_text(option)}")
        return option.type(value)
    return value


def bounds_text(option: Option) -> str:
    """What a numeric option's widget takes, in words ("a whole number from 1 to 512")."""
    low, high = option.bounds or (None, None)
    what = "a whole number" if option.type is int else "a number"
    if low is not None and high is not None:
        return f"{what} from {low:g} to {high:g}"
    return f"{what} ≥ {low:g}" if low is not None else what


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def stop_sequences(text: str | None) -> tuple[str, ...]:
    """The form's stop box: one sequence per line, `\\n` a newline, `\\t` a tab and `\\\\` a backslash (a line
    cannot hold a newline itself)."""
    lines = (text or "").splitlines()
    return tuple(re.sub(r"\\([nt\\])", lambda m: _ESCAPES[m[1]], line) for line in lines if line)


def stop_text(sequences) -> str:
    """`stop_sequences`' inverse: the box's text for these sequences."""
    return "\n".join(s.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t") for s in sequences)
