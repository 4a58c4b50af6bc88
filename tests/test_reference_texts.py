"""The default computation gives the reference's tokens: SAFE, per-token and each model alone on the embedded pair,
loaded with default options, against texts made with transformers' own fp32 layers at the tested pins
(tests/reference_texts.json, written by `python -m scripts.reference_texts`, says how). The prompts kept are those
the opt-in int8 head changes, so this test fails if a default ever drifts from fp32 again; run at the newest and
the oldest dependencies the package admits (tests/test_dependency_ends.py), it shows they give the pins' tokens."""

import json
from pathlib import Path

import pytest

from safe_engine import DecodeConfig, decode
from safe_engine.contract.events import RunStarted, TextCommitted

pytestmark = pytest.mark.real_models
REFERENCE = json.loads((Path(__file__).parent / "reference_texts.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("run", REFERENCE["runs"], ids=lambda run: f"{run['name']}-{run['prompt'][:24]}")
def test_the_default_path_gives_the_reference_tokens(embedded_pair, run):
    events = list(decode(embedded_pair, run["prompt"], DecodeConfig(**run["config"])))
    started = next(e for e in events if isinstance(e, RunStarted))
    assert [m["approximate"] for m in started.models] == [False] * (1 if run["name"].startswith("single") else 2)
    ids = [i for e in events if isinstance(e, TextCommitted) for token in e.tokens for i in token.ids]
    assert ids == run["ids"]
    assert events[-1].text == run["text"]
