"""Decoding options given as key → value (lm-eval's ``--model_args``, a request's extra fields) read through the
command line's own parser, so every integration takes the CLI's names, types, defaults and checks.

Keys are the CLI's option names with ``_`` or ``-`` (``top_k``, ``max-new-tokens``); a flag takes a boolean;
a list (``models``, ``weights``, ``stop``) is a list or a string with ``|`` between items, because lm-eval
splits ``--model_args`` on commas.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

from ..cli import UsageError, decoding_config, decoding_parser
from ..config import DecodeConfig

LIST_SEPARATOR = "|"


def _items(value) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [part for part in str(value).split(LIST_SEPARATOR) if part != ""]


def options_argv(options: Mapping[str, object], parser: argparse.ArgumentParser | None = None) -> list[str]:
    """The command-line arguments that say what `options` say; UsageError names an unknown key."""
    parser = parser or decoding_parser()
    actions = {action.dest: action for action in parser._actions if action.option_strings}
    argv: list[str] = []
    for key, value in options.items():
        if value is None:  # not given: the default (or the base arguments') holds
            continue
        dest = key.replace("-", "_")
        action = actions.get(dest)
        if action is None:
            known = ", ".join(sorted(actions))
            raise UsageError(f"unknown decoding option {key!r}; known: {known}")
        flag = next(s for s in action.option_strings if s.startswith("--"))
        if isinstance(action, argparse.BooleanOptionalAction):
            argv.append(flag if _boolean(key, value) else "--no-" + flag[2:])
        elif action.nargs == 0:  # store_true
            if _boolean(key, value):
                argv.append(flag)
        elif isinstance(action, argparse._AppendAction):
            argv += [f"{flag}={item}" for item in _items(value)]
        elif action.nargs in ("+", "*"):
            argv += [flag, *_items(value)]
        else:
            argv.append(f"{flag}={value}")
    return argv


def _boolean(key: str, value) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise UsageError(f"{key} takes true or false, not {value!r}")


def parse_options(options: Mapping[str, object], base: Sequence[str] = ()) -> tuple[argparse.Namespace, DecodeConfig]:
    """(parsed options, checked config) of `base` arguments overridden by `options`."""
    parser = decoding_parser()
    args = parser.parse_args([*base, *options_argv(options, parser)])
    return args, decoding_config(args)
