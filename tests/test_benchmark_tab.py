"""The Benchmark tab's pure parts, without a browser or a model: form checks, folder loading, progress."""

import json
from dataclasses import astuple
from pathlib import Path

import plotly.graph_objects as go
import pytest

from components.benchmark_tab import FIGURES, MAX_LIMIT, folder_view, plan, progress_line, report_files
from components.settings import RunSettings
from safe_engine.bench import builtin_tasks
from safe_engine.bench.report import write_report
from safe_engine.bench.store import RESULTS, SETTINGS
from safe_engine.contract.errors import ConfigError, ModelSpecError

MODELS = "embedded:gemma-3-270m\nembedded:smollm2-135m-instruct"
DRAFTER = "gemma-3-270m"
LIVE = astuple(RunSettings.defaults(MODELS.splitlines()))  # the Live tab's form as it opens


def _plan(
    tmp_path,
    tasks=("arithmetic",),
    upload=None,
    strategies=("singles", "per-token", "safe"),
    limit=2,
    max_new=24,
    style="direct",
    live=LIVE,
):
    return plan(list(tasks), upload, list(strategies), limit, max_new, style, str(tmp_path / "out"), RunSettings(*live))


def test_plan_takes_the_bench_fields_and_the_live_models(tmp_path):
    upload = tmp_path / "mine.jsonl"
    upload.write_text(json.dumps({"id": "q", "question": "1+1?", "answer": "2", "scorer": "numeric"}) + "\n")
    chosen = _plan(tmp_path, tasks=builtin_tasks()[:2], upload=str(upload), strategies=["single", "safe"], max_new=7)
    assert chosen.labels == [f"single:{DRAFTER}", "safe"]
    assert chosen.config.max_new_tokens == 7 and chosen.config.strategy == "safe"  # not the Live tab's 48
    assert [e.task for e in chosen.examples] == [*[builtin_tasks()[0]] * 2, *[builtin_tasks()[1]] * 2, "mine"]
    assert chosen.out_dir == tmp_path / "out" and chosen.specs == MODELS.split("\n")
    assert _plan(tmp_path, strategies=["singles"]).config.strategy == "single"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"tasks": ()}, "no task set chosen"),
        ({"strategies": ()}, "no strategy chosen"),
        ({"limit": 0}, "the limit must be"),
        ({"limit": MAX_LIMIT + 1}, "the limit must be"),
        ({"limit": None}, "the limit must be"),
        ({"max_new": 0}, "Max new tokens: a whole number from 1 to 512"),
        ({"live": ["embedded:gemma-3-270m", None, *LIVE[2:]], "strategies": ["safe"]}, "needs at least two models"),
    ],
)
def test_plan_refuses_bad_input_with_a_message(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):
        _plan(tmp_path, **change)


def test_plan_refuses_unreadable_and_clashing_task_files(tmp_path):
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage\n")
    with pytest.raises(ConfigError, match="cannot read .*binary.jsonl"):
        _plan(tmp_path, upload=str(binary))
    clash = tmp_path / "arithmetic.jsonl"
    clash.write_text(json.dumps({"question": "2+2?", "answer": "#### 4"}) + "\n")
    with pytest.raises(ConfigError, match="share a name"):
        _plan(tmp_path, upload=str(clash))
    with pytest.raises(ModelSpecError):
        _plan(tmp_path, live=["embedded:no-such-model", None, *LIVE[2:]])
    with pytest.raises(ConfigError, match="output folder is empty"):
        plan(["arithmetic"], None, ["safe"], 1, 8, "direct", "  ", RunSettings(*LIVE))


def write_folder(out: Path) -> None:
    """A finished two-example bench folder, as the harness writes it, with no model run."""
    out.mkdir(parents=True)
    settings = {
        "models": MODELS.split("\n"),
        "drafter": DRAFTER,
        "style": "direct",
        "chat_template": [True, True],
        "decode": {
            "max_new_tokens": 8,
            "lookahead": 5,
            "drafter": 0,
            "safe_mode": "fast",
            "ensemble": {
                "method": "unite",
                "top_k": 10,
                "weights": None,
                "sharpen": "heuristic",
                "sharpen_lambda": 0.1,
            },
        },
    }
    (out / SETTINGS).write_text(json.dumps(settings))
    rows = []
    for i, strategy in enumerate([f"single:{DRAFTER}", "single:smollm2-135m-instruct", "per-token", "safe"]):
        for example, correct in (("1", True), ("2", i % 2 == 0)):
            rows.append(
                {
                    "task": "arithmetic",
                    "id": example,
                    "strategy": strategy,
                    "prompt": "p",
                    "gold": "4",
                    "prediction": "4",
                    "answer": "4",
                    "correct": correct,
                    "tokens": 4 + i,
                    "ensembled": i,
                    "replaced": 0,
                    "e_t": i / 4,
                    "oov_skips": 0,
                    "consensus_skips": 1,
                    "wall_s": 1.0 + i,
                    "tokens_per_s": 4.0,
                    "stop_reason": "answer-line",
                }
            )
    (out / RESULTS).write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"task": "half-writ')
    write_report(out)


