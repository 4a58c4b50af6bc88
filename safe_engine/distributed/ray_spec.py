"""The ``ray:`` model spec, parsed without Ray: ``ray:SPEC`` or ``ray:KEY=VALUE[,KEY=VALUE…]:SPEC``.

Keys: ``gpus`` (per actor, fractional allowed: two models can share a GPU), ``cpus`` (reserved for the
actor, and its torch threads), ``timeout`` (seconds any one call may take before the run fails) and
``restarts`` (how often Ray restarts the actor after it dies). The inner SPEC is any local spec.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..contract.errors import ModelSpecError
from ..models.specs import ResolvedSpec, resolve_spec

RAY_PREFIX = "ray:"

_OPTIONS = re.compile(r"^\w+=[^,:]*(,\w+=[^,:]*)*$")


@dataclass(frozen=True)
class RayPlacement:
    """Where and how a model actor runs."""

    gpus: float = 0.0
    cpus: float = 1.0
    timeout_s: float = 300.0
    restarts: int = 3

    @property
    def threads(self) -> int:
        return max(1, int(self.cpus))

    def describe(self) -> str:
        return f"{self.gpus:g} GPU" if self.gpus else f"{self.cpus:g} CPU"


_KEYS = {  # spec key: (RayPlacement field, type, least value)
    "gpus": ("gpus", float, 0.0),
    "cpus": ("cpus", float, 0.0),
    "timeout": ("timeout_s", float, 1e-3),
    "restarts": ("restarts", int, 0),
}


def parse_ray_spec(spec: str) -> tuple[RayPlacement, str]:
    """The placement and the inner spec of a ``ray:`` spec; bad keys or values raise ModelSpecError."""
    rest = spec.strip()[len(RAY_PREFIX) :]
    head, sep, tail = rest.partition(":")
    if not sep or not _OPTIONS.match(head):
        return RayPlacement(), rest
    values = {}
    for item in head.split(","):
        key, _, raw = item.partition("=")
        if key not in _KEYS:
            raise ModelSpecError(f"unknown Ray option {key!r} in {spec!r}; known: {', '.join(_KEYS)}")
        field_name, kind, least = _KEYS[key]
        try:
            value = kind(raw)
        except ValueError:
            raise ModelSpecError(f"Ray option {key}={raw!r} in {spec!r} is not a number") from None
        if not value >= least:
            raise ModelSpecError(f"Ray option {key}={raw} in {spec!r} must be at least {least:g}")
        values[field_name] = value
    return RayPlacement(**values), tail


def resolve_ray_spec(spec: str) -> ResolvedSpec:
    """The inner spec's resolution under the full spec string (names and labels stay the inner model's)."""
    _, inner = parse_ray_spec(spec)
    if inner.strip().startswith(RAY_PREFIX):
        raise ModelSpecError(f"{spec!r} nests one ray: prefix in another")
    return replace(resolve_spec(inner), spec=spec.strip())
