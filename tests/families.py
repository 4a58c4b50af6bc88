"""The five tokenizer families the `families` tests verify, and where each one's tokenizer comes from.

Gemma 3 and SmolLM2 are the embedded models' tokenizers; Llama 3, Mistral 7B and Llama 2 are the npm
packages' vocabularies converted by scripts/convert_js_tokenizers.py (cached after the first run).
"""

from __future__ import annotations

from ci import skip_or_fail

from scripts.convert_js_tokenizers import JS_FAMILIES, ensure_tokenizer, is_converted, unavailable

EMBEDDED_FAMILIES = {"gemma-3": "embedded:gemma-3-270m", "smollm2": "embedded:smollm2-135m-instruct"}
FAMILIES = [*EMBEDDED_FAMILIES, *JS_FAMILIES]


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
