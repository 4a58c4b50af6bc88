"""`safe-ensemble sweep`: a grid of decoding options × strategies through the bench's folders, its table
(`sweep.csv`, `sweep_table`), resuming, and the grid's checks before any model loads. Tiny random models: the
numbers mean nothing, the bookkeeping is what is checked (the statistics: test_intervals.py)."""

import threading

import pandas as pd
import pytest
from tiny_pair import task_file, word_pair_folders

from safe_engine import cli
from safe_engine.bench import runner, store
from safe_engine.bench.fronts import COLUMNS, TABLE, sweep_table
from safe_engine.bench.grid import RUNS
from safe_engine.contract.config import METHODS
from safe_engine.options import GRID_AXES, UsageError, grid_points, options_from_mapping
from safe_engine.pages.fronts import REPORT

WORDS = [" the", " is", " answer", " of", " 5", " 12", "2", "3", "+", "?", " total", "####"]
GSM8K = [
    {"question": "Tom has 2 apples and buys 3 more. How many?", "answer": "2 + 3 = 5\n#### 5"},
    {"question": "A box holds 4 pens; 3 boxes hold how many?", "answer": "4 * 3 = 12\n#### 12"},
    {"question": "Sam had 9 cards and gave away 4. How many are left?", "answer": "9 - 4 = 5\n#### 5"},
]
GRID = ["--grid", "lookahead=2,4", "--grid", "consensus_threshold=0.3,0.7"]
TIMES = ["s_per_token", "ratio_to_drafter", "pareto"]  # wall-time figures: the only ones a rerun may change


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    return word_pair_folders(tmp_path_factory, WORDS)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    return task_file(tmp_path_factory, "gsm8k-mini.jsonl", GSM8K)


def _sweep(specs, tasks, out, *extra) -> int:
    argv = ["sweep", "--tasks", tasks, "--models", *specs, "--max-new-tokens", "6", "--out", str(out)]
    return cli.main([*argv, "--strategies", "single,per-token,safe", *GRID, *extra])


def _lines(out) -> list[dict]:
    """Every result line of the sweep's runs folders, each with its folder's name."""
    return [r | {"folder": f.name} for f in sorted((out / RUNS).iterdir()) for r in store.load_results(f)]


