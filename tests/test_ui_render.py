"""The UI's rendering, without a browser or a model: events → view → HTML and Plotly figures."""

from dataclasses import asdict
from pathlib import Path

import plotly.graph_objects as go
import pytest

from components.settings import MAX_NEW_TOKENS, RunSettings, build, parse_specs, stop_sequences, stop_text
from safe_engine.contract.errors import ConfigError, ModelSpecError, SafeEngineError
from safe_engine.contract.events import (
    Candidate,
    CommittedToken,
    DraftToken,
    EnsemblePoint,
    PositionVerified,
    RunFinished,
    RunStarted,
    TextCommitted,
    TokensDrafted,
    UnionRow,
    VerifierView,
)
from safe_engine.data import TRACES_DIR
from safe_engine.pages import charts
from safe_engine.pages.text import plot_label
from safe_engine.pages.traces import TraceError, read_trace, save_trace, split_runs
from safe_engine.pages.transcript import (
    LEGEND,
    compare_html,
    details_html,
    legend_html,
    metrics_html,
    status_html,
    transcript_html,
)
from safe_engine.pages.view import RunView

TRACES = sorted(TRACES_DIR.glob("*.jsonl"))
EVIL = "<script>alert(1)</script>"
A, B = "drafter-m", "verifier-m"


def _row(text, a, b, after=None):
    return UnionRow(text, {A: a, B: b}, (a + b) / 2, after)


def synthetic_run(strategy="safe") -> list[dict]:
    """One run touching every event kind and every decision, with hostile token text."""
    draft = [
        DraftToken(i, text, 0, 0, p, [Candidate(text, p), Candidate(EVIL, 0.01)])
        for i, (text, p) in enumerate([(" Hi", 0.9), ("<b>", 0.4), (" there", 0.7), ("\n", 0.2), (" a", 0.3)])
    ]
    own = VerifierView(B, False, " x", 0.6, " x", True)
    events = [
        RunStarted(
            strategy, A, [{"name": A, "role": "drafter"}, {"name": B, "role": "verifier"}], {A: EVIL, B: "p & q"}, {}
        ),
        TokensDrafted(1, A, draft),
        PositionVerified(1, 0, " Hi", 0, 3, [own], 0.75, "skipped-consensus", "unanimity"),
        PositionVerified(1, 1, "<b>", 3, 6, [VerifierView(B, True)], None, "skipped-oov", f"boundary missing for {B}"),
        PositionVerified(
            1,
            2,
            " there",
            6,
            12,
            [VerifierView(B, False, " there", 0.4, " x", False)],
            0.55,
            "skipped-consensus",
            "mean>0.5",
        ),
        PositionVerified(
            1, 3, "\n", 12, 13, [VerifierView(B, False, "\n", 0.1, EVIL, False)], 0.15, "ensembled", "no consensus"
        ),
        EnsemblePoint(1, 3, "\n", "\n", False, "unite", None, [_row("\n", 0.2, 0.1), _row(EVIL, 0.1, 0.3)]),
        PositionVerified(
            1, 4, " a", 13, 15, [VerifierView(B, False, " a", 0.1, EVIL, False)], 0.2, "ensembled", "no consensus"
        ),
        EnsemblePoint(
            1,
            4,
            " a",
            EVIL,
            True,
            "unite",
            "heuristic",
            [_row(EVIL, 0.2, 0.5, 0.45), _row(" a", 0.3, 0.1, 0.2), _row(" a", 0.1, 0.1)],
        ),
        TextCommitted(
            1,
            " Hi<b> there\n" + EVIL,
            [
                CommittedToken(" Hi", 0, 3, [0], "skipped-consensus", reason="unanimity"),
                CommittedToken("<b>", 3, 6, [1], "skipped-oov", oov_like_for=[B]),
                CommittedToken(" there", 6, 12, [2], "skipped-consensus", reason="mean>0.5"),
                CommittedToken("\n", 12, 13, [3], "ensembled"),
                CommittedToken(EVIL, 13, 38, [7, 8], "ensembled", drafted=" a", sharpened=True),
            ],
            1.2,
        ),
        EnsemblePoint(2, 6, None, "<eos>", True, "unite", None, [_row("<eos>", 0.5, 0.6)]),
        TextCommitted(2, "", [CommittedToken("<eos>", 38, 38, [9], "ensembled", oov_like_for=[B])], 1.9),
        RunFinished(
            " Hi<b> there\n" + EVIL,
            "eos",
            {
                "tokens": 6,
                "wall_s": 2.0,
                "time_split": {"draft": 0.5, "verify": 1.0, "ensemble": 0.1, "retokenize": 0.1},
                "forward": {
                    A: {"passes": 5, "positions": 5, "seconds": 0.5},
                    B: {"passes": 1, "positions": 6, "seconds": 1.0},
                },
            },
        ),
    ]
    return [e.to_dict() for e in events]


