"""The app's pages and links without a browser: Replay's "Download page (HTML)" follows the runs shown and
carries the whole trace, Replay opens a page as it opens a trace, ``?trace=NAME`` opens a listed trace and
answers every other name with a message, and a page is written once however many visitors ask for it."""

from __future__ import annotations

from pathlib import Path

import gradio as gr
import pytest
from page_runs import Tags, saved_traces

from components.downloads import page_file
from components.replay_tab import ReplayTab
from safe_engine import cli
from safe_engine.data import TRACES_DIR
from safe_engine.pages.page import run_page
from safe_engine.pages.traces import ALONE, default_pair, read_trace, shipped_traces, split_runs
from safe_engine.pages.view import RunView

COLLAPSE = TRACES_DIR / "01-why-per-token-fails-spell-08.jsonl"
SAFE = TRACES_DIR / "1-safe-factorial.jsonl"


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> list[Path]:
    """The shipped traces and a --traces folder holding a saved trace and a symlink to one outside it."""
    return [TRACES_DIR, saved_traces(tmp_path_factory.mktemp("served")).resolve()]


@pytest.fixture(scope="module")
def tab(folders):
    with gr.Blocks() as demo:
        with gr.Tabs() as tabs:
            replay = ReplayTab([t for folder in folders for t in shipped_traces(folder)], folders)
        replay.follow_links(demo, tabs)
    return replay


def _page_runs(path: str) -> list[str]:
    return [
        attrs["data-run"] for tag, attrs in Tags(Path(path).read_text(encoding="utf-8")).tags if "data-run" in attrs
    ]


def test_replays_page_follows_the_runs_shown_and_carries_the_whole_trace(tab):
    first = tab.page.value["path"]
    assert read_trace(first) == read_trace(COLLAPSE) and _page_runs(first) == ["r0", "r1"]  # per-token, SAFE
    runs = split_runs(read_trace(COLLAPSE))
    alone = tab.select(runs, 2, ALONE, (COLLAPSE.stem, "a caption"))[tab.page].value["path"]
    html = Path(alone).read_text(encoding="utf-8")
    assert _page_runs(alone) == ["r0"] and "a caption" in html and read_trace(alone) == read_trace(COLLAPSE)


def test_the_exported_collapse_reopens_in_replay_per_token_beside_safe_with_its_tokens(tab, tmp_path, capsys):
    page = tmp_path / "collapse.html"
    assert cli.main(["export", COLLAPSE.stem, "--html", str(page)]) == 0  # as a person shares the collapse
    capsys.readouterr()
    runs = split_runs(read_trace(COLLAPSE))
    out = tab.open(str(page))
    assert out[tab.runs] == runs and (out[tab.pick].value, out[tab.beside].value) == default_pair(runs)
    shown = [out[tab.panel.view], out[tab.other.view]]
    assert [view.label for view in shown] == ["per-token", "safe"]
    assert [len(view.tokens) for view in shown] == [len(RunView.of(runs[i]).tokens) for i in default_pair(runs)]
    assert _page_runs(str(page)) == ["r0", "r1"]  # the page showed the same two runs


def test_replay_opens_a_page_as_it_opens_a_trace(tab, tmp_path):
    page = run_page(read_trace(SAFE)).save(tmp_path / "shared.html")
    out = tab.open(str(page))
    assert out[tab.runs] == split_runs(read_trace(SAFE)) and out[tab.source][0] == "shared.html"
    assert len(out[tab.panel.view].tokens) == 40


@pytest.mark.parametrize("name", ["1-safe-factorial", "1-safe-factorial.jsonl", "saved-run"])
def test_a_link_opens_a_shipped_or_saved_trace_in_replay(tab, name):
    out = tab.open_link(gr.Request(query_params={"trace": name}))
    assert out[tab.tabs].selected == "replay" and Path(out[tab.shipped]).stem == name.removesuffix(".jsonl")
    assert len(out[tab.panel.view].tokens) == 40


@pytest.mark.parametrize(
    "name, message",
    [
        ("../../etc/passwd", "is not a trace name"),
        ("..%2F..%2Fetc%2Fpasswd", "is not a trace name"),
        ("%2e%2e/outside/secret", "is not a trace name"),
        ("/etc/passwd", "is not a trace name"),
        ("../outside/secret", "is not a trace name"),
        ("escape", "points outside its folder"),
        ("secret", "no trace named “secret”"),
        ("", "is not a trace name"),
    ],
)
def test_a_link_to_anything_else_is_a_message_and_reads_nothing(tab, folders, name, message):
    out = tab.open_link(gr.Request(query_params={"trace": name}))
    assert set(out) == {tab.tabs, tab.status} and out[tab.tabs].selected == "replay"
    assert "warn" in out[tab.status] and message in out[tab.status]
    assert "&lt;" not in name and "<script" not in out[tab.status]


def test_a_page_without_a_link_changes_nothing(tab):
    assert isinstance(tab.open_link(gr.Request(query_params={})), type(gr.skip()))


def test_a_page_is_written_once_per_content():
    page = run_page(read_trace(SAFE))
    path = page_file(page, "safe-page")
    assert Path(path).name == "safe-page.html" and page_file(run_page(read_trace(SAFE)), "safe-page") == path
    assert page_file(run_page(read_trace(SAFE), caption="another"), "safe-page") != path
    assert read_trace(path) == read_trace(SAFE)


def test_the_app_refuses_a_traces_folder_that_is_not_one(capsys, tmp_path):
    from components import studio

    assert studio.main(["--traces", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0] == f"error: --traces {tmp_path / 'missing'}: not a folder"
