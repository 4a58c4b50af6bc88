"""The ``openai:`` model spec, parsed without touching the network: ``openai:BASE_URL#NAME[@TOKENIZER]``.

BASE_URL is the server's OpenAI API root (``http://127.0.0.1:8011/v1``); NAME the served model name
(vLLM's ``--served-model-name``); TOKENIZER, optional, a local folder or hub id holding the model's
tokenizer, for servers whose ``/v1/models`` does not report a model root this machine can read. The API
key comes from the environment (`api_key`), never from the spec, so specs can be logged and shared.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..contract.errors import ModelSpecError
from ..models.specs import ResolvedSpec

OPENAI_PREFIX = "openai:"
API_KEY_VARIABLES = ("SAFE_OPENAI_API_KEY", "OPENAI_API_KEY")
"""Read in this order; the first set one is sent as a bearer token."""


@dataclass(frozen=True)
class OpenAISpec:
    base_url: str  # without a trailing slash
    name: str
    tokenizer: str | None = None

    @property
    def host(self) -> str:
        return urlsplit(self.base_url).netloc


def parse_openai_spec(spec: str) -> OpenAISpec:
    """Split a spec into its URL, served name and optional tokenizer; a malformed one raises ModelSpecError."""
    rest = spec.strip()[len(OPENAI_PREFIX) :]
    url, sep, target = rest.partition("#")
    name, _, tokenizer = target.partition("@")
    example = "openai:http://127.0.0.1:8011/v1#gemma"
    if not sep or not name.strip():
        raise ModelSpecError(f"{spec!r} names no served model: write {example} (the model's name after #)")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ModelSpecError(f"{spec!r} has no http(s) URL before #: write {example}")
    try:
        parts.port  # noqa: B018 -- raises on a port that is not a number in range
    except ValueError:
        raise ModelSpecError(f"{spec!r} has a bad port in its URL") from None
    return OpenAISpec(url.rstrip("/"), name.strip(), tokenizer.strip() or None)


def resolve_openai_spec(spec: str) -> ResolvedSpec:
    """A remote model under its served name (labels and traces show that name)."""
    parsed = parse_openai_spec(spec)
    return ResolvedSpec(spec.strip(), "openai", parsed.name)


def api_key() -> str | None:
    return next((os.environ[v] for v in API_KEY_VARIABLES if os.environ.get(v)), None)
