"""Errors that carry a message meant for the person using the tool (CLI line, UI banner)."""


class SafeEngineError(Exception):
    """Base class: str(error) is a complete, user-facing sentence."""


class ModelSpecError(SafeEngineError):
    """A model spec that does not name anything we can load."""


class ModelLoadError(SafeEngineError):
    """A model that exists but could not be loaded (missing files, not a causal LM, no memory)."""


class ConfigError(SafeEngineError):
    """An option out of range or inconsistent with the others."""
