"""Every front door's options, declared once: the command line, the OpenAI-compatible server, lm-eval's model and
the app take the same names, types, defaults and checks from here.

`DECODING_OPTIONS` lists the decoding options (`LOADING_OPTIONS` the loading ones among them) as `Option`s, and
`OPTIONS` every option by name: the app's form draws its widgets (label, range, help) from the same rows.
`add_decoding_options` turns them into command-line flags; `options_from_mapping` reads the same options from
key → value (lm-eval's ``--model_args``, a request's extra fields) with no command line in between: keys are the
option names with ``_`` or ``-`` (``top_k``, ``max-new-tokens``); a flag takes a boolean; a list (``models``,
``weights``, ``stop``) is a list or a string with ``|`` between items, because lm-eval splits ``--model_args`` on
commas. Either way, `decoding_config`, `load_options` and `model_specs` turn the options into the engine's
typed values, checked before any model loads.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .bench.grid import GridPoint
from .contract.config import (
    BYTE_COMBINES,
    CORE_SCORES,
    CORE_SPACES,
    METHODS,
    PER_TOKEN_COMMITS,
    SAFE_MODES,
    SHARPENING,
    STRATEGIES,
    DecodeConfig,
    EnsembleConfig,
)
from .contract.errors import ConfigError, SafeEngineError
from .distributed.ray_spec import RAY_PREFIX
from .models.loading import CPU_LINEAR_MODES, DTYPES, LoadOptions
from .models.specs import DEFAULT_MODELS, resolve_spec

DEFAULTS, ENSEMBLE = DecodeConfig(), EnsembleConfig()
LIST_SEPARATOR = "|"
SAFE_MODE_HELP = (
    "exact: the paper's loop, one ensemble per round and the rest of the draft dropped; fast: keep scanning "
    "a draft the ensemble confirmed (later positions see less lookahead text, so outputs can differ; the "
    "docs have the measured speed and differences)"
)
PER_TOKEN_COMMIT_HELP = (
    "first-subtoken: the drafter appends only its first sub-token of the ensemble's string, as UniTE "
    "does; full: its whole spelling (a gentler baseline)"
)
CPU_LINEAR_HELP = (
    "linear layers on the CPU: streamed (default: fp32, the same weights, faster products and a packed copy of "
    "them; the reference's tokens), torch (transformers' own fp32 layers, no second copy), int8-head (int8 "
    "weights for the output layer and bf16 logits: about 10%% faster, but tokens may differ from the reference "
    "where two candidates nearly tie); the docs have the measured speed, accuracy and memory"
)


class UsageError(SafeEngineError):
    """Options that do not parse or do not fit together: one line for the person (CLI, HTTP 400, UI banner)."""


class OptionParser(argparse.ArgumentParser):
    """A parser whose errors are one clear `UsageError` line instead of usage text and an exit."""

    def error(self, message):
        raise UsageError(message)


@dataclass(frozen=True)
class Option:
    """One option: its name (the attribute it sets), what it holds and its command-line spelling.

    kind: ``value`` (one value of `type`, within `choices` if given), ``values`` (one or more), ``append``
    (repeatable flag, one value each), ``flag`` (present or not) or ``toggle`` (``--x``/``--no-x``, None when
    neither is given). `label`, `bounds` and `step` are how a form shows it (the app's widgets): `bounds` is the
    range a form offers (None for no end), not a check; `DecodeConfig.validate` decides what runs."""

    name: str
    kind: str = "value"
    type: Callable[[str], object] = str
    default: object = None
    choices: Sequence[str] | None = None
    help: str | None = None
    metavar: str | None = None
    aliases: tuple[str, ...] = ()
    loading: bool = False  # how models load (shared with the app), not how a run decodes
    label: str | None = None  # a form's label; None: not in the app's form
    bounds: tuple[float | None, float | None] | None = None
    step: float | None = None

    @property
    def text(self) -> str:
        """The help as a reader sees it outside argparse (its %(default)s filled in, %% a percent sign)."""
        return (self.help or "") % {"default": self.default}

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        extra: dict = {"help": self.help}
        if self.kind == "flag":
            extra["action"] = "store_true"
        elif self.kind == "toggle":
            extra.update(action=argparse.BooleanOptionalAction, default=None)
        else:
            extra.update(type=self.type, default=self.default, choices=self.choices, metavar=self.metavar)
            if self.kind == "values":
                extra["nargs"] = "+"
            elif self.kind == "append":
                extra["action"] = "append"
        parser.add_argument(self.flag, *self.aliases, dest=self.name, **extra)

    def read(self, key: str, value: object) -> object:
        """`value` from a mapping, as the command line would have parsed it."""
        if self.kind in ("flag", "toggle"):
            return _boolean(key, value)
        if self.kind in ("values", "append"):
            return [self._one(key, item) for item in _items(value)]
        return self._one(key, value)

    def _one(self, key: str, value: object) -> object:
        """The command line's own words for a bad value, so every front door says the same."""
        try:
            converted = self.type(value)
        except (TypeError, ValueError):
            raise UsageError(f"argument {self.flag}: invalid {self.type.__name__} value: {value!r}") from None
        if self.choices is not None and converted not in self.choices:
            choices = ", ".join(map(repr, self.choices))
            raise UsageError(f"argument {self.flag}: invalid choice: {value!r} (choose from {choices})")
        return converted


LOADING_OPTIONS = (
    Option(
        "cpu_int8",
        "flag",
        help="int8 weights and activations on the CPU: faster, less accurate, tokens differ from the reference",
        loading=True,
    ),
    Option("cpu_linear", default="streamed", choices=CPU_LINEAR_MODES, help=CPU_LINEAR_HELP, loading=True),
    Option(
        "devices",
        "values",
        default=["auto"],
        metavar="DEVICE",
        aliases=("--device",),
        help="one for all models or one per model: auto (several GPUs: spread by size; else cuda, mps or cpu), "
        "cpu, cuda, cuda:N, mps",
        loading=True,
    ),
    Option(
        "dtype",
        "values",
        default=["auto"],
        choices=DTYPES,
        help="one for all models or one per model (auto: bfloat16 or float16 on a GPU, float32 on the CPU)",
        loading=True,
    ),
    Option("trust_remote_code", "flag", help="allow model code from the model folder", loading=True),
    Option("no_chat_template", "flag", help="plain-text prompts for every model", loading=True),
)

STRATEGY = Option("strategy", default="safe", choices=STRATEGIES, label="Strategy")

DECODING_OPTIONS = (
    Option(
        "models",
        "values",
        default=list(DEFAULT_MODELS),
        metavar="SPEC",
        help="embedded:NAME, a local folder, a .gguf file or a hub id (default: the embedded pair)",
        label="Models (one spec per line)",
    ),
    Option("drafter", metavar="SPEC", help="which of the models drafts (default: the first)", label="Drafter"),
    Option(
        "max_new_tokens",
        type=int,
        default=DEFAULTS.max_new_tokens,
        label="Max new tokens",
        bounds=(1, 512),  # the engine takes more; on a CPU 512 tokens already take minutes
        step=1,
    ),
    Option(
        "lookahead",
        type=int,
        default=DEFAULTS.lookahead,
        help="drafted tokens per SAFE round (n)",
        label="Lookahead n",
        bounds=(1, 16),
        step=1,
    ),
    Option(
        "top_k",
        type=int,
        default=ENSEMBLE.top_k,
        help="each model's candidates in the union",
        label="Top-k per model",
        bounds=(1, 50),
        step=1,
    ),
    Option("ensemble_method", default=ENSEMBLE.method, choices=METHODS, label="Ensemble method"),
    Option(
        "gate",
        "toggle",
        help="GaC's gate: ensemble only where the drafter's top p < 0.5 (default: on for gac, as the paper runs it)",
        label="GaC's gate",
    ),
    Option(
        "sharpen",
        default=ENSEMBLE.sharpen,
        choices=SHARPENING,
        help="how the ensemble's distribution is sharpened when its max p < 0.5",
        label="Sharpening",
    ),
    Option(
        "sharpen_lambda",
        type=float,
        default=ENSEMBLE.sharpen_lambda,
        help="the heuristic sharpening's λ",
        label="Heuristic λ",
        bounds=(0.01, 0.99),
        step=0.01,
    ),
    Option(
        "core_score",
        default=ENSEMBLE.core_score,
        choices=CORE_SCORES,
        help="CoRE: how a model's distance to the models' mean scores a token (rbf: the paper's default)",
        label="CoRE score",
    ),
    Option(
        "core_beta",
        type=float,
        default=ENSEMBLE.core_beta,
        help="CoRE: the rbf score's sharpness β (the paper's %(default)s)",
        label="CoRE β",
        bounds=(0.1, 20),
        step=0.1,
    ),
    Option(
        "core_alpha",
        type=float,
        default=ENSEMBLE.core_alpha,
        help="CoRE: the power score's exponent α (the paper's %(default)s)",
        label="CoRE α",
        bounds=(0.5, 20),
        step=0.5,
    ),
    Option(
        "core_space",
        default=ENSEMBLE.core_space,
        choices=CORE_SPACES,
        help="CoRE: mix over UniTE's union of strings, or (main) over the drafter's vocabulary, the assisting "
        "models' tokens carried to the drafter's same or first sub-token as the paper does",
        label="CoRE space",
    ),
    Option(
        "eva_top",
        type=int,
        default=ENSEMBLE.eva_top,
        help="EVA: each model's top tokens kept before mapping (the paper's %(default)s)",
        label="EVA top tokens",
        bounds=(1, 2000),
        step=1,
    ),
    Option(
        "eva_drop",
        type=int,
        default=ENSEMBLE.eva_drop,
        help="EVA: a model joins the average only if its top token is in another model's top N "
        "(the paper's %(default)s)",
        label="EVA drop filter",
        bounds=(1, 50),
        step=1,
    ),
    Option(
        "weights", "values", type=float, metavar="W", help="one weight per model, in the models' order", label="Weights"
    ),
    Option("safe_mode", default=DEFAULTS.safe_mode, choices=SAFE_MODES, help=SAFE_MODE_HELP, label="SAFE mode"),
    Option(
        "per_token_commit",
        default=DEFAULTS.per_token_commit,
        choices=PER_TOKEN_COMMITS,
        help=PER_TOKEN_COMMIT_HELP,
        label="Per-token commit",
    ),
    Option(
        "byte_combine",
        default=DEFAULTS.byte_combine,
        choices=BYTE_COMBINES,
        help="byte-level: how the models' next-byte distributions combine (mixture: Σ wᵢ·pᵢ; product: normalised "
        "Π pᵢ^wᵢ)",
        label="Byte combination",
    ),
    Option(
        "temperature",
        type=float,
        default=DEFAULTS.temperature,
        help="0: greedy (the paper's setting)",
        label="Temperature",
        bounds=(0, None),
    ),
    Option(
        "top_p",
        type=float,
        default=DEFAULTS.top_p,
        help="nucleus sampling mass (when the temperature is above 0)",
        label="Top-p",
        bounds=(0.05, 1.0),
        step=0.05,
    ),
    Option(
        "seed",
        type=int,
        help="sampling seed (default: a fresh one, reported in the output)",
        label="Seed",
        bounds=(0, None),
        step=1,
    ),
    Option(
        "stop",
        "append",
        default=[],
        metavar="TEXT",
        help="end the run right after this text; several may be given (not inside the response's leading whitespace)",
        label="Stop at",
    ),
    Option(
        "draft_gate",
        type=float,
        default=DEFAULTS.draft_gate,
        metavar="TAU",
        help="SAFE: end a draft right after a token the drafter gives p < TAU (default %(default)s; 0: the "
        "paper's full drafts)",
        label="SAFE draft gate τ",
        bounds=(0, 0.99),
        step=0.05,
    ),
    Option(
        "consensus_threshold",
        type=float,
        default=DEFAULTS.consensus_threshold,
        metavar="T",
        help="SAFE (greedy): keep a draft where the weighted mean p of the models' own tokens is above T "
        "(default %(default)s, the paper's; higher ensembles more)",
        label="SAFE consensus threshold",
        bounds=(0.01, 0.99),
        step=0.01,
    ),
    Option(
        "damage_kl_steps",
        type=int,
        default=DEFAULTS.damage_kl_steps,
        metavar="N",
        help="measure the conditioning-damage KL at most N times (one extra forward pass each; 0: off)",
        label="Damage KL steps",
        bounds=(0, None),
        step=1,
    ),
    Option(
        "overlap",
        "toggle",
        help="SAFE: verifiers' passes at once and the next draft during verification (the same output; "
        "default: on only when every model has its own GPU)",
        label="Overlap",
    ),
    *LOADING_OPTIONS,
    Option("placement", default="local", choices=("local", "ray"), help="ray: each model in a Ray actor"),
    Option("ray_address", metavar="ADDR", help="an existing Ray cluster (default: start a local one)"),
)
OPTIONS = {option.name: option for option in (STRATEGY, *DECODING_OPTIONS)}


def _forced(value: str) -> tuple[int, str]:
    """INDEX:TEXT, the text taken verbatim after the first colon (leading spaces count)."""
    index, sep, text = value.partition(":")
    if not sep or not index.strip().isdigit() or not text:
        raise argparse.ArgumentTypeError(f"{value!r} is not INDEX:TEXT (e.g. 12: Paris)")
    return int(index), text


def add_loading_options(parser: argparse.ArgumentParser) -> None:
    """How the models load: devices, dtypes, the CPU's linear layers, remote code, chat templates. The CLI's
    commands and the app share these flags; `load_options(args)` reads them."""
    for option in LOADING_OPTIONS:
        option.add_to(parser)


def add_decoding_options(parser: argparse.ArgumentParser, with_strategy: bool, one_prompt: bool = True) -> None:
    """Every decoding option as a flag; `one_prompt` adds the prompt, what-if forcing and --json."""
    if one_prompt:
        parser.add_argument("--prompt", required=True, help="the user prompt")
    for option in (STRATEGY, *DECODING_OPTIONS) if with_strategy else DECODING_OPTIONS:
        option.add_to(parser)
    if one_prompt:
        parser.add_argument(
            "--force",
            action="append",
            type=_forced,
            default=[],
            metavar="INDEX:TEXT",
            help="what-if: commit TEXT as token INDEX (0-based) instead of what the strategy picks; repeatable",
        )
        parser.add_argument("--json", action="store_true", help="print one JSON result on stdout")


def decoding_values(args: argparse.Namespace) -> dict[str, object]:
    """The decoding options among parsed arguments, by name (what the server's requests start from)."""
    return {option.name: getattr(args, option.name) for option in DECODING_OPTIONS if hasattr(args, option.name)}


def options_from_mapping(options: Mapping[str, object], base: Mapping[str, object] | None = None) -> argparse.Namespace:
    """The options `options` say over `base` over the defaults, read as the command line reads them; an unknown
    key or a bad value is a UsageError that names it. None means not given."""
    values = {name: option.default for name, option in OPTIONS.items()} | dict(base or {})
    for key, value in options.items():
        if value is None:
            continue
        option = OPTIONS.get(key.replace("-", "_"))
        if option is None:
            raise UsageError(f"unknown decoding option {key!r}; known: {', '.join(sorted(OPTIONS))}")
        values[option.name] = option.read(key, value)
    return argparse.Namespace(**values)


def parse_options(
    options: Mapping[str, object], base: Mapping[str, object] | None = None
) -> tuple[argparse.Namespace, DecodeConfig]:
    """(options, checked config) of a mapping over `base`: what lm-eval's model and a server request need."""
    args = options_from_mapping(options, base)
    return args, decoding_config(args)


def _items(value) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [part for part in str(value).split(LIST_SEPARATOR) if part != ""]


def _boolean(key: str, value) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise UsageError(f"{key} takes true or false, not {value!r}")


def decoding_config(args: argparse.Namespace, strategy: str | None = None) -> DecodeConfig:
    """The checked `DecodeConfig` of parsed options (`strategy` instead of theirs, when given); everything that
    needs no model is checked here, so bad input fails before minutes of loading (UsageError / ConfigError)."""
    if "prompt" in args and not args.prompt.strip():
        raise UsageError("the prompt is empty")
    specs = list(args.models)
    for spec in specs:
        resolve_spec(spec)
    drafter = 0
    if args.drafter:
        matches = [i for i, spec in enumerate(specs) if args.drafter in (spec, resolve_spec(spec).short_name)]
        if not matches:
            raise ConfigError(f"the drafter {args.drafter} is not one of the models")
        drafter = matches[0]
    ensemble = EnsembleConfig(
        method=args.ensemble_method,
        top_k=args.top_k,
        weights=tuple(args.weights) if args.weights else None,
        sharpen=args.sharpen,
        sharpen_lambda=args.sharpen_lambda,
        gate=args.gate,
        core_score=args.core_score,
        core_beta=args.core_beta,
        core_alpha=args.core_alpha,
        core_space=args.core_space,
        eva_top=args.eva_top,
        eva_drop=args.eva_drop,
    )
    config = DecodeConfig(
        strategy=strategy or args.strategy,
        max_new_tokens=args.max_new_tokens,
        lookahead=args.lookahead,
        drafter=drafter,
        safe_mode=args.safe_mode,
        per_token_commit=args.per_token_commit,
        byte_combine=args.byte_combine,
        ensemble=ensemble,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        force=tuple(getattr(args, "force", [])),
        damage_kl_steps=args.damage_kl_steps,
        stop=tuple(args.stop),
        draft_gate=args.draft_gate,
        consensus_threshold=args.consensus_threshold,
        overlap=args.overlap,
    )
    config.validate(len(specs))
    for values, flag in ((args.devices, "--devices"), (args.dtype, "--dtype")):
        if len(values) not in (1, len(specs)):
            raise UsageError(f"give one {flag} for all models or one per model ({len(specs)}), not {len(values)}")
    return config


# ---------------------------------------------------------------- a sweep's grid: decoding options as axes
GRID_ALIASES = {"method": "ensemble_method"}
NOT_AXES = {"models", "drafter", "stop", "placement", "ray_address", *(o.name for o in LOADING_OPTIONS)}
GRID_AXES = tuple(o.name for o in DECODING_OPTIONS if o.name not in NOT_AXES)  # what a run decodes with
DEFAULT_MAX_POINTS = 64


def grid_points(axes: Sequence[str], base: argparse.Namespace, max_points: int = DEFAULT_MAX_POINTS) -> list[GridPoint]:
    """Every point of the product of `axes` (each ``KEY=V1,V2,...``; a list value's items between ``|``) over the
    options `base` holds, the first axis slowest. Each value goes through the option table's reader and each
    point's config through `decoding_config`, so a bad grid fails here, before any model loads (UsageError)."""
    parsed: dict[str, list[object]] = {}
    for axis in axes:
        key, sep, text = axis.partition("=")
        name = GRID_ALIASES.get(key.strip(), key.strip().replace("-", "_"))
        if not sep or name not in GRID_AXES:
            raise UsageError(f"--grid {axis!r}: not KEY=V1,V2,... with a KEY of {', '.join(GRID_AXES)}, method")
        if name in parsed:
            raise UsageError(f"--grid {key.strip()} is given twice")
        words = [word.strip() for word in text.split(",") if word.strip()]
        if not words:
            raise UsageError(f"--grid {key.strip()} has no values: the grid would be empty")
        values = [OPTIONS[name].read(key, word) for word in words]
        if len({repr(v) for v in values}) < len(values):
            raise UsageError(f"--grid {key.strip()} repeats a value")
        parsed[name] = values
    if not parsed:
        raise UsageError("give at least one --grid KEY=V1,V2,...")
    count = 1
    for values in parsed.values():
        count *= len(values)
    if count > max_points:
        raise UsageError(f"the grid has {count} points, more than --max-points {max_points}")
    points = []
    for combination in itertools.product(*parsed.values()):
        values = dict(zip(parsed, combination))
        try:
            config = decoding_config(argparse.Namespace(**(vars(base) | values)), "safe")
        except SafeEngineError as exc:
            shown = ", ".join(f"{k}={_shown(v)}" for k, v in values.items())
            raise UsageError(f"the grid point {shown}: {exc}") from None
        points.append(GridPoint(values, config))
    return points


def _shown(value: object) -> str:
    return LIST_SEPARATOR.join(map(str, value)) if isinstance(value, list) else str(value)


def load_options(args: argparse.Namespace) -> LoadOptions:
    """The loader's options of parsed options (a device and a dtype per model, or one for all)."""
    return LoadOptions(
        tuple(args.devices),
        tuple(args.dtype),
        args.trust_remote_code,
        not args.no_chat_template,
        cpu_int8=args.cpu_int8,
        cpu_linear=args.cpu_linear,
    )


def model_specs(args: argparse.Namespace) -> list[str]:
    """--models, each in a Ray actor with --placement ray."""
    on_ray = args.placement == "ray"
    return [RAY_PREFIX + spec if on_ray and not spec.startswith(RAY_PREFIX) else spec for spec in args.models]
