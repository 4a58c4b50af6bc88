"""Damage in the UI without a browser: the Compare tab's damage chart, metrics columns and measured
explanation, the damage in pinned details and run metrics, older traces without damage, Replay's manifest."""

import json

import pandas as pd
import plotly.graph_objects as go
import pytest
from test_ui_render import EVIL
from tiny_models import char_tokenizer, tiny_model, unigram_tokenizer

from components import studio
from components.compare_tab import EXPLANATION
from components.live_tab import READY
from components.replay_tab import caption_html
from safe_engine.contract.events import (
    EVENT_TYPES,
    CommittedToken,
    DamageMeasured,
    RunFinished,
    RunStarted,
    TextCommitted,
)
from safe_engine.data import TRACES_DIR as TRACES
from safe_engine.orchestration.comparison import summarize
from safe_engine.pages import charts
from safe_engine.pages.comparison import measured_html, metrics_frame
from safe_engine.pages.traces import read_trace, shipped_traces, split_runs
from safe_engine.pages.transcript import details_html, metrics_html
from safe_engine.pages.view import RunView
from safe_engine.run.damage import degenerate
from safe_engine.strategies.decoding import DecodeConfig, decode

DRAFTER, VERIFIER = "drafter-m", "verifier-m"
CLEAN = {
    "repeated_4gram_rate": 0.0,
    "longest_token_run": 1,
    "longest_line_run": 0,
    "whitespace_share": 0.0,
    "replacement_chars": 0,
}
LOOPING = {
    "repeated_4gram_rate": 0.6,
    "longest_token_run": 9,
    "longest_line_run": 0,
    "whitespace_share": 0.1,
    "replacement_chars": 2,
}


def run(
    strategy: str,
    commits: list[list[tuple[int, float | None, bool]]],
    wall: float,
    drafter: str = DRAFTER,
    degeneration: dict = CLEAN,
    ensembled: int = 0,
) -> list:
    """Events of a run whose commits hold one token per (drafter's non-canonical count, its KL, OOV-like for
    the verifier); a damage event follows each commit, as the engine sends them."""
    names = [drafter] if strategy == "single" else [drafter, VERIFIER]
    events = [
        RunStarted(
            strategy,
            drafter,
            [{"name": n, "role": "drafter" if n == drafter else "verifier"} for n in names],
            {n: "p" for n in names},
            {"damage_kl_steps": 16, "seed": 7},
        )
    ]
    flat, count = [], 0
    for number, commit in enumerate(commits, 1):
        tokens = [
            CommittedToken(
                "x", count + i, count + i + 1, [count + i], "accepted", oov_like_for=[VERIFIER] if oov else []
            )
            for i, (_, _, oov) in enumerate(commit)
        ]
        count += len(commit)
        flat += commit
        events.append(TextCommitted(number, "x" * len(commit), tokens, 0.1 * number))
        nc, kl, _ = commit[-1]
        models = {drafter: {"non_canonical": nc, "kl": kl, "oov_like": False}}
        if strategy != "single":
            models[VERIFIER] = {"non_canonical": 0, "kl": None, "oov_like": any(o for _, _, o in commit)}
        events.append(DamageMeasured(number, count, models))
    kl = [commit[-1][1] for commit in commits if commit[-1][1] is not None]
    own = {
        "non_canonical": commits[-1][-1][0],
        "non_canonical_max": max(c[-1][0] for c in commits),
        "kl_mean": sum(kl) / len(kl) if kl else None,
        "kl_max": max(kl, default=None),
        "kl_sampled": len(kl),
        "kl_eligible": len(kl),
        "oov_like_predictions": 0,
    }
    damage = {"models": {drafter: own}, "degeneration": degeneration}
    if strategy != "single":
        damage["models"][VERIFIER] = own | {
            "non_canonical": 0,
            "non_canonical_max": 0,
            "kl_mean": None,
            "kl_max": None,
            "kl_sampled": 0,
            "oov_like_predictions": sum(any(o for _, _, o in c) for c in commits),
        }
    stats = {
        "tokens": len(flat),
        "ensembled": ensembled,
        "replaced": 0,
        "e_t": ensembled / len(flat),
        "oov_skips": {},
        "consensus_skips": {},
        "sharpened": 0,
        "rounds": len(commits),
        "wall_s": wall,
        "tokens_per_s": len(flat) / wall,
        "overhead_share": 0.0,
        "damage": damage,
    }
    events.append(RunFinished("x" * len(flat), "max_new_tokens", stats))
    return events


