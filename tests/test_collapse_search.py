"""The collapse search's plan: each `--methods` value adds per-token and SAFE runs, and every run's label is read
back from its own trace (resuming and `--ship` rely on it)."""

import sys

import pytest
from scripted_models import scripted

from benchmarks.collapse_search import _label, main, plan
from safe_engine.strategies.decoding import DecodeConfig, decode

P = "Q:"
TABLE = {"": {"x": 1.0}}


def test_each_method_adds_its_runs_and_every_label_reads_back_from_the_trace():
    models = [scripted("a", [], TABLE, P), scripted("b", [], TABLE, P)]
    runs = plan(models, DecodeConfig(max_new_tokens=1), ["gac", "core"])
    labels = [label for label, _, _ in runs]
    assert labels == [
        "single:a",
        "single:b",
        "per-token",
        "per-token-full",
        "safe",
        "per-token:gac",
        "safe:gac",
        "per-token:core",
        "safe:core",
    ]
    for label, run_models, config in runs:
        started = next(iter(decode(run_models, P, config))).to_dict()
        assert _label(started) == label


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--ids", "spell-08,nope"], "no prompt nope in collapse_prompts.jsonl"),
        (["--methods", "gac,unite"], "unknown ensemble method unite: one of topk, gac, core, eva"),
    ],
)
def test_an_unknown_prompt_or_method_is_one_error_line_before_anything_runs(argv, message, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["collapse_search", *argv, "--report-only"])
    with pytest.raises(SystemExit) as stop:
        main()
    assert stop.value.code == 2 and capsys.readouterr().err.strip().splitlines()[-1].endswith(message)
