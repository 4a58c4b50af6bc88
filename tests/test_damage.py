"""Damage measures along a run, degeneration formulas, and what-if forcing."""

import pytest
from tiny_models import char_tokenizer, tiny_model, unigram_tokenizer

from safe_engine.cli import build_parser
from safe_engine.contract.errors import ConfigError
from safe_engine.contract.events import DamageMeasured, RunFinished, TextCommitted
from safe_engine.run.damage import degenerate, degeneration, non_canonical
from safe_engine.strategies.decoding import DecodeConfig, decode

PROMPT = "the cat sat on"
STRATEGIES = ["single", "per-token", "safe"]


@pytest.fixture(scope="module")
def words(tmp_path_factory):
    """A drafter with whole-word tokens (" cat" is one token)."""
    vocab = [" the", " cat", " sat", " on", " mat", " dog", " at", "the", "cat", "sat", "on", "ma", "t"]
    return tiny_model(tmp_path_factory.mktemp("words"), unigram_tokenizer(vocab), seed=2)


@pytest.fixture(scope="module")
def chars(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("chars"), char_tokenizer(), seed=1)


def run(models, **config):
    return list(decode(models, PROMPT, DecodeConfig(max_new_tokens=16, **config)))


def committed(events):
    return [t for e in events if isinstance(e, TextCommitted) for t in e.tokens]


def test_degeneration_formulas_by_hand():
    text = "a b c d a b c d\n\n\n\nx"
    measures = degeneration(text, ["a", " b", "\n", "\n", "\n", "x"])
    # units: a b c d a b c d \n \n \n \n x → 10 four-grams, 9 distinct ("a b c d" twice)
    assert measures["repeated_4gram_rate"] == pytest.approx(1 - 9 / 10)
    assert measures["longest_token_run"] == 3
    assert measures["longest_line_run"] == 3  # three blank lines in a row
    assert measures["whitespace_share"] == pytest.approx(3 / 6)
    assert measures["replacement_chars"] == 0
    assert degenerate(measures) and not degenerate(
        degeneration("One clean sentence.", ["One", " clean", " sentence", "."])
    )
    assert degeneration("x\ufffd", ["x", "\ufffd"])["replacement_chars"] == 1


def test_non_canonical_counts_tokens_the_tokenizer_would_not_produce():
    assert non_canonical([(0, 3), (3, 4)], [(0, 4)]) == 2
    assert non_canonical([(0, 4), (4, 6)], [(0, 4), (4, 6)]) == 0


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_forcing_what_the_strategy_picks_anyway_changes_nothing(words, chars, strategy):
    models = [words, chars][: 1 if strategy == "single" else 2]
    original = run(models, strategy=strategy)
    tokens = committed(original)
    forced = run(models, strategy=strategy, force=((3, tokens[3].text),))
    assert forced[-1].text == original[-1].text
    again = committed(forced)
    assert (again[3].decision, again[3].drafted) == ("forced", None)
    assert [t.ids for t in again] == [t.ids for t in tokens]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_forcing_an_oov_like_piece_shows_damage(words, chars, strategy):
    """ " cat" is one token for the drafter: forcing " ca" then "t" leaves it a non-canonical context."""
    models = [words, chars][: 1 if strategy == "single" else 2]
    events = run(models, strategy=strategy, force=((0, " ca"), (1, "t")))
    first, second = committed(events)[:2]
    assert (first.text, first.decision, second.text, second.decision) == (" ca", "forced", "t", "forced")
    assert events[-1].text.startswith(" cat")
    after = [e for e in events if isinstance(e, DamageMeasured) and e.tokens >= 2][0]
    assert after.models[words.name]["non_canonical"] >= 2
    summary = events[-1].stats["damage"]["models"][words.name]
    assert summary["non_canonical_max"] >= 2 and summary["kl_sampled"] >= 1 and summary["kl_max"] > 0
    unforced = run(models, strategy=strategy)[-1].stats["damage"]["models"][words.name]
    assert unforced["non_canonical_max"] < summary["non_canonical_max"]


def test_damage_events_follow_every_commit_and_add_up(words, chars):
    events = run([words, chars], strategy="per-token", damage_kl_steps=2)
    commits = [e for e in events if isinstance(e, TextCommitted)]
    damages = [e for e in events if isinstance(e, DamageMeasured)]
    assert len(damages) == len(commits)
    assert [d.tokens for d in damages] == list(range(1, len(commits) + 1))
    final = events[-1]
    assert isinstance(final, RunFinished)
    summary = final.stats["damage"]
    assert summary["models"][words.name]["non_canonical"] == damages[-1].models[words.name]["non_canonical"]
    measured = [d.models[words.name]["kl"] for d in damages if d.models[words.name]["kl"] is not None]
    assert len(measured) == summary["models"][words.name]["kl_sampled"] <= 2
    eligible = [d.models[words.name]["kl_eligible"] for d in damages]
    assert sum(eligible) == summary["models"][words.name]["kl_eligible"]
    assert all(e for d, e in zip(damages, eligible) if d.models[words.name]["kl"] is not None)
    oov_like = sum(d.models[chars.name]["oov_like"] for d in damages)
    assert oov_like == summary["models"][chars.name]["oov_like_predictions"]
    assert set(summary["degeneration"]) == {
        "repeated_4gram_rate",
        "longest_token_run",
        "longest_line_run",
        "whitespace_share",
        "replacement_chars",
    }


def test_bad_forcing_is_refused(words, chars):
    with pytest.raises(ConfigError, match="below max new tokens"):
        decode([words], PROMPT, DecodeConfig(strategy="single", max_new_tokens=4, force=((4, "x"),)))
    with pytest.raises(ConfigError, match="at most once"):
        decode([words], PROMPT, DecodeConfig(strategy="single", force=((1, "x"), (1, "y"))))
    with pytest.raises(ConfigError, match="cannot spell"):  # a small alphabet and no byte fallback
        decode([chars], PROMPT, DecodeConfig(strategy="single", force=((0, "ß"),)))


def test_cli_parses_force_verbatim():
    args = build_parser().parse_args(["generate", "--prompt", "x", "--force", "3: Paris", "--force", "7:a:b"])
    assert args.force == [(3, " Paris"), (7, "a:b")]


def test_wall_time_leaves_the_damage_measurement_out(words, chars, monkeypatch):
    """Runs are compared by wall time; per-token's extra measuring must not count as decoding."""
    import time

    import safe_engine.run.damage as damage

    slow = 0.05
    real = damage.tokenize
    monkeypatch.setattr(damage, "tokenize", lambda *a: (time.sleep(slow), real(*a))[1])
    started = time.perf_counter()
    events = run([words, chars], strategy="per-token")
    outside = time.perf_counter() - started
    stats = events[-1].stats
    measuring = stats["time_split"]["damage"]
    assert measuring >= slow * stats["tokens"]
    assert 0 < stats["wall_s"] <= outside - measuring and stats["tokens_per_s"] == stats["tokens"] / stats["wall_s"]
