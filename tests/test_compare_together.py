"""`compare --together`: the plan's runs at once, the same texts as in turn, and an output that says the
times are shared and how many runs shared each pass."""

import json

import pytest
from tiny_models import char_tokenizer, tiny_model_folder, unigram_tokenizer

from safe_engine import cli


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    words = [" the", " cat", " sat", " on", " mat", " dog", " at", "the", "cat", "sat", "on", "ma", "t"]
    return [
        str(tiny_model_folder(tmp_path_factory.mktemp("a"), char_tokenizer(), arch="gemma3", seed=1)),
        str(tiny_model_folder(tmp_path_factory.mktemp("b"), unigram_tokenizer(words), seed=2)),
    ]


def _compare(capsys, specs, *extra):
    assert (
        cli.main(["compare", "--prompt", "the cat sat on", "--models", *specs, "--max-new-tokens", "16", *extra]) == 0
    )
    return capsys.readouterr().out


def test_together_gives_the_texts_in_turn_gives_and_says_the_times_are_shared(capsys, specs):
    in_turn = json.loads(_compare(capsys, specs, "--json"))
    together = json.loads(_compare(capsys, specs, "--json", "--together"))
    assert [(r["label"], r["text"]) for r in together["runs"]] == [(r["label"], r["text"]) for r in in_turn["runs"]]
    assert not in_turn["together"] and set(in_turn["rows_per_pass"].values()) == {1.0}
    assert together["together"] and max(together["rows_per_pass"].values()) > 1.0
    text = _compare(capsys, specs, "--together")
    assert cli.SHARED_TIMES in text and "safe " in text.split(cli.SHARED_TIMES)[1]
    assert cli.SHARED_TIMES not in _compare(capsys, specs)
