"""Each kind of page in Debian's Chromium, opened from file:// with the network cut off (tests/offline_pages.py):
a run, a what-if branch beside its origin, a comparison of four runs, the shipped collapse replayed as per-token
beside SAFE, and a trace made of hostile strings. Each page requests nothing but file: and data:, logs no error,
shows every committed token of every run it shows, shows a token's details on hover and on a click, draws its
charts, and hands back its trace from its download link. About 30 s on the 2-core box."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

pytest.importorskip("playwright")
from offline_pages import Offline, offline_context, token_texts  # noqa: E402
from page_runs import as_parsed, hostile_trace, tiny_specs, what_if  # noqa: E402
from playwright.sync_api import expect, sync_playwright  # noqa: E402
from test_app_browser import CHROMIUM, CHROMIUM_ARGS  # noqa: E402

from safe_engine.data import TRACES_DIR  # noqa: E402
from safe_engine.pages.page import Page, branch_page, comparison_page, run_page, trace_page  # noqa: E402
from safe_engine.pages.traces import ALONE, default_pair, read_trace, split_runs  # noqa: E402
from safe_engine.pages.view import RunView  # noqa: E402

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists() and os.environ.get("CI") != "true",
    reason="Debian chromium is not installed (bash scripts/setup.sh --tests)",
)
KINDS = ("run", "what-if", "comparison", "replay", "hostile")


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, tuple[Page, Path]]:
    folder = tmp_path_factory.mktemp("pages")
    original, branch = what_if(tiny_specs(tmp_path_factory.mktemp("tiny")))
    built = {
        "run": run_page(read_trace(TRACES_DIR / "1-safe-factorial.jsonl")),
        "what-if": branch_page(original, branch),
        "comparison": comparison_page(split_runs(read_trace(TRACES_DIR / "3-compare-factorial.jsonl"))),
        "replay": trace_page(read_trace(TRACES_DIR / "01-why-per-token-fails-spell-08.jsonl")),
        "hostile": trace_page(hostile_trace()),
    }
    return {kind: (page, page.save(folder / f"{kind}.html")) for kind, page in built.items()}


@pytest.fixture(scope="module")
def context():
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        context = offline_context(browser)
        yield context
        context.close()
        browser.close()


def _shown(page: Page) -> list[RunView]:
    """The runs a page shows, in its order: its trace's runs, or the one or two of them a trace's page picked."""
    runs = split_runs(page.events)
    if page.name == "trace":
        first, second = default_pair(runs)
        runs = [runs[first]] + ([] if second == ALONE else [runs[second]])
    return [RunView.of(run) for run in runs]


@pytest.mark.parametrize("kind", KINDS)
def test_a_page_works_from_a_file_with_no_network(context, pages, kind, tmp_path):
    page, path = pages[kind]
    offline = Offline()
    tab = offline.open(context, path)
    charts = tab.locator("[data-figure]")
    expect(charts.first.locator(".main-svg").first).to_be_attached(timeout=60_000)
    for i in range(charts.count()):  # every chart drew
        expect(charts.nth(i).locator(".main-svg").first).to_be_attached()
    views = _shown(page)
    runs = tab.locator("[data-run]")
    assert runs.count() == len(views)
    for i, view in enumerate(views):  # every committed token of every run shown, in order, as text
        tokens = runs.nth(i).locator(".transcript .tok[data-i]")
        assert token_texts(tokens) == [as_parsed(t.text) for t in view.tokens], f"run {i}"

    last = runs.nth(len(views) - 1)
    token = last.locator(".transcript .tok[data-i]").nth(2)
    token.hover()
    tip = token.evaluate("el => getComputedStyle(el, '::after').content")
    assert tip.startswith('"#2 ') and "click or Enter to pin" in tip  # the hover tip, drawn by the page's CSS
    token.click()
    details = tab.locator(f"#{last.get_attribute('data-details')}")
    expect(details).to_contain_text("token #2 · round")
    expect(token).to_have_class(re.compile(r"\bpinned\b"))
    if kind == "run":  # the union chart follows the pinned token's ensemble point, as in the app
        view = views[0]
        pinned = next(t for t in view.tokens if t.point is not None and t.point != len(view.points) - 1)
        tab.locator(f'.transcript .tok[data-i="{pinned.index}"]').press("Enter")
        position = view.points[pinned.point]["position"]
        expect(tab.locator("#r0-union")).to_contain_text(f"Ensemble at position {position}:")
        expect(details).to_contain_text(f"token #{pinned.index} ·")

    with tab.expect_download() as download:
        tab.locator("#trace-link").click()
    saved = tmp_path / download.value.suggested_filename
    download.value.save_as(saved)
    assert saved.suffix == ".jsonl" and read_trace(saved) == json.loads(json.dumps(page.events))
    if kind == "hostile":
        assert tab.evaluate("window.pwned") is None
        assert tab.locator("script").count() == 4  # the trace, the figures, plotly.js and the page's script
    assert offline.outside == [] and offline.requests == [path.resolve().as_uri()]
    assert offline.errors == []
    tab.close()