CLEAN_COMMITS = [[(0, None, False)], [(0, None, False)], [(0, None, False)], [(0, None, False)]]
DAMAGED_COMMITS = [[(0, None, False)], [(2, 0.5, True)], [(3, 0.7, True)], [(3, None, False)]]


def comparison(per_token=DAMAGED_COMMITS, safe=None, safe_wall=2.0, drafter=DRAFTER, per_token_degeneration=LOOPING):
    """(summaries, views) of a comparison: the drafter alone in 1 s, per-token in 3 s, SAFE in `safe_wall` s."""
    safe = safe or [[(0, None, False)], [(0, None, False), (0, None, False)], [(0, None, False)]]
    runs = {
        f"single:{drafter}": run("single", CLEAN_COMMITS, 1.0, drafter),
        f"single:{VERIFIER}": run("single", CLEAN_COMMITS, 1.5, VERIFIER),
        "per-token": run("per-token", per_token, 3.0, drafter, per_token_degeneration, ensembled=4),
        "safe": run("safe", safe, safe_wall, drafter, ensembled=1),
    }
    return [summarize(events, label) for label, events in runs.items()], {
        label: RunView.of([e.to_dict() for e in events]) for label, events in runs.items()
    }


def test_damage_chart_stacks_non_canonical_over_kl_on_one_axis():
    _, views = comparison()
    fig = charts.damage(list(views.items()))
    go.Figure(fig.to_dict())
    data, layout = fig.to_dict()["data"], fig.to_dict()["layout"]
    assert [t["name"] for t in data[::2]] == ["single:drafter-m", "single:verifier-m", "per-token", "safe"]
    per_token, per_token_kl = data[4], data[5]
    assert per_token["x"] == [1, 2, 3, 4] and per_token["y"] == [0, 2, 3, 3]
    assert (per_token_kl["xaxis"], per_token_kl["yaxis"], per_token_kl["x"], per_token_kl["y"]) == (
        "x2",
        "y2",
        [2, 3],
        [0.5, 0.7],
    )
    assert data[7]["x"] == [] and data[6]["x"] == [1, 3, 4]  # SAFE measured no KL; its second commit held two tokens
    assert layout["xaxis"]["matches"] == "x2" and layout["yaxis"]["domain"][0] > layout["yaxis2"]["domain"][1]
    assert len({(t["marker"]["symbol"], t["line"]["dash"]) for t in data[::2]}) == 4  # runs differ without colour too
    assert not layout["annotations"]


def test_damage_chart_says_when_nothing_was_measured_and_escapes_labels():
    _, views = comparison(per_token=CLEAN_COMMITS, drafter=EVIL, per_token_degeneration=CLEAN)
    fig = charts.damage(list(views.items()))
    go.Figure(fig.to_dict())
    assert "no KL measured" in fig.to_dict()["layout"]["annotations"][0]["text"]
    assert "<script" not in fig.to_json()
    old = RunView.of(split_runs(read_trace(TRACES / "1-safe-factorial.jsonl"))[0])
    assert (
        charts.damage([("old", old)]).to_dict()["layout"]["annotations"][0]["text"]
        == "appears when a run has committed tokens"
    )


