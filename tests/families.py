"""The five tokenizer families the `families` tests verify, and where each one's tokenizer comes from.

Gemma 3 and SmolLM2 are the embedded models' tokenizers; Llama 3, Mistral 7B and Llama 2 are the npm
packages' vocabularies converted by scripts/convert_js_tokenizers.py (cached after the first run).
"""

from __future__ import annotations

import os

import pytest

from scripts.convert_js_tokenizers import JS_FAMILIES, ensure_tokenizer, is_converted, unavailable

EMBEDDED_FAMILIES = {"gemma-3": "embedded:gemma-3-270m", "smollm2": "embedded:smollm2-135m-instruct"}
FAMILIES = [*EMBEDDED_FAMILIES, *JS_FAMILIES]


def skip_or_fail(reason: str) -> None:
    """Skip with the reason; in CI (SAFE_STUDIO_CI=1), where these tests must run, fail instead."""
    if os.environ.get("SAFE_STUDIO_CI"):
        pytest.fail(f"CI must run the tokenizer-family tests: {reason}")
    pytest.skip(reason)


def require_node() -> None:
    reason = unavailable()
    if reason:
        skip_or_fail(reason)


def tokenizer_spec(family: str) -> str:
    """A spec `load_tokenizer` takes; a family's first use converts its npm vocabulary (needs node)."""
    if family in EMBEDDED_FAMILIES:
        return EMBEDDED_FAMILIES[family]
    if not is_converted(family):
        require_node()
    return str(ensure_tokenizer(family))
