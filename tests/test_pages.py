"""Self-contained pages without a browser (tests/test_page_browser.py opens them in one): what each kind of page
holds, that it runs nothing from its trace, that its trace reads back, the notebook view, trace names that must
not reach a file outside their folder, and the command line's --html and export."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

import pytest
from page_runs import TRAPS, Tags, hostile_trace, tiny_specs, what_if

from safe_engine import cli
from safe_engine.contract.config import DecodeConfig
from safe_engine.data import TRACES_DIR
from safe_engine.models.cache import load_models
from safe_engine.orchestration.comparison import run_comparison
from safe_engine.pages.page import Page, branch_page, comparison_page, render, run_page, trace_page
from safe_engine.pages.traces import (
    ALONE,
    TraceError,
    default_pair,
    find_trace,
    read_trace,
    shipped_traces,
    split_runs,
)
from safe_engine.pages.view import RunView

COLLAPSE = TRACES_DIR / "01-why-per-token-fails-spell-08.jsonl"
SAFE = TRACES_DIR / "1-safe-factorial.jsonl"
COMPARISON = TRACES_DIR / "3-compare-factorial.jsonl"
TAGS = {  # every element a page is made of: the renderers' markup and the page's frame
    *("html", "head", "meta", "title", "style", "body", "main", "header", "h1", "h2", "h3", "h4", "p", "a"),
    *("footer", "script", "section", "div", "span", "del", "b", "template", "details", "summary", "dl", "dt"),
    *("dd", "pre", "table", "thead", "tbody", "tr", "th", "td", "ul", "li"),
}


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    return tiny_specs(tmp_path_factory.mktemp("tiny"))


def _runs(page_html: str) -> dict[str, list[str]]:
    """Per run container (data-run), the data-tip of each pinnable token of its transcript, in order."""
    runs: dict[str, list[str]] = {}
    current = None
    for tag, attrs in Tags(page_html).tags:
        if "data-run" in attrs:
            current = runs.setdefault(attrs["data-run"], [])
        elif tag == "span" and "data-i" in attrs and current is not None:
            current.append(attrs["data-tip"])
    return runs


def _executable(page_html: str) -> list[str]:
    return [text for attrs, text in Tags(page_html).scripts if "type" not in attrs]


def _csp(page_html: str) -> str:
    return next(a["content"] for t, a in Tags(page_html).tags if a.get("http-equiv") == "Content-Security-Policy")


def test_a_run_page_holds_every_token_its_details_and_charts():
    events = read_trace(SAFE)
    view = RunView.of(events)
    page = run_page(events)
    html = page.html()
    assert [len(tips) for tips in _runs(html).values()] == [len(view.tokens)]
    for t in view.tokens:  # each token's details, pre-rendered, and the tip it shows on hover
        assert f'<template id="r0-t{t.index}"' in html
    assert html.count("<template id=") == len(view.tokens)
    assert set(page.figures) >= {"r0-timeline", "r0-progress", "r0-union", "r0-split"}
    assert sum(bool(re.fullmatch(r"r0-u\d+", key)) for key in page.figures) == len(view.points)  # union per pin
    assert read_trace_text(html) == events


def read_trace_text(html: str) -> list[dict]:
    """The trace Replay's upload would read from this page."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "page.html"
        path.write_text(html, encoding="utf-8")
        return read_trace(path)


def test_the_collapse_trace_exports_per_token_beside_safe_and_reads_back_whole(tmp_path):
    events = read_trace(COLLAPSE)
    runs = split_runs(events)
    per_token, safe = default_pair(runs)
    page = trace_page(events)
    html = page.html()
    headings = re.findall(r'<section class="run" data-run="(r\d)"[^>]*><h2>([^<]*)</h2>', html)
    assert headings == [("r0", "per-token"), ("r1", "safe")]
    tips = _runs(html)
    assert [len(tips["r0"]), len(tips["r1"])] == [len(RunView.of(runs[i]).tokens) for i in (per_token, safe)]
    assert "damage" in page.figures
    path = page.save(tmp_path / "collapse.html")
    again = read_trace(path)  # what Replay's upload reads from a page
    assert again == events and len(split_runs(again)) == 3  # the whole trace, not only the two runs shown
    committed = sum(len(RunView.of(run).tokens) for run in split_runs(again))
    assert committed == sum(len(RunView.of(run).tokens) for run in runs)


