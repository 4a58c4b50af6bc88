"""A sweep's table and report from a folder of hand-written rows (no model runs): the numbers against hand
computation, then the report in Debian's Chromium from file:// with the network cut off (tests/offline_pages.py):
it requests nothing, logs no error, draws the front, shows a point's settings on hover, sorts its table, and
shows hostile names as text. About 5 s."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from safe_engine.bench import store
from safe_engine.bench.fronts import sweep_table
from safe_engine.bench.grid import SweepPlan
from safe_engine.bench.tasks import Example
from safe_engine.options import grid_points, options_from_mapping
from safe_engine.pages.fronts import REPORT, write_report

HOSTILE = '<img src=x onerror="document.title=1">'
NAMES = ["a", HOSTILE]
EXAMPLES = [Example("t", f"e{i}", "q", "1", "numeric") for i in range(4)]
# correct per example, and seconds per example (4 tokens each), by strategy and lookahead (None: no grid value)
ROWS = {
    ("single:a", None): ([1, 1, 0, 0], 1.0),
    (f"single:{HOSTILE}", None): ([1, 0, 0, 0], 2.0),
    ("safe", 2): ([1, 1, 1, 0], 3.0),
    ("safe", 5): ([1, 0, 0, 0], 1.5),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sweep")
    points = grid_points(["lookahead=2,5"], options_from_mapping({}))
    labels = [f"single:{n}" for n in NAMES] + ["safe"]
    plan = SweepPlan(NAMES, ["x", "y"], [True, True], EXAMPLES, points[0].config, {"lookahead": 5}, points, labels, out)
    plan.write_manifest()
    written = set()
    for index, point in enumerate(plan.manifest["points"]):
        for label, name in point["runs"].items():
            if (name, label) in written:  # the singles' folder serves both points
                continue
            written.add((name, label))
            correct, wall = ROWS[(label, None if label.startswith("single:") else (2, 5)[index])]
            store.claim(plan.folder(name), {"rows": name})
            with store.open_for_append(plan.folder(name)) as handle:
                for example, right in zip(EXAMPLES, correct):
                    row = {"task": "t", "id": example.id, "strategy": label, "correct": bool(right), "tokens": 4}
                    row |= {"e_t": 0.5 if label == "safe" else 0.0, "oov_skips": 1, "replaced": right, "wall_s": wall}
                    store.append(handle, row)
    write_report(out)
    return out


def test_the_table_by_hand(folder):
    table = sweep_table(folder).set_index(["strategy", "lookahead"], drop=False)
    assert table["strategy"].tolist() == ["single:a", f"single:{HOSTILE}", "safe", "safe"]
    safe2, safe5 = table.iloc[2], table.iloc[3]
    assert (safe2["accuracy"], safe2["gain_vs_best_single"]) == (0.75, 0.25)  # the best single is a: 2 of 4
    assert safe5["gain_vs_best_single"] == -0.25 and safe5["gain_vs_best_single_high"] == 0.0  # never above a
    assert (safe2["s_per_token"], safe2["ratio_to_drafter"], safe5["ratio_to_drafter"]) == (0.75, 3.0, 1.5)
    # Cost per token: a 0.25, the hostile single 0.5, SAFE@2 0.75, SAFE@5 0.375. Accuracy: .5, .25, .75, .25.
    assert table["pareto"].tolist() == [True, False, True, False]
    assert (safe2["e_t"], safe2["oov_skips"], safe2["replaced"], safe2["n"]) == (0.5, 4, 3, 4)


pytest.importorskip("playwright")
from offline_pages import Offline, offline_context  # noqa: E402
from playwright.sync_api import expect, sync_playwright  # noqa: E402
from test_app_browser import CHROMIUM, CHROMIUM_ARGS  # noqa: E402


@pytest.mark.skipif(
    not Path(CHROMIUM).exists() and os.environ.get("CI") != "true",
    reason="Debian chromium is not installed (bash scripts/setup.sh --tests)",
)
def test_the_report_opens_offline_draws_the_front_and_shows_a_point_on_hover(folder):
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        context = offline_context(browser)
        seen = Offline()
        page = seen.open(context, folder / REPORT)
        front = page.locator('svg[data-chart="front"]')
        expect(front.locator("circle.mark")).to_have_count(4)
        expect(front.locator("circle.mark.front")).to_have_count(2)
        assert front.locator("polyline.front-line").count() == 1
        expect(page.locator('svg[data-chart="share"] circle.mark')).to_have_count(4)
        expect(page.locator('svg[data-chart="axis-lookahead"] circle.mark')).to_have_count(2)
        expect(page.locator('svg[data-chart="axis-lookahead"] line.ref')).to_have_count(2)  # the singles

        tip = page.locator("#tip")
        expect(tip).to_be_hidden()
        front.locator("circle.mark.front").last.hover()
        expect(tip).to_be_visible()
        expect(tip).to_contain_text("safe · lookahead = 2")
        expect(tip).to_contain_text("accuracy 0.750")
        page.mouse.move(1, 1)
        expect(tip).to_be_hidden()

        table = page.locator("#sweep-table")
        accuracy = table.locator("th", has_text="accuracy").first
        column = [h.strip() for h in table.locator("th").all_inner_texts()].index("accuracy") + 1
        cells = table.locator(f"tbody td:nth-child({column})")
        accuracy.click()
        assert cells.all_inner_texts() == ["0.250", "0.250", "0.500", "0.750"]
        accuracy.click()
        assert cells.all_inner_texts() == ["0.750", "0.500", "0.250", "0.250"]

        assert page.locator("img").count() == 0 and page.title() == "SAFE sweep"  # the hostile name is text
        expect(page.locator("table")).to_contain_text(HOSTILE)
        assert seen.outside == [] and seen.errors == []
        context.close()
        browser.close()