def test_folder_view_shows_summary_and_every_chart(tmp_path):
    write_folder(tmp_path / "done")
    table, figures, where = folder_view(tmp_path / "done")
    assert list(table["strategy"].astype(str)) == [
        f"single:{DRAFTER}",
        "single:smollm2-135m-instruct",
        "per-token",
        "safe",
    ]
    assert list(table["accuracy"]) == [1.0, 0.5, 1.0, 0.5] and list(table["median_wall_ratio"]) == [1.0, 2.0, 3.0, 4.0]
    assert set(figures) == set(FIGURES) and all(isinstance(f, go.Figure) for f in figures.values())
    assert where.startswith("8 runs in") and DRAFTER in where
    html, csv = report_files(tmp_path / "done")
    assert Path(html).read_text().startswith("<!doctype html>") and "accuracy" in Path(csv).read_text()
    assert Path(html).parent != tmp_path / "done"  # a copy Gradio may serve, wherever the folder is


def test_folder_view_refuses_what_is_not_a_bench_folder(tmp_path):
    with pytest.raises(ConfigError, match="there is no folder"):
        folder_view(tmp_path / "missing")
    with pytest.raises(ConfigError, match="holds no benchmark results"):
        folder_view(tmp_path)
    (tmp_path / RESULTS).write_text("not json\n")
    with pytest.raises(ConfigError, match="not a readable benchmark folder"):
        folder_view(tmp_path)
    (tmp_path / RESULTS).write_text(json.dumps({"task": "t"}) + "\n")
    (tmp_path / SETTINGS).write_text(json.dumps({"drafter": DRAFTER}))
    with pytest.raises(ConfigError, match="not a readable benchmark folder"):
        folder_view(tmp_path)
    (tmp_path / SETTINGS).write_text("[]")
    with pytest.raises(ConfigError, match="not a readable benchmark folder"):
        folder_view(tmp_path)
    assert report_files(tmp_path) == (None, None)


def test_progress_line_gives_an_eta_from_runs_finished_here():
    assert progress_line(3, 10, 0, 0) == "3 of 10 runs"  # resumed runs say nothing about speed
    assert progress_line(5, 10, 2, 20) == "5 of 10 runs, about 50 s left"
    assert progress_line(2, 100, 2, 60) == "2 of 100 runs, about 49 min 00 s left"
    assert progress_line(10, 10, 10, 60) == "10 of 10 runs"


# ---------------------------------------------------------------- the Sweep section
def _sweep(tmp_path, grid: str, max_points=64, **change):
    from components.sweep_section import plan_sweep

    bench = {"tasks": ["arithmetic"], "upload": None, "strategies": ["singles", "safe"], "limit": 2, "max_new": 9}
    bench |= {"style": "direct"} | change
    return plan_sweep(*bench.values(), grid, max_points, str(tmp_path / "sweep"), RunSettings(*LIVE))


def test_a_sweeps_plan_is_the_bench_form_over_the_grid(tmp_path):
    chosen = _sweep(tmp_path, "lookahead=3,5\n\nmethod=unite,gac\n")
    assert [p.values for p in chosen.points][:2] == [
        {"lookahead": 3, "ensemble_method": "unite"},
        {"lookahead": 3, "ensemble_method": "gac"},
    ]
    assert {p.config.max_new_tokens for p in chosen.points} == {9}  # the bench form's length, not the Live tab's
    assert chosen.defaults == {"lookahead": 5, "ensemble_method": "unite"}
    assert chosen.bench.labels == [f"single:{DRAFTER}", "single:smollm2-135m-instruct", "safe"]


@pytest.mark.parametrize(
    "grid, max_points, message",
    [
        ("", 64, "at least one --grid"),
        ("lookahead=3,five", 64, "invalid int value"),
        ("lookahead=1,2,3", 2, "3 points, more than"),
        ("lookahead=3", 0, "the most points must be"),
    ],
)
def test_a_bad_grid_in_the_app_is_a_message(tmp_path, grid, max_points, message):
    from safe_engine.contract.errors import SafeEngineError

    with pytest.raises(SafeEngineError, match=message):
        _sweep(tmp_path, grid, max_points)