def test_a_branch_page_marks_the_first_difference_in_both_runs(specs):
    original, branch = what_if(specs)
    page = branch_page(original, branch)
    html = page.html()
    assert page.title.startswith("What-if: “␣dog” at token #2 instead of")
    marked = re.findall(r'class="tok ([a-z ]*\bdiverge)" tabindex="0" data-i="(\d+)"', html)
    assert [index for _, index in marked] == ["2", "2"]  # the original's token 2, then the branch's
    assert marked[1][0].startswith("forced")
    assert read_trace_text(html) == json.loads(json.dumps(original + branch))  # tuples come back as lists


def test_a_comparison_page_shows_every_run_what_it_measured_and_a_table(specs):
    pairs = list(run_comparison(load_models(specs), "the cat sat on", DecodeConfig(max_new_tokens=8)))
    page = render(pairs)  # run_comparison's (label, event) pairs
    html = page.html()
    labels = list(dict.fromkeys(label for label, _ in pairs))
    assert len(_runs(html)) == len(labels) == 4
    for label in labels:
        assert f'<div class="card-head"><b>{label}</b>' in html
    assert "What this comparison measured" in html and 'class="dataframe metrics-table"' in html
    assert {"damage", "bars"} <= set(page.figures)
    assert render([e for _, e in pairs]).title == page.title  # the same runs as one flat list of events


def test_a_shipped_comparison_and_every_shipped_trace_render():
    for path in sorted(TRACES_DIR.glob("*.jsonl")):
        events = read_trace(path)
        html = trace_page(events, path.stem).html()
        assert sum(map(len, _runs(html).values())) > 0 and read_trace_text(html) == events, path.name
    assert len(_runs(comparison_page(split_runs(read_trace(COMPARISON))).html())) == 4


def test_a_hostile_trace_renders_as_text_and_runs_nothing():
    events = hostile_trace()
    for page in (trace_page(events), comparison_page([events, hostile_trace("2-per-token-factorial.jsonl")])):
        html = page.html()
        tags = Tags(html)
        assert {tag for tag, _ in tags.tags} <= TAGS  # no element came from the trace
        assert not [a for _, attrs in tags.tags for a in attrs if a.startswith("on")]  # nor a handler
        scripts = _executable(html)
        assert len(scripts) == 2  # plotly.js and the page's own script, nothing else
        policy = _csp(html)
        for script in scripts:
            digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
            assert f"'sha256-{digest}'" in policy
        assert "default-src 'none'" in policy and "unsafe-inline" not in policy.split("script-src")[1].split(";")[0]
        assert read_trace_text(html) == page.events  # every trap comes back as it was
    tips = _runs(trace_page(events).html())["r0"]
    texts = [t.text for t in RunView.of(events).tokens]
    assert all(text in TRAPS for text in texts) and len(tips) == len(texts)


def test_a_page_shows_itself_in_a_notebook_compactly():
    events = read_trace(SAFE)
    shown = run_page(events)._repr_html_()
    assert 'class="transcript"' in shown and 'class="metrics"' in shown and "data-tip=" in shown
    assert "<script" not in shown and "<template" not in shown and len(shown) < 100_000
    assert isinstance(render(events), Page) and render(events).title == run_page(events).title