@pytest.fixture
def view():
    return RunView.of(synthetic_run())


def test_fold_matches_tokens_to_their_round_details(view):
    assert [t.decision for t in view.tokens] == [
        "skipped-consensus",
        "skipped-oov",
        "skipped-consensus",
        "ensembled",
        "ensembled",
        "ensembled",
    ]
    assert view.tokens[0].draft["p"] == 0.9 and view.tokens[0].verify["reason"] == "unanimity"
    assert view.tokens[3].point == 0 and not view.tokens[3].changed
    assert view.tokens[4].point == 1 and view.tokens[4].changed and view.tokens[4].drafted == " a"
    assert view.tokens[5].point == 2 and view.tokens[5].special  # after a two-id token, positions still line up
    m = view.metrics()
    assert (m["tokens"], m["ensembled"], m["oov_skips"], m["consensus_skips"], m["replaced"], m["damaged"]) == (
        6,
        3,
        1,
        2,
        2,
        1,
    )
    assert m["tokens_per_s"] == 3.0 and m["stop_reason"] == "eos"


def test_every_status_gets_its_class_and_model_text_stays_text(view):
    html = transcript_html(view)
    for cls in (
        '"tok cons"',
        '"tok oov"',
        '"tok cons mean"',
        '"tok ens"',
        '"tok ens repl sharp"',
        '"tok ens repl damage special"',
    ):
        assert f"class={cls}" in html
    assert "<script" not in html and "<b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert '<del class="was">␣a</del>' in html
    assert '<span class="ws">↵</span>\n' in html
    assert html.count('tabindex="0"') == 6 and 'data-i="5"' in html


def test_transcript_only_grows_by_appending():
    events = synthetic_run()
    shown = ""
    for n in range(1, len(events) + 1):
        html = transcript_html(RunView.of(events[:n]))
        assert html.startswith(shown)
        shown = html


def test_details_legend_metrics_status_escape(view):
    for i in range(len(view.tokens)):
        html = details_html(view, i)
        assert "<script" not in html and f"token #{i}" in html
    assert "OOV-like" in details_html(view, 1) and "ensemble (unite)" in details_html(view, 4)
    assert "Click a token" in details_html(view, None)
    assert "&lt;script&gt;" in metrics_html(view) and "<script" not in metrics_html(view)
    assert "<script" not in status_html(EVIL, "warn")
    assert legend_html().count('class="legend-item"') == len(LEGEND) == 10
    grid = compare_html([view, RunView.of(synthetic_run("per-token"))])
    assert grid.count('class="card"') == 2 and "OOV-like damage 1" in grid and "<script" not in grid