def test_metrics_table_has_damage_and_degeneration_columns():
    summaries, views = comparison()
    frame = metrics_frame(summaries, views, DRAFTER).set_index("run")
    for column in (
        "drafter non-canonical",
        "drafter non-canonical max",
        "KL mean (nats)",
        "OOV-like predictions",
        "degenerated",
        "repeated 4-gram rate",
        "longest token run",
        "longest line run",
        "whitespace share",
        "U+FFFD",
    ):
        assert column in frame.columns
    pt, safe = frame.loc["per-token"], frame.loc["safe"]
    assert (
        pt["drafter non-canonical"],
        pt["drafter non-canonical max"],
        pt["KL mean (nats)"],
        pt["OOV-like predictions"],
    ) == (3, 3, 0.6, 2)
    assert (pt["degenerated"], pt["repeated 4-gram rate"], pt["longest token run"], pt["U+FFFD"]) == ("yes", 0.6, 9, 2)
    assert (safe["drafter non-canonical max"], safe["OOV-like predictions"], safe["degenerated"]) == (0, 0, "no")
    assert pd.isna(safe["KL mean (nats)"]) and safe["× drafter time"] == 2.0


def test_measured_explanation_uses_this_comparisons_numbers():
    summaries, views = comparison(safe_wall=2.0)
    html = measured_html(summaries, views, DRAFTER)
    assert (
        "<b>SAFE</b> ensembled 1 of 4 tokens (E/T 25%) and took 2.00× the wall time of drafter-m alone (2.0 s vs 1.0 s)"
        in html
    )
    assert "<b>Per-token</b> ensembled 4 of 4 tokens (E/T 100%) and took 3.00×" in html
    assert "3 non-canonical tokens under per-token (at most 3) and 0 under SAFE (at most 0)" in html
    assert "per-token 0.600 nats (mean of 2 measured steps, max 0.700); SAFE none, its context stayed canonical" in html
    assert "OOV-like predictions: per-token 2, SAFE 0" in html
    assert "Degeneration: per-token yes (repeated 4-grams 60%, longest token run 9" in html and "SAFE none (" in html
    assert "SAFE avoided the damage per-token ensembling did" in html


@pytest.mark.parametrize(
    "per_token, safe, verdict",
    [
        (CLEAN_COMMITS, None, "neither ensemble left a non-canonical context"),
        (
            DAMAGED_COMMITS,
            [[(1, 0.2, False)], [(1, None, False)]],
            "SAFE left less of this damage than per-token ensembling, but not none",
        ),
        (CLEAN_COMMITS, [[(1, 0.2, True)], [(1, None, False)]], "SAFE was not less damaged than per-token ensembling"),
    ],
)
def test_the_explanation_never_claims_what_the_numbers_contradict(per_token, safe, verdict):
    summaries, views = comparison(per_token=per_token, safe=safe, safe_wall=0.5)
    html = measured_html(summaries, views, DRAFTER)
    assert verdict in html and "took 0.50× the wall time" in html
    assert "avoided" not in html or verdict.startswith("SAFE avoided")


def test_measured_explanation_escapes_names_and_needs_finished_runs():
    summaries, views = comparison(drafter=EVIL)
    html = measured_html(summaries, views, EVIL)
    assert "<script" not in html and "&lt;script&gt;" in html
    assert measured_html([], {}, DRAFTER) == ""
    safe_only = [s for s in summaries if s["label"] == "safe"]
    assert "took" not in measured_html(safe_only, views, EVIL)  # no drafter-alone run to compare with


def test_static_texts_make_no_claim_a_measurement_can_contradict():
    for text in (EXPLANATION, studio.INTRO, READY):
        for claim in ("about as much as", "as fast as", "small share", "strongest", "always"):
            assert claim not in text, claim


def test_pinned_details_and_metrics_show_damage():
    events = [
        e.to_dict()
        for e in run("safe", [[(0, None, False), (1, None, False)], [(2, 0.25, True)], [(2, None, False)]], 2.0)
    ]
    view = RunView.of(events)
    assert view.damage_after(0) is view.damage_after(1) is view.damage[0] and view.damage_after(2) is view.damage[1]
    details = details_html(view, 2)
    assert "damage after the commit that holds it (3 tokens committed)" in details
    assert "<td>drafter-m</td><td>2</td><td>0.250 nats</td><td>no</td>" in details
    assert "<td>verifier-m</td><td>0</td><td>—</td><td>yes</td>" in details and "at most 16 times a run" in details
    running = metrics_html(RunView.of(events[:-1]))
    assert (
        "drafter drafter-m non-canonical 2 (max 2) · KL 0.250 nats (mean of 1 measured) · OOV-like predictions 1"
        in running
    )
    assert "degeneration" not in running
    assert "degeneration: none (repeated 4-grams 0%" in metrics_html(view)


