"""Errors that carry a message meant for the person using the tool (CLI line, UI banner)."""


class SafeEngineError(Exception):
    """Base class: str(error) is a complete, user-facing sentence."""


class ModelSpecError(SafeEngineError):
    """A model spec that does not name anything we can load."""


class ModelLoadError(SafeEngineError):
    """A model that exists but could not be loaded (missing files, not a causal LM, no memory)."""


class ConfigError(SafeEngineError):
    """An option out of range or inconsistent with the others."""


def first_line(exc: BaseException) -> str:
    """An exception's first non-blank line, else its class name: what a one-line message quotes of a cause."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