def test_figures_are_valid_light_and_escaped(view):
    figures = [
        charts.timeline(view),
        charts.progress(view),
        charts.union(view),
        charts.union(view, 0),
        charts.time_split(view),
        charts.compare_bars(
            [{"label": "safe", "wall_s": 1.0, "e_t": 0.1}, {"label": "per-token", "wall_s": 3.0, "e_t": 1.0}]
        ),
    ]
    for fig in figures:
        go.Figure(fig.to_dict())  # the app skips Plotly's validation for speed; the tests do not
        assert fig.to_dict()["layout"]["template"] == {}
        assert "<script" not in fig.to_json()
    union = charts.union(view, 1).to_dict()
    labels = union["data"][0]["x"]
    assert len(set(labels)) == len(labels) == 3  # repeated " a" kept apart
    assert labels[0] == plot_label(EVIL) and [t["name"] for t in union["data"]][-1] == "after heuristic sharpening"
    assert {t["name"] for t in charts.timeline(view).to_dict()["data"]} >= {"drafter p", "OOV-like"}


def test_empty_run_shows_placeholders():
    empty = RunView()
    assert transcript_html(empty) == "" and "No run yet" in metrics_html(empty)
    for fig in (
        charts.timeline(empty),
        charts.progress(empty),
        charts.union(empty),
        charts.time_split(empty),
        charts.compare_bars([]),
    ):
        go.Figure(fig.to_dict())
        assert fig.to_dict()["layout"]["annotations"]


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
def test_shipped_traces_replay_to_their_recorded_stats(trace, tmp_path):
    runs = split_runs(read_trace(trace))
    for events in runs:
        view = RunView.of(events)
        stats, m = view.finished["stats"], view.metrics()
        assert (m["tokens"], m["ensembled"], m["replaced"]) == (stats["tokens"], stats["ensembled"], stats["replaced"])
        assert m["oov_skips"] == sum(stats["oov_skips"].values())
        assert m["consensus_skips"] == sum(stats["consensus_skips"].values())
        transcript_html(view)
        for fig in (charts.timeline(view), charts.progress(view), charts.union(view), charts.time_split(view)):
            go.Figure(fig.to_dict())
    copy = save_trace([e for run in runs for e in run], "copy")
    assert read_trace(copy) == read_trace(trace)


def test_a_new_session_does_not_serialize_the_run_a_panel_holds(monkeypatch):
    """Gradio serializes a dataclass held in gr.State with dataclasses.asdict (then drops it) for every new
    session and every update of the state: a recorded run's view cost ~100 ms of CPU per visitor."""
    import dataclasses

    import gradio as gr
    from gradio.state_holder import SessionState

    from components.panel import RunPanel

    with gr.Blocks() as demo:
        RunPanel("p", RunView.of(split_runs(read_trace(TRACES[0]))[0]))
    serialized = []
    asdict = dataclasses.asdict
    monkeypatch.setattr(dataclasses, "asdict", lambda obj, **kw: serialized.append(type(obj)) or asdict(obj, **kw))
    SessionState(demo)
    assert RunView not in serialized


def test_bad_traces_say_why(tmp_path):
    cases = {
        "not json": "line 1 of the trace is not JSON",
        '{"kind": "nope"}': "not an engine event",
        '{"kind": "text_committed", "round": 1, "delta": "", "tokens": []}': "does not start with a run_started",
    }
    for text, message in cases.items():
        path = tmp_path / "t.jsonl"
        path.write_text(text + "\n")
        with pytest.raises(TraceError, match=message):
            read_trace(path)


FORM = asdict(RunSettings.defaults(["embedded:gemma-3-270m", "embedded:smollm2-135m-instruct"], "safe", 16)) | {
    "drafter": None
}


