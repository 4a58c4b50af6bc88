"""Sampling for every strategy (the paper's App. H): seeds, the acceptance rule, what the events say."""

import pytest
import torch
from scripted_models import scripted
from tiny_models import char_tokenizer, tiny_model, unigram_tokenizer

from safe_engine.contract.config import EnsembleConfig
from safe_engine.contract.events import EnsemblePoint, PositionVerified, RunFinished, RunStarted
from safe_engine.decisions.sampling import Sampler
from safe_engine.strategies.decoding import DecodeConfig, decode

P = "Q:"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    words = [" the", " cat", " sat", " on", " mat", " dog", " at", "the", "cat", "sat", "on", "ma", "t"]
    return [
        tiny_model(tmp_path_factory.mktemp("w"), unigram_tokenizer(words), seed=2),
        tiny_model(tmp_path_factory.mktemp("c"), char_tokenizer(), seed=1),
    ]


def text(models, **config) -> str:
    events = list(decode(models, "the cat sat on", DecodeConfig(max_new_tokens=24, **config)))
    assert isinstance(events[-1], RunFinished)
    return events[-1].text


@pytest.mark.parametrize("strategy", ["single", "per-token", "safe"])
def test_the_same_seed_gives_the_same_output_and_other_seeds_differ(models, strategy):
    sampled = dict(strategy=strategy, temperature=3.0)
    first = text(models, seed=7, **sampled)
    assert text(models, seed=7, **sampled) == first
    assert any(text(models, seed=seed, **sampled) != first for seed in range(8, 12))


@pytest.mark.parametrize("strategy", ["single", "per-token", "safe"])
def test_temperature_zero_is_greedy_whatever_the_seed(models, strategy):
    assert (
        text(models, strategy=strategy, seed=1)
        == text(models, strategy=strategy, seed=2)
        == text(models, strategy=strategy)
    )


def test_a_run_without_a_seed_reports_the_one_it_drew(models):
    started = next(decode(models, "the cat", DecodeConfig(strategy="single", temperature=1.0, max_new_tokens=4)))
    assert isinstance(started, RunStarted) and isinstance(started.config["seed"], int)
    again = text(models, strategy="single", temperature=1.0, seed=started.config["seed"])
    assert again == text(models, strategy="single", temperature=1.0, seed=started.config["seed"])


def test_top_p_keeps_the_smallest_set_holding_that_mass():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    assert Sampler(1.0, 0.8).nucleus(probs).tolist() == pytest.approx([0.625, 0.375, 0, 0])
    assert Sampler(1.0, 0.5).nucleus(probs).tolist() == pytest.approx([1, 0, 0, 0])
    assert Sampler(1.0, 1.0).nucleus(probs).tolist() == pytest.approx(probs.tolist())


def first_check(drafter: dict, verifier: dict, seed: int, **ensemble) -> tuple[PositionVerified, list]:
    a, b = scripted("a", [], drafter, P), scripted("b", [], verifier, P)
    config = DecodeConfig(temperature=1.0, seed=seed, ensemble=EnsembleConfig(sharpen="none", **ensemble))
    events = list(decode([a, b], P, config))
    return next(e for e in events if isinstance(e, PositionVerified)), events


def test_the_draft_is_kept_with_probability_min_1_of_p_ens_over_p_draft():
    """Weights (0, 1): P_ens(token) is the verifier's probability of its own token (App. H)."""
    for seed in range(6):
        check, _ = first_check({"": {"x": 0.5, "y": 0.5}}, {"": {"x": 0.25, "y": 0.75}}, seed, weights=(0.0, 1.0))
        expected = {"x": 0.25 / 0.5, "y": 1.0}[check.token]
        assert check.accept_p == pytest.approx(expected)
        assert check.reason in ("accepted", "resampled")
        assert (check.decision == "skipped-consensus") == (check.reason == "accepted")


def test_a_rejected_draft_is_replaced_by_a_sample_of_the_ensemble():
    check, events = first_check({"": {"x": 1.0}}, {"": {"y": 1.0}}, seed=0, weights=(0.0, 1.0))
    assert (check.decision, check.reason, check.accept_p) == ("ensembled", "resampled", 0.0)
    point = next(e for e in events if isinstance(e, EnsemblePoint))
    assert point.sampled and point.chosen == "y" and events[-1].text == "y"


def test_sampling_drops_unanimity():
    """The verifier's argmax is its own token (greedy would skip by unanimity); with sampling the draft is
    kept with probability (1.0 + 0.4) / 2 / 1.0 = 0.7, so some seeds ensemble."""
    decisions = []
    for seed in range(40):
        check, _ = first_check({"": {"x": 1.0}}, {"": {"x": 0.4, "y": 0.3, "z": 0.3}}, seed)
        assert check.accept_p == pytest.approx(0.7)
        decisions.append(check.decision)
    assert 15 <= decisions.count("skipped-consensus") <= 38 and "ensembled" in decisions
