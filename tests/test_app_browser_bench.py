"""The Benchmark tab in the browser: the app and Chromium come from test_app_browser's fixtures."""

import pytest
from playwright.sync_api import expect  # noqa: E402 (after test_app_browser's importorskip)
from test_app_browser import PLOT_MS, RUN_MS, app_url, browser, page, pytestmark  # noqa: F401 (fixtures and skip mark)
from test_benchmark_tab import write_folder


def _open_tab(page):
    page.get_by_role("tab", name="Benchmark").click()
    expect(page.locator("#bench-run")).to_be_visible(timeout=30_000)


def test_a_previous_folder_shows_its_table_and_charts(page, tmp_path):
    _open_tab(page)
    page.locator("#bench-out textarea").fill(str(tmp_path / "missing"))
    page.locator("#bench-show").click()
    expect(page.locator("#bench-status")).to_contain_text("there is no folder", timeout=30_000)
    write_folder(tmp_path / "done")
    page.locator("#bench-out textarea").fill(str(tmp_path / "done"))
    page.locator("#bench-show").click()
    expect(page.locator("#bench-status")).to_contain_text("Showing 8 runs", timeout=30_000)
    expect(page.locator("#bench-table")).to_contain_text("per-token")
    expect(page.locator("#bench-table")).to_contain_text("single:smollm2-135m-instruct")
    for chart in ("accuracy", "e-t", "latency", "examples"):
        expect(page.locator(f"#bench-{chart} .main-svg").first).to_be_attached(timeout=PLOT_MS)
    expect(page.locator("#bench-accuracy")).to_contain_text("Accuracy per strategy")
    expect(page.locator("#bench-report")).to_be_enabled()
    expect(page.locator("#bench-csv")).to_be_enabled()
    assert "Traceback" not in page.content()
    page.screenshot(path=str(tmp_path / "bench.png"), full_page=True)


@pytest.mark.real_models
def test_a_small_run_fills_table_and_charts(page, tmp_path):
    _open_tab(page)
    page.locator("#bench-limit input").fill("1")
    page.locator("#bench-max-new input").fill("6")
    page.locator("#bench-out textarea").fill(str(tmp_path / "run"))
    page.locator("#bench-run").click()
    expect(page.locator("#bench-status")).to_contain_text("Done: 4 of 4 runs", timeout=RUN_MS)
    expect(page.locator("#bench-table")).to_contain_text("safe")
    expect(page.locator("#bench-e-t .main-svg").first).to_be_attached(timeout=PLOT_MS)
    expect(page.locator("#bench-report")).to_be_enabled()
    assert (tmp_path / "run" / "report.html").is_file()
    page.screenshot(path=str(tmp_path / "bench-run.png"), full_page=True)


@pytest.mark.real_models
def test_a_small_sweep_runs_to_the_end_and_draws_its_front(page, tmp_path):
    _open_tab(page)
    page.locator("#bench-limit input").fill("1")
    page.locator("#bench-max-new input").fill("6")
    page.get_by_text("Sweep: a grid of settings").click()
    page.locator("#sweep-grid textarea").fill("lookahead=3,5")
    page.locator("#sweep-out textarea").fill(str(tmp_path / "sweep"))
    page.locator("#sweep-run").click()
    expect(page.locator("#sweep-status")).to_contain_text(
        "Done: 5 of 5 runs", timeout=RUN_MS
    )  # 2 singles, per-token, SAFE × 2
    expect(page.locator('#sweep-front svg[data-chart="front"] circle.mark')).to_have_count(5)
    expect(page.locator("#sweep-table")).to_contain_text("safe")
    expect(page.locator("#sweep-report")).to_be_enabled()
    assert (tmp_path / "sweep" / "report.html").is_file() and (tmp_path / "sweep" / "sweep.csv").is_file()
    page.locator("#sweep-out textarea").fill(str(tmp_path / "sweep"))
    page.locator("#sweep-show").click()
    expect(page.locator("#sweep-status")).to_contain_text("Showing the sweep", timeout=30_000)
    assert "Traceback" not in page.content()
    page.screenshot(path=str(tmp_path / "sweep.png"), full_page=True)