RECORDED_BEFORE_DAMAGE = sorted(
    p for p in TRACES.glob("*.jsonl") if '"kind": "damage"' not in p.read_text(encoding="utf-8")
)
COLLAPSES = sorted(TRACES.glob("*why-per-token-fails*.jsonl"))


@pytest.mark.parametrize("trace", RECORDED_BEFORE_DAMAGE, ids=lambda p: p.stem)
def test_traces_without_damage_render_without_it(trace):
    runs = split_runs(read_trace(trace))
    views = {}
    for events in runs:
        view = RunView.of(events)
        assert view.damage_summary() is None and view.damage_after(0) is None
        assert "Damage" not in metrics_html(view) and "damage after" not in details_html(view, 0)
        views[view.label] = view
    summaries = [
        summarize(
            [EVENT_TYPES[e["kind"]](**{k: v for k, v in e.items() if k != "kind"}) for e in events],
            RunView.of(events).label,
        )
        for events in runs
    ]
    frame = metrics_frame(summaries, views, runs[0][0]["drafter"])
    assert frame[["drafter non-canonical", "KL mean (nats)", "degenerated", "U+FFFD"]].isna().all().all()
    html = measured_html(summaries, views, runs[0][0]["drafter"])
    assert "non-canonical" not in html and "Degeneration" not in html


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    vocab = [" the", " cat", " sat", " on", " mat", " dog", " at", "the", "cat", "sat", "on", "ma", "t"]
    return [
        tiny_model(tmp_path_factory.mktemp("words"), unigram_tokenizer(vocab), seed=2),
        tiny_model(tmp_path_factory.mktemp("chars"), char_tokenizer(), seed=1),
    ]


@pytest.mark.parametrize("strategy", ["per-token", "safe"])
def test_damage_folded_while_running_matches_the_engines_summary(pair, strategy):
    events = [
        e.to_dict()
        for e in decode(
            pair, "the cat sat on", DecodeConfig(strategy=strategy, max_new_tokens=12, force=((0, " ca"), (1, "t")))
        )
    ]
    running, finished = RunView.of(events[:-1]).damage_summary(), RunView.of(events).damage_summary()
    assert (
        finished["non_canonical_max"] >= 2 and finished["kl_sampled"] >= 1
    )  # the forced " ca"+"t" damaged the drafter
    assert running == finished | {"degeneration": None}


@pytest.mark.parametrize("trace", COLLAPSES, ids=lambda p: p.stem)
def test_shipped_collapses_show_per_token_damaging_its_drafter_more_than_safe(trace):
    views = [RunView.of(events) for events in split_runs(read_trace(trace))]
    assert [v.label for v in views][:2] == ["per-token", "safe"]  # Replay opens on per-token
    per_token, safe = (v.damage_summary() for v in views[:2])
    assert per_token["non_canonical_max"] > safe["non_canonical_max"] and degenerate(per_token["degeneration"])
    assert "Damage" in metrics_html(views[0])


def test_replay_lists_the_manifest_in_order_with_captions(tmp_path):
    manifest = json.loads((TRACES / "index.json").read_text(encoding="utf-8"))
    shipped = shipped_traces(TRACES)
    assert [p.name for p, _ in shipped] == [entry["file"] for entry in manifest]
    assert {p.name for p, _ in shipped} == {p.name for p in TRACES.glob("*.jsonl")} and all(
        p.is_file() for p, _ in shipped
    )
    assert all(caption for _, caption in shipped)
    for name in ("b.jsonl", "a.jsonl"):
        (tmp_path / name).write_text("")
    assert shipped_traces(tmp_path) == [(tmp_path / "a.jsonl", ""), (tmp_path / "b.jsonl", "")]
    (tmp_path / "index.json").write_text(json.dumps([{"file": "b.jsonl", "caption": EVIL}]))
    assert shipped_traces(tmp_path) == [(tmp_path / "b.jsonl", EVIL)]
    assert "<script" not in caption_html(EVIL) and caption_html("") == ""