@pytest.mark.parametrize(
    "change, error, message",
    [
        ({"prompt": "   "}, ConfigError, "prompt is empty"),
        ({"prompt": "x" * 5000}, ConfigError, "limit here is 4000"),
        ({"models": "embedded:nope"}, ModelSpecError, "unknown embedded model"),
        ({"models": ""}, ConfigError, "no models"),
        ({"max_new_tokens": 0}, ConfigError, "Max new tokens: a whole number from 1 to 512"),
        ({"max_new_tokens": MAX_NEW_TOKENS + 1}, ConfigError, "Max new tokens"),
        ({"max_new_tokens": 2.5}, ConfigError, "Max new tokens"),
        ({"seed": -1}, ConfigError, "Seed: a whole number ≥ 0"),
        ({"drafter": "embedded:other"}, ConfigError, "not one of the models"),
        ({"models": "embedded:gemma-3-270m"}, ConfigError, "at least two models"),
        ({"draft_gate": 1.0}, ConfigError, "draft gate"),
        ({"weights": "1 x"}, SafeEngineError, "invalid float value: 'x'"),
        ({"weights": "1 2 3"}, ConfigError, "weight"),
    ],
)
def test_bad_form_input_fails_before_loading(change, error, message):
    form = RunSettings(**(FORM | {k: v for k, v in change.items() if k != "prompt"}))
    with pytest.raises(error, match=message):
        build(change.get("prompt", "Hi"), form)


def test_good_form_input_builds_a_config():
    specs, config = build(
        "Hi", RunSettings(**(FORM | {"drafter": "embedded:smollm2-135m-instruct", "strategy": "per-token"}))
    )
    assert specs == parse_specs("embedded:gemma-3-270m, embedded:smollm2-135m-instruct")
    assert (config.drafter, config.strategy, config.max_new_tokens) == (1, "per-token", 16)
    three = "embedded:gemma-3-270m\nembedded:smollm2-135m-instruct\nembedded:smollm2-135m-instruct"  # one per line
    specs, config = build("Hi", RunSettings(**(FORM | {"models": three, "temperature": 0.7, "seed": 5, "gate": "off"})))
    assert len(specs) == 3 and (config.temperature, config.seed, config.ensemble.gate) == (0.7, 5, False)
    assert config.draft_gate == 0.3 and build("Hi", RunSettings(**(FORM | {"draft_gate": 0})))[1].draft_gate == 0.0
    assert build("Hi", RunSettings(**FORM))[1].stop == ()
    emptied = build("Hi", RunSettings(**(FORM | {"max_new_tokens": None, "draft_gate": None, "top_k": None})))[1]
    assert (emptied.max_new_tokens, emptied.draft_gate, emptied.ensemble.top_k) == (
        64,
        0.3,
        10,
    )  # the options' defaults
    weighted = build("Hi", RunSettings(**(FORM | {"weights": "0.7, 0.3", "overlap": "on", "damage_kl_steps": 0})))[1]
    assert (weighted.ensemble.weights, weighted.overlap, weighted.damage_kl_steps) == ((0.7, 0.3), True, 0)


def test_the_stop_box_holds_one_sequence_a_line_with_escapes():
    box = "\\n\nend\\tof it\n\n\\\\n"  # lines: \n | end\tof it | (empty) | \\n
    stops = build("Hi", RunSettings(**(FORM | {"stop": box})))[1].stop
    assert stops == ("\n", "end\tof it", "\\n")
    assert stop_sequences(stop_text(stops)) == stops and stop_text(("```\n",)) == "```\\n"


def test_app_builds_and_rejects_a_bad_model_spec_before_launching(capsys):
    from components import studio

    demo = studio.build_demo()
    tabs = [block.label for block in demo.blocks.values() if type(block).__name__ == "Tab"]
    assert tabs == ["Ensemble live", "Compare", "Benchmark", "Replay", "Tokenizers"]
    assert studio.main(["--models", "embedded:nope"]) == 2
    assert "unknown embedded model" in capsys.readouterr().err
    assert (
        studio.main(["--cpu-int8", "--models", "embedded:nope"]) == 2
    )  # the int8 flag parses; the bad spec still fails first


def test_app_py_is_a_launcher_of_the_studios_main_and_finds_the_ui_files_in_the_checkout():
    import app
    from components import studio

    assert app.main is studio.main
    root = Path(__file__).resolve().parents[1]
    for name in ("style.css", "examples.json", "tokenizer_examples.json"):
        assert studio.asset(name) == root / "assets" / name and studio.asset(name).is_file()