def test_trace_names_reach_only_files_listed_inside_their_folders(tmp_path):
    folder, outside = tmp_path / "traces", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    trace = SAFE.read_text(encoding="utf-8")
    (folder / "mine.jsonl").write_text(trace, encoding="utf-8")
    (outside / "secret.jsonl").write_text(trace, encoding="utf-8")  # a real trace: a read would succeed
    os.symlink(outside / "secret.jsonl", folder / "escape.jsonl")
    folders = [TRACES_DIR, folder]
    assert find_trace("1-safe-factorial", folders) == SAFE.resolve()
    assert find_trace("1-safe-factorial.jsonl", folders) == SAFE.resolve()
    assert find_trace("mine", folders) == (folder / "mine.jsonl").resolve()
    unsafe = [
        "../../etc/passwd",
        "..%2F..%2Fetc%2Fpasswd",
        "%2E%2E%2Foutside%2Fsecret",
        "../outside/secret",
        "..",
        str(outside / "secret.jsonl"),
        "/etc/passwd",
        "traces/../outside/secret",
        "C:\\Windows\\win.ini",
        "",
    ]
    for name in unsafe:
        with pytest.raises(TraceError, match="is not a trace name"):
            find_trace(name, folders)
    with pytest.raises(TraceError, match="points outside its folder"):
        find_trace("escape", folders)
    with pytest.raises(TraceError, match="no trace named “secret”"):
        find_trace("secret", folders)
    assert [path.name for path, _ in shipped_traces(folder)] == ["mine.jsonl"]  # Replay does not list the symlink


def test_a_trace_with_several_runs_pairs_per_token_with_safe_else_its_first_two(specs):
    runs = split_runs(read_trace(COLLAPSE))
    assert [RunView.of(runs[i]).label for i in default_pair(runs)] == ["per-token", "safe"]
    original, branch = what_if(specs)
    assert default_pair([original, branch]) == (0, 1) and default_pair([original]) == (0, ALONE)


def test_pages_that_are_not_pages_of_a_trace_are_a_clear_error(tmp_path):
    page = tmp_path / "other.html"
    page.write_text("<!DOCTYPE html><html><body><script>x()</script></body></html>", encoding="utf-8")
    with pytest.raises(TraceError, match="holds no trace"):
        read_trace(page)
    with pytest.raises(TraceError, match="no events"):
        render([])


# ---------------------------------------------------------------- the command line
def _main(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_export_writes_a_shipped_trace_or_a_file_or_a_page(capsys, tmp_path):
    first = tmp_path / "collapse.html"
    code, _, err = _main(capsys, "export", COLLAPSE.stem, "--html", str(first))
    assert code == 0 and re.search(r"wrote .*collapse\.html: \d+\.\d MB in \d+\.\d\d s", err)
    html = first.read_text(encoding="utf-8")
    assert "per-token" in html and "Why per-token fails" in html  # the shipped trace's caption
    assert read_trace(first) == read_trace(COLLAPSE)
    for source in (str(SAFE), str(first)):  # a path to a trace, and a page holding one
        assert _main(capsys, "export", source, "--html", str(tmp_path / "again.html"))[0] == 0
        assert read_trace(tmp_path / "again.html") == read_trace(source)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["export", "no-such-trace", "--html", "x.html"], "no trace named “no-such-trace”"),
        (["export", "..%2F..%2Fetc%2Fpasswd", "--html", "x.html"], "is not a trace name"),
        (["export", "1-safe-factorial"], "required: --html"),
        (["export", "1-safe-factorial", "--html", "/no/such/folder/x.html"], "cannot write /no/such/folder/x.html"),
        (["generate", "--prompt", "x", "--html", "/no/such/folder/x.html"], "cannot write"),
    ],
)
def test_bad_export_input_is_one_line_and_exit_2(capsys, argv, message):
    code, _, err = _main(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], err


def test_generate_and_compare_write_pages(capsys, tmp_path, specs):
    run, comparison = tmp_path / "run.html", tmp_path / "comparison.html"
    common = ["--prompt", "the cat sat on", "--models", *specs, "--max-new-tokens", "8"]
    assert _main(capsys, "generate", *common, "--html", str(run), "--trace", str(tmp_path / "run.jsonl"))[0] == 0
    assert read_trace(run) == read_trace(tmp_path / "run.jsonl")
    assert len(_runs(run.read_text(encoding="utf-8"))["r0"]) == len(RunView.of(read_trace(run)).tokens)
    assert _main(capsys, "compare", *common, "--html", str(comparison))[0] == 0
    html = comparison.read_text(encoding="utf-8")
    assert len(_runs(html)) == 4 and "What this comparison measured" in html
    assert json.loads(json.dumps(read_trace(comparison)))[0]["kind"] == "run_started"
