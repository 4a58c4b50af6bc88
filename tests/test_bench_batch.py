"""`bench --batch-size N`: up to N (example, strategy) runs at once give the rows one at a time gives, into
the same results store (appended as each finishes, one per key), resumable after a kill, nothing written
by a stop; the report keeps the plan's order whatever order the rows landed in."""

import json
import threading

import pytest
from tiny_models import tiny_model, unigram_tokenizer
from tiny_pair import task_file, word_pair_folders

from safe_engine import cli
from safe_engine.bench import Bench, load_task, runner
from safe_engine.bench.report import plan_order
from safe_engine.bench.store import RESULTS, load_results, result_key
from safe_engine.strategies.decoding import DecodeConfig

WORDS = [" the", " is", " what", " answer", " of", " 5", " Paris", "2", "3", "+", "?", " capital"]
ROWS = [
    {"id": "add", "question": "What is 2 + 3?", "answer": "5", "scorer": "numeric"},
    {"id": "capital", "question": "What is the capital of France?", "answer": "Paris", "scorer": "contains"},
    {"id": "copy", "question": "Copy this word exactly: quixotic", "answer": "quixotic", "scorer": "exact"},
]
TIMES = {"wall_s", "tokens_per_s"}  # the only fields a shared pass may change


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    return word_pair_folders(tmp_path_factory, WORDS)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    return task_file(tmp_path_factory, "mini.jsonl", ROWS)


def _bench(specs, tasks, out, batch: str) -> int:
    argv = ["bench", "--tasks", tasks, "--models", *specs, "--max-new-tokens", "10", "--out", str(out)]
    return cli.main([*argv, "--batch-size", batch])


def _rows(out) -> dict:
    return {result_key(r): {k: v for k, v in r.items() if k not in TIMES} for r in load_results(out)}


@pytest.fixture(scope="module")
def one_at_a_time(specs, tasks, tmp_path_factory):
    out = tmp_path_factory.mktemp("batch1")
    assert _bench(specs, tasks, out, "1") == 0
    return _rows(out)


def test_a_batch_gives_the_rows_of_one_at_a_time(specs, tasks, tmp_path, one_at_a_time):
    assert len(one_at_a_time) == len(ROWS) * 4
    assert _bench(specs, tasks, tmp_path, "8") == 0
    assert _rows(tmp_path) == one_at_a_time
    summary = (tmp_path / "summary.csv").read_text(encoding="utf-8").splitlines()
    strategies = [line.split(",")[1] for line in summary[1:]]
    assert strategies == plan_order(strategies) and strategies[-2:] == ["per-token", "safe"]


def test_a_killed_batch_keeps_whole_rows_and_resumes(specs, tasks, tmp_path, monkeypatch, one_at_a_time):
    real_decode, calls, lock = runner.decode, [], threading.Lock()

    def killed_at_the_sixth_run(*args, **kwargs):
        with lock:
            calls.append(args)
            if len(calls) == 6:
                raise KeyboardInterrupt
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(runner, "decode", killed_at_the_sixth_run)
    assert _bench(specs, tasks, tmp_path, "2") == 130
    first = load_results(tmp_path)
    assert 0 < len(first) < len(one_at_a_time)  # the runs that finished before the kill, each whole
    assert len({result_key(r) for r in first}) == len(first)

    monkeypatch.setattr(runner, "decode", real_decode)
    assert _bench(specs, tasks, tmp_path, "4") == 0
    lines = (tmp_path / RESULTS).read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines[: len(first)]] == first  # kept, not redone
    assert len(lines) == len(one_at_a_time) and _rows(tmp_path) == one_at_a_time


def test_a_stopped_batch_writes_nothing(specs, tasks, tmp_path):
    models = [tiny_model(tmp_path / "m", unigram_tokenizer(WORDS), arch="gemma3", seed=3)]
    bench = Bench(
        models, load_task(tasks), DecodeConfig(max_new_tokens=4), ["single:m"], tmp_path / "out", batch_size=4
    )
    stop = threading.Event()
    stop.set()
    assert list(bench.run(stop)) == [] and bench.done == 0 and load_results(tmp_path / "out") == []


@pytest.mark.parametrize("argv", [["--batch-size", "0"], ["--batch-size", "2", "--ray"]])
def test_bad_batch_sizes_are_refused(argv, capsys, tasks):
    assert cli.main(["bench", "--tasks", tasks, *argv]) == 2
    assert "--batch-size must be at least 1" in capsys.readouterr().err
