"""Every example button shows on the embedded pair what it says it shows (assets/examples.json), decoded as the app
decodes it: the form's defaults with the example's length and stop sequences, greedy. The Tokenizers tab's
examples are pinned in tests/test_tokenizers_tab.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from components.examples import Example, Examples
from components.settings import RunSettings, build, stop_text
from safe_engine import DEFAULT_MODELS, decode
from safe_engine.contract.events import EnsemblePoint, RunFinished, TextCommitted
from safe_engine.contract.reasons import Decision

pytestmark = pytest.mark.real_models
EXAMPLES = Examples.read(Path(__file__).resolve().parents[1] / "assets" / "examples.json")


def _run(pair, example: Example, strategy: str = "safe", drafter: int = 0) -> list:
    form = dataclasses.replace(
        RunSettings.defaults(list(DEFAULT_MODELS), strategy, example.max_new_tokens),
        stop=stop_text(example.stop),
        drafter=DEFAULT_MODELS[drafter],
    )
    _, config = build(example.prompt, form)
    return list(decode(pair, example.prompt, config))


def _finished(events) -> RunFinished:
    return events[-1]


def _repeats(events) -> float:
    return _finished(events).stats["damage"]["degeneration"]["repeated_4gram_rate"]


def _drafter_damage(events) -> int:
    return _finished(events).stats["damage"]["models"]["gemma-3-270m"]["non_canonical"]


def _replaced(events) -> list[EnsemblePoint]:
    return [e for e in events if isinstance(e, EnsemblePoint) and e.chosen != e.drafted]


def _oov_skips(events) -> int:
    return sum(_finished(events).stats["oov_skips"].values())


def _check_rare_name(pair, example):
    events = _run(pair, example)
    text = _finished(events).text
    assert "Ouagadougou" in text and _finished(events).stop_reason == "eos" and _repeats(events) == 0
    name = range(text.index("Ouagadougou"), text.index("Ouagadougou") + len("Ouagadougou"))
    committed = [t for e in events if isinstance(e, TextCommitted) for t in e.tokens]
    assert sum(t.start in name and t.decision == Decision.ENSEMBLED for t in committed) >= 2  # points inside it
    assert _repeats(_run(pair, example, "single")) >= 0.5  # Gemma alone loops


def _check_accent(pair, example):
    events = _run(pair, example)
    text = _finished(events).text
    assert "Reykjavík" in text and "Iceland" in text and _finished(events).stop_reason == "eos"
    assert any(p.drafted == "A" and p.chosen == "Rey" for p in _replaced(events))


def _check_arithmetic(pair, example):
    finished = _finished(_run(pair, example))
    assert finished.stop_reason == "stop" and finished.text.rstrip().endswith("= 8")


def _check_code(pair, example):
    events = _run(pair, example)
    finished = _finished(events)
    assert finished.stop_reason == "stop" and finished.text.lstrip().startswith("```python\ndef factorial(n):")
    assert finished.text.endswith("\n```") and "return n * factorial(n-1)" in finished.text
    assert _oov_skips(events) > 0


def _check_per_token_damage(pair, example):
    per_token, safe = _run(pair, example, "per-token"), _run(pair, example)
    assert _drafter_damage(per_token) >= 20 and _repeats(per_token) >= 0.5
    assert _drafter_damage(safe) <= 5 and "class HTTPResponseCacheEntry" in _finished(safe).text


def _check_drafter_loops(pair, example):
    alone, safe = _run(pair, example, "single"), _run(pair, example)
    assert _repeats(alone) >= 0.5 and _finished(alone).stop_reason == "max_new_tokens"
    assert "Ouagadougou" in _finished(safe).text and _finished(safe).stop_reason == "eos"


CHECKS = {
    "live": {
        "a rare name": _check_rare_name,
        "a name with an accent": _check_accent,
        "arithmetic": _check_arithmetic,
        "code": _check_code,
    },
    "compare": {"per-token's damage": _check_per_token_damage, "the drafter loops alone": _check_drafter_loops},
}


def test_every_example_has_a_check():
    assert {e.label for e in EXAMPLES.live} == set(CHECKS["live"])
    assert {e.label for e in EXAMPLES.compare} == set(CHECKS["compare"])


@pytest.mark.parametrize(
    "tab, example",
    [("live", e) for e in EXAMPLES.live] + [("compare", e) for e in EXAMPLES.compare],
    ids=lambda value: value if isinstance(value, str) else value.label,
)
def test_the_example_shows_what_it_says(embedded_pair, tab, example):
    CHECKS[tab][example.label](embedded_pair, example)
