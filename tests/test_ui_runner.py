"""The tabs' shared parts without a browser: the form by name, the one streaming skeleton (Stop armed and
always disarmed, failures worded in the page), and Replay's two runs on one token slider."""

from dataclasses import fields

import gradio as gr
import pytest

from components.replay_tab import ReplayTab, steps, token_count, up_to_token
from components.run_stream import Runner
from components.settings import FIELDS, Form, RunSettings
from components.stops import Stops
from safe_engine.contract.errors import ConfigError
from safe_engine.data import TRACES_DIR as TRACES
from safe_engine.pages.traces import ALONE, default_pair, read_trace, shipped_traces, split_runs
from safe_engine.pages.view import RunView


def test_the_form_needs_one_component_per_setting_and_reads_them_by_name():
    with gr.Blocks():
        components = {name: gr.Textbox() for name in FIELDS}
        form = Form(**components)
        with pytest.raises(TypeError, match="exactly the fields"):
            Form(**{k: v for k, v in components.items() if k != "seed"})
        with pytest.raises(TypeError, match="exactly the fields"):
            Form(**components, colour=gr.Textbox())
    assert form.inputs == [components[f.name] for f in fields(RunSettings)]
    values = [f"v{i}" for i in range(len(FIELDS))]
    assert form.read(values).seed == values[FIELDS.index("seed")]


class _Pool:
    def __init__(self, error: Exception | None = None):
        self.error = error

    def start(self, specs):
        pool = self

        class Loading:
            def __iter__(self):
                yield f"loading {specs[0]}"

            def result(self):
                if pool.error:
                    raise pool.error
                return ["model"]

        return Loading()


def _stream(runner: Runner, check, start, items_fail: bool = False) -> list:
    status = gr.HTML()

    def step(item, pace):
        if items_fail and item == 2:
            raise RuntimeError("boom")
        return {"item": item}

    return list(runner.stream("s", status, "run", check, start, step, lambda broke, stopped: {"end": broke}))


def test_the_stream_arms_stop_while_it_runs_and_always_disarms():
    runner = Runner(_Pool(), Stops())
    seen = []

    def start(models, plan, flag):
        seen.append((models, plan, flag.is_set(), runner.stops._flags["s"] is flag))
        return iter([1, 2, 3]), {"first": True}

    out = _stream(runner, lambda: (["m"], "plan"), start)
    assert seen == [(["model"], "plan", False, True)]
    assert out[1:] == [{"first": True}, {"item": 1}, {"item": 2}, {"item": 3}, {"end": None}]
    assert "loading m" in next(iter(out[0].values())) and runner.stops._flags == {}


def test_the_stream_words_each_failure_and_disarms():
    runner = Runner(_Pool(), Stops())

    def bad_check():
        raise ConfigError("the prompt is empty")

    with pytest.warns(UserWarning, match="Could not run: the prompt is empty"):
        out = _stream(runner, bad_check, None)
    assert len(out) == 1 and "the prompt is empty" in next(iter(out[0].values()))

    def bad_start(models, plan, flag):
        raise ConfigError("the prompt does not fit")

    with pytest.warns(UserWarning, match="does not fit"):
        out = _stream(runner, lambda: (["m"], None), bad_start)
    assert "does not fit" in next(iter(out[-1].values())) and runner.stops._flags == {}
    out = _stream(runner, lambda: (["m"], None), lambda *_: (iter([1, 2, 3]), {}), items_fail=True)
    assert out[-1] == {"end": "internal error (RuntimeError); the server log has the details"}
    assert {"item": 3} not in out and runner.stops._flags == {}
    with pytest.warns(UserWarning, match="no such model"):
        out = _stream(Runner(_Pool(ConfigError("no such model")), Stops()), lambda: (["m"], None), None)
    assert "no such model" in next(iter(out[-1].values()))


def test_replay_pairs_per_token_with_safe_and_cuts_both_at_a_token_count():
    runs = split_runs(read_trace(TRACES / "01-why-per-token-fails-spell-08.jsonl"))
    per_token, safe = default_pair(runs)
    assert [RunView.of(runs[i]).label for i in (per_token, safe)] == ["per-token", "safe"]
    assert default_pair(split_runs(read_trace(TRACES / "1-safe-factorial.jsonl"))) == (0, ALONE)
    total, label = steps(runs, per_token, safe)
    assert total == max(token_count(r) for r in runs[:2]) and "Tokens" in label
    assert steps(runs, per_token, ALONE) == (len(runs[per_token]), "Events replayed")
    for count in (1, 7, 30):
        for run in (runs[per_token], runs[safe]):
            view = RunView.of(up_to_token(run, count))
            commits = [len(e["tokens"]) for e in run if e["kind"] == "text_committed"]
            reached = next(sum(commits[: i + 1]) for i in range(len(commits)) if sum(commits[: i + 1]) >= count)
            assert len(view.tokens) == reached and view.finished is None
            assert view.events[-1]["kind"] == "damage"  # the commit's damage comes with it
    assert up_to_token(runs[safe], total) == runs[safe] and RunView.of(runs[safe]).finished is not None


def test_replay_opens_the_first_shipped_collapse_side_by_side():
    with gr.Blocks():
        tab = ReplayTab(shipped_traces(TRACES), [TRACES])
    runs = tab.runs.value
    assert (tab.pick.value, tab.beside.value) == default_pair(runs) and tab.other_box.visible
    assert not tab.charts_box.visible and tab.damage.visible
    out = tab.select(runs, 0, ALONE, ("01-why-per-token-fails-spell-08", ""))
    assert out[tab.other_box].visible is False and out[tab.charts_box].visible is True
    assert "Event" in out[tab.status] and out[tab.step].label == "Events replayed"
    out = tab.at(runs, 0, 1, 12)
    assert "Token 12 of 160, side by side" in out[tab.status]
    assert len(out[tab.panel.view].tokens) == 12 and tab.panel.timeline not in out  # hidden charts are not redrawn
    assert out[tab.other.view].label == "safe"