def test_the_app_loads_its_models_with_the_clis_loading_flags(monkeypatch):
    from components import studio
    from safe_engine import cli

    flags = [
        "--devices",
        "cpu",
        "--dtype",
        "float32",
        "--cpu-linear",
        "torch",
        "--trust-remote-code",
        "--no-chat-template",
    ]
    started = []
    monkeypatch.setattr(studio, "launch", lambda demo, *args: started.append(demo))
    monkeypatch.setattr(studio, "build_demo", lambda specs, pool, traces: pool)
    assert studio.main(flags) == 0
    assert started[0].options == cli.load_options(cli.build_parser().parse_args(["generate", "--prompt", "x", *flags]))


def test_app_says_so_when_its_port_is_taken(capsys):
    import socket

    from components import studio

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        assert studio.main(["--port", str(busy.getsockname()[1])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: cannot serve on 127.0.0.1:")


def test_every_new_decision_reason_renders_and_explains_itself():
    """Engine runs that hit the reasons added with N models, GaC's gate, sampling and split characters."""
    from scripted_models import scripted
    from test_rules import ACCENT, GATE_DRAFTER, GATE_VERIFIER, INCORRECT_DRAFTER, INCORRECT_VERIFIER, P

    from safe_engine.contract.config import EnsembleConfig
    from safe_engine.pages.transcript import why
    from safe_engine.strategies.decoding import DecodeConfig, decode

    inc = scripted("a", ["Inc", "orr", "ect", "!", "?"], INCORRECT_DRAFTER, P)
    runs = {
        "not scored": ([inc, scripted("b", ["Incorrect", "!", "?"], INCORRECT_VERIFIER, P), inc], DecodeConfig()),
        "GaC's gate": (
            [scripted("a", [], GATE_DRAFTER, P), scripted("b", [], GATE_VERIFIER, P)],
            DecodeConfig(ensemble=EnsembleConfig(method="gac")),
        ),
        "kept with probability": (
            [scripted("a", [], {"": {"x": 1.0}}, P), scripted("b", [], {"": {"x": 1.0}}, P)],
            DecodeConfig(temperature=1.0, seed=0),
        ),
        "the ensemble was sampled": (
            [scripted("a", [], {"": {"x": 1.0}}, P), scripted("b", [], {"": {"y": 1.0}}, P)],
            DecodeConfig(temperature=1.0, seed=0, ensemble=EnsembleConfig(weights=(0.0, 1.0))),
        ),
        "middle of spelling a character": (
            [scripted("a", ["n"], ACCENT["drafter"], P), scripted("b", ["ễ", "n"], ACCENT["verifier"], P)],
            DecodeConfig(strategy="per-token", ensemble=EnsembleConfig(weights=(0.4, 0.6))),
        ),
    }
    for phrase, (models, config) in runs.items():
        view = RunView.of([e.to_dict() for e in decode(models, P, config)])
        html = transcript_html(view) + "".join(details_html(view, t.index) for t in view.tokens)
        assert phrase in html + "".join(why(t, view) for t in view.tokens), phrase


def test_a_kl_the_budget_skipped_is_not_shown_as_a_canonical_context():
    from safe_engine.pages.transcript import _kl_cell

    assert _kl_cell({"kl": 0.25, "kl_eligible": True}) == "0.250 nats"
    assert _kl_cell({"kl": None, "kl_eligible": True}) == "not measured (budget spent)"
    assert _kl_cell({"kl": None, "kl_eligible": False}) == _kl_cell({"kl": None}) == "—"


def test_throttle_lets_one_update_through_per_interval(monkeypatch):
    from components import run_stream as runner

    now = [100.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: now[0])
    frames = runner.Throttle(runner.FRAME_INTERVAL_S)
    assert frames.due() and not frames.due()  # the first update goes out, the next one waits
    now[0] += runner.FRAME_INTERVAL_S / 2
    assert not frames.due()
    now[0] += runner.FRAME_INTERVAL_S / 2
    assert frames.due() and runner.Throttle().interval == runner.CHART_INTERVAL_S > runner.FRAME_INTERVAL_S
