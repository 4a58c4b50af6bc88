"""Strategies on random-weight models built here: invariants that must hold exactly."""

import json
import threading

import pytest
from tiny_models import char_tokenizer, tiny_model, unigram_tokenizer

from safe_engine.contract.config import EnsembleConfig
from safe_engine.contract.errors import ConfigError
from safe_engine.contract.events import DECISIONS, EVENT_TYPES, PositionVerified, RunFinished, TextCommitted
from safe_engine.strategies.decoding import DecodeConfig, decode

PROMPT = "the cat sat on"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("tiny"), char_tokenizer(), seed=1)


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    # Another model with a word-level vocabulary: drafts and verifications disagree on boundaries.
    words = [" the", " cat", " sat", " on", " mat", " dog", " at", "the", "cat", "sat", "on", "ma", "t"]
    return tiny_model(tmp_path_factory.mktemp("other"), unigram_tokenizer(words), seed=2)


def run(models, **config):
    return list(decode(models, PROMPT, DecodeConfig(**config)))


def finished(events) -> RunFinished:
    assert isinstance(events[-1], RunFinished)
    return events[-1]


@pytest.mark.parametrize("sharpen", ["none", "geometric"])
@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_safe_with_identical_models_is_the_single_model(tiny, sharpen, mode):
    # (The heuristic sharpening may legitimately prefer a prefix string, so it is not part of this identity.)
    alone = finished(run([tiny], strategy="single", max_new_tokens=24)).text
    ensemble = EnsembleConfig(sharpen=sharpen)
    safe = run([tiny, tiny], strategy="safe", max_new_tokens=24, safe_mode=mode, ensemble=ensemble)
    assert finished(safe).text == alone
    # One tokenizer with one tokenization per text: every boundary is shared, nothing is ever OOV-like.
    assert finished(safe).stats["oov_skips"] == {f"{tiny.name}#2": 0}
    assert {e.decision for e in safe if isinstance(e, PositionVerified)} <= {"skipped-consensus", "ensembled"}


@pytest.fixture(scope="module")
def tiny2(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("tiny2"), char_tokenizer(), seed=3)


def test_per_token_weights_follow_the_models_when_another_model_drafts(tiny, tiny2):
    """All the weight on model 0 while model 1 drafts: the text is model 0's own (same tokenizer)."""
    alone = finished(run([tiny], strategy="single", max_new_tokens=20)).text
    assert alone != finished(run([tiny2], strategy="single", max_new_tokens=20)).text
    weighted = run(
        [tiny, tiny2],
        strategy="per-token",
        drafter=1,
        max_new_tokens=20,
        ensemble=EnsembleConfig(weights=(1.0, 0.0), sharpen="none"),
    )
    assert finished(weighted).text == alone


@pytest.mark.parametrize("strategy", ["safe", "per-token"])
@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_three_models_decode_in_both_modes(tiny, other, tiny2, strategy, mode):
    events = run([other, tiny, tiny2], strategy=strategy, safe_mode=mode, max_new_tokens=30)
    assert finished(events).stats["tokens"] == 30 or finished(events).stop_reason == "eos"
    for e in events:
        if isinstance(e, PositionVerified):
            assert [v.model for v in e.verifiers] == [tiny.name, tiny2.name]
            assert e.decision != "skipped-oov" or any(v.oov_like for v in e.verifiers)
            assert e.decision == "skipped-oov" or all(v.p is not None for v in e.verifiers)


def test_per_token_with_two_copies_is_the_model_alone(tiny):
    alone = finished(run([tiny], strategy="single", max_new_tokens=20)).text
    both = finished(run([tiny, tiny], strategy="per-token", max_new_tokens=20, ensemble=EnsembleConfig(sharpen="none")))
    assert both.text == alone and both.stats["e_t"] == 1.0


def test_committed_text_is_the_sum_of_deltas_and_offsets_index_it(tiny, other):
    events = run([tiny, other], strategy="safe", max_new_tokens=30)
    text = "".join(e.delta for e in events if isinstance(e, TextCommitted))
    assert text == finished(events).text
    for e in events:
        if isinstance(e, TextCommitted):
            for token in e.tokens:
                if token.end > token.start:
                    assert text[token.start : token.end] == token.text
                else:  # nothing to show in the text: the end of the response, or part of a character
                    assert token.text == "<eos>" or token.text.startswith("<0x")


@pytest.mark.parametrize("strategy", ["single", "per-token", "safe"])
def test_events_round_trip_through_json(tiny, other, strategy):
    events = run([other, tiny], strategy=strategy, max_new_tokens=16)
    for event in events:
        data = json.loads(event.to_json())
        assert data["kind"] in EVENT_TYPES
    stats = finished(events).stats
    assert stats["tokens"] == 16 or finished(events).stop_reason == "eos"
    decisions = [t.decision for e in events if isinstance(e, TextCommitted) for t in e.tokens]
    assert len(decisions) == stats["tokens"] and set(decisions) <= set(DECISIONS)
    changed = [e for e in events if e.kind == "ensemble_point" and e.changed]
    assert stats["replaced"] == len(changed)
    if strategy == "safe":
        assert stats["ensembled"] == decisions.count("ensembled")
        assert stats["replaced"] == sum(
            t.drafted is not None for e in events if isinstance(e, TextCommitted) for t in e.tokens
        )
        assert sum(stats["oov_skips"].values()) >= decisions.count("skipped-oov")


def test_stop_flag_ends_the_run_between_tokens(tiny):
    stop = threading.Event()
    events = []
    for event in decode([tiny], PROMPT, DecodeConfig(strategy="single", max_new_tokens=200, lookahead=1), stop):
        events.append(event)
        if isinstance(event, TextCommitted) and len(events) > 4:
            stop.set()
    assert finished(events).stop_reason == "stopped"
    assert finished(events).stats["tokens"] < 10


@pytest.mark.parametrize(
    "models, config, message",
    [
        (1, dict(strategy="safe"), "at least two models"),
        (2, dict(max_new_tokens=0), "max new tokens"),
        (2, dict(lookahead=0), "lookahead"),
        (2, dict(drafter=5), "drafter"),
        (2, dict(strategy="beam"), "strategy"),
        (2, dict(ensemble=EnsembleConfig(sharpen="cubic")), "sharpening"),
        (2, dict(ensemble=EnsembleConfig(weights=(1.0,))), "one weight per model"),
    ],
)
def test_bad_configs_are_refused_with_a_reason(tiny, models, config, message):
    with pytest.raises(ConfigError, match=message):
        decode([tiny] * models, PROMPT, DecodeConfig(**config))


def test_empty_prompt_and_too_long_prompt(tiny):
    with pytest.raises(ConfigError, match="empty"):
        decode([tiny], "  ", DecodeConfig(strategy="single"))
    with pytest.raises(ConfigError, match="context"):
        decode([tiny], "x" * 600, DecodeConfig(strategy="single"))