@pytest.fixture(scope="module")
def whole(specs, tasks, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    assert _sweep(specs, tasks, out, "--batch-size", "4") == 0
    return out


def test_a_sweep_writes_every_column_once_per_point_and_strategy(whole):
    table = pd.read_csv(whole / TABLE)
    assert "Accuracy vs cost per token" in (whole / REPORT).read_text(encoding="utf-8")
    assert list(table.columns) == ["lookahead", "consensus_threshold", *COLUMNS]
    # The two singles and per-token read neither knob: one row each; SAFE: one per point, in grid order.
    assert [s.split(":")[0] for s in table["strategy"]] == ["single"] * 2 + ["per-token"] + ["safe"] * 4
    safe = table[table["strategy"] == "safe"]
    assert safe[["lookahead", "consensus_threshold"]].values.tolist() == [[2, 0.3], [2, 0.7], [4, 0.3], [4, 0.7]]
    others = table[table["strategy"] != "safe"]
    assert len(others) == 3 and others[["lookahead", "consensus_threshold"]].isna().all().all()
    assert (table["n"] == len(GSM8K)).all() and table["pareto"].any()
    assert not table[[c for c in COLUMNS if c != "pareto"]].isna().any().any()
    assert (table["accuracy_low"] <= table["accuracy"]).all() and (table["accuracy"] <= table["accuracy_high"]).all()
    drafter = table[table["strategy"] == table["strategy"][0]]
    assert drafter["ratio_to_drafter"].tolist() == [1.0]
    singles, safe_runs = len(GSM8K) * 2, len(GSM8K) * 4
    assert len(_lines(whole)) == singles + len(GSM8K) + safe_runs  # per-token ran once for the four points


def test_the_table_is_one_library_call(whole):
    from_call = sweep_table(whole)
    assert from_call["lookahead"].tolist() == [None] * 3 + [2, 2, 4, 4]  # as given, blank where not read
    assert (whole / TABLE).read_text(encoding="utf-8") == from_call.to_csv(index=False)


def test_a_rerun_adds_no_row(specs, tasks, whole, monkeypatch):
    before = _lines(whole)

    def no_decode(*args, **kwargs):
        raise AssertionError("a finished sweep decoded again")

    monkeypatch.setattr(runner, "decode", no_decode)
    assert _sweep(specs, tasks, whole) == 0
    assert _lines(whole) == before


def test_an_interrupted_sweep_resumed_gives_the_uninterrupted_table(specs, tasks, whole, tmp_path, monkeypatch):
    real_decode, calls, lock = runner.decode, [], threading.Lock()

    def killed_at_the_tenth_run(*args, **kwargs):
        with lock:
            calls.append(args)
            if len(calls) == 10:
                raise KeyboardInterrupt
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(runner, "decode", killed_at_the_tenth_run)
    assert _sweep(specs, tasks, tmp_path, "--batch-size", "2") == 130
    first = _lines(tmp_path)
    assert 0 < len(first) < len(_lines(whole))
    monkeypatch.setattr(runner, "decode", real_decode)
    assert _sweep(specs, tasks, tmp_path, "--batch-size", "3") == 0
    lines = _lines(tmp_path)
    assert len(lines) == len({(r["folder"], *store.result_key(r)) for r in lines}) == len(_lines(whole))
    resumed, uninterrupted = sweep_table(tmp_path).drop(columns=TIMES), sweep_table(whole).drop(columns=TIMES)
    pd.testing.assert_frame_equal(resumed, uninterrupted)


@pytest.mark.parametrize(
    "grid, message",
    [
        (["--grid", "colour=red,blue"], "not KEY=V1,V2"),
        (["--grid", "top_k"], "not KEY=V1,V2"),
        (["--grid", "top_k=5,a"], "invalid int value: 'a'"),
        (["--grid", "top_k=0,5"], "the grid point top_k=0: top-k must be 1..1000"),
        (["--grid", "top_k="], "top_k has no values"),
        (["--grid", "top_k=5", "--grid", "top-k=6"], "given twice"),
        (["--grid", "top_k=5,5"], "repeats a value"),
        (["--grid", "consensus_threshold=0.5,1"], "consensus threshold must be in (0, 1)"),
        (["--grid", "weights=1|2|3"], "one weight per model"),
        (["--grid", "lookahead=1,2,3", "--grid", "top_k=1,2", "--max-points", "5"], "6 points, more than"),
    ],
)
def test_a_bad_grid_is_one_error_line_before_any_model_loads(grid, message, tasks, tmp_path, capsys, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("a model loaded")

    monkeypatch.setattr(cli, "load_models", no_loading)
    assert cli.main(["sweep", "--tasks", tasks, "--out", str(tmp_path), *grid]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "sweep.json").exists()


def test_every_knob_that_shapes_when_and_what_is_an_axis():
    wanted = {"lookahead", "top_k", "sharpen", "sharpen_lambda", "draft_gate", "safe_mode", "ensemble_method"}
    assert wanted | {"weights", "consensus_threshold", "gate", "per_token_commit"} <= set(GRID_AXES)
    base = options_from_mapping({})
    methods = grid_points([f"method={','.join(METHODS)}", "weights=1|1,3|1", "gate=true,false"], base, 64)
    assert len(methods) == len(METHODS) * 4
    assert [p.config.ensemble.method for p in methods[::4]] == list(METHODS)
    assert {p.config.ensemble.weights for p in methods} == {(1.0, 1.0), (3.0, 1.0)}
    assert methods[0].values == {"ensemble_method": METHODS[0], "weights": [1.0, 1.0], "gate": True}
    with pytest.raises(UsageError, match="models"):
        grid_points(["models=a,b"], base, 64)
