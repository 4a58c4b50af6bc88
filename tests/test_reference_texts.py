"""The default computation gives the reference's tokens: SAFE on the embedded pair, loaded with default options,
against texts the engine made with transformers' own fp32 layers in the configuration that matched the SAFE
authors' code (tests/reference_texts.json says which). The prompts kept are those the opt-in int8 head changes,
so this test fails if a default ever drifts from fp32 again."""

import json
from pathlib import Path

import pytest

from safe_engine import DecodeConfig, decode
from safe_engine.contract.events import RunStarted, TextCommitted

pytestmark = pytest.mark.real_models
REFERENCE = json.loads((Path(__file__).parent / "reference_texts.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("run", REFERENCE["runs"], ids=lambda run: run["prompt"][:24])
def test_the_default_path_gives_the_reference_tokens(embedded_pair, run):
    events = list(decode(embedded_pair, run["prompt"], DecodeConfig(**REFERENCE["config"])))
    started = next(e for e in events if isinstance(e, RunStarted))
    assert [m["approximate"] for m in started.models] == [False, False]
    ids = [i for e in events if isinstance(e, TextCommitted) for token in e.tokens for i in token.ids]
    assert ids == run["ids"]
    assert events[-1].text == run["text"]
