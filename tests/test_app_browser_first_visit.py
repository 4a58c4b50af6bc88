"""What a first visit sees, in the browser: one-line empty states instead of bare tables, no what-if section
before a branch, and Replay opening a shipped collapse with per-token and SAFE side by side on one slider.
The app and Chromium come from test_app_browser's fixtures; no model runs."""

import json
import re

from playwright.sync_api import expect  # noqa: E402 (after test_app_browser's importorskip)
from test_app_browser import SAFE_TRACE, app_url, browser, page, pytestmark, replay_safe_trace  # noqa: F401

from safe_engine.data import TRACES_DIR as TRACES


def _headers(page, table: str) -> list[str]:
    return [h.strip() for h in page.locator(f"{table} thead th").all_inner_texts()]


def test_empty_tabs_say_what_will_appear_and_show_no_bare_tables(page, tmp_path):
    expect(page.locator("#live-metrics")).to_contain_text("No run yet: its numbers and damage appear here")
    expect(page.locator("#branch-status")).to_contain_text("No branch yet")  # by the what-if controls
    expect(page.locator("#branch-section")).to_be_hidden()
    expect(page.locator("#branch-transcript")).to_be_hidden()
    page.screenshot(path=str(tmp_path / "live.png"), full_page=True)
    page.get_by_role("tab", name="Compare").click()
    expect(page.locator("#compare-measured")).to_contain_text("a table of metrics per run appear here")
    expect(page.locator("#compare-table")).to_be_hidden()
    page.get_by_role("tab", name="Tokenizers").click()
    expect(page.locator("#tok-pair")).to_contain_text("on one character ruler, appear here")
    expect(page.locator("#tok-summary")).to_contain_text("words that break most often appear here")
    for table in ("#tok-rates", "#tok-spans"):
        expect(page.locator(table)).to_be_hidden()
    page.get_by_role("tab", name="Benchmark").click()
    expect(page.locator("#bench-table")).to_be_hidden()
    visible_headers = page.locator("table thead th:visible").all_inner_texts()
    assert not {"1", "2", "3"} & {h.strip() for h in visible_headers}, visible_headers


def test_replay_puts_per_token_beside_safe_on_one_slider(page, tmp_path):
    manifest = json.loads((TRACES / "index.json").read_text(encoding="utf-8"))
    events = [json.loads(line) for line in (TRACES / manifest[0]["file"]).read_text().splitlines()]
    starts = [i for i, e in enumerate(events) if e["kind"] == "run_started"]
    runs = [events[a:b] for a, b in zip(starts, [*starts[1:], len(events)])]
    tokens = {r[0]["strategy"]: sum(len(e["tokens"]) for e in r if e["kind"] == "text_committed") for r in runs}
    page.get_by_role("tab", name="Replay").click()
    expect(page.locator("#replay-run-b input")).to_have_value("2: safe")
    left, right = page.locator("#replay-transcript .tok"), page.locator("#replay-b-transcript .tok")
    expect(left).to_have_count(tokens["per-token"], timeout=30_000)
    expect(right).to_have_count(tokens["safe"])
    expect(page.locator("#replay-metrics")).to_contain_text("per-token")
    expect(page.locator("#replay-b-metrics")).to_contain_text("safe")
    for side in ("#replay-metrics", "#replay-b-metrics"):
        expect(page.locator(f"{side} .damage-line")).to_contain_text("non-canonical")
    damage = page.locator("#replay-damage")
    expect(damage.locator(".main-svg").first).to_be_attached(timeout=120_000)
    expect(damage.locator(".legendtext")).to_have_count(2)
    expect(page.locator("#replay-timeline")).to_be_hidden()  # one run's charts give way to the pair's damage
    step = page.locator("#replay-step input[type=number]")
    step.fill("20")
    step.press("Enter")
    expect(page.locator("#replay-status")).to_contain_text(re.compile(r"Token 20 of \d+, side by side"), timeout=30_000)
    expect(left).to_have_count(20)
    assert 20 <= right.count() < tokens["safe"]  # SAFE commits several tokens at once: the commit that reaches 20
    right.nth(2).click()
    expect(page.locator("#replay-b-details")).to_contain_text("token #2")
    page.screenshot(path=str(tmp_path / "replay-pair.png"), full_page=True)
    page.locator("#replay-run-b input").click()
    page.get_by_role("option", name="nothing: this run alone").click()
    expect(page.locator("#replay-b-transcript")).to_be_hidden(timeout=30_000)
    expect(page.locator("#replay-status")).to_contain_text("Event ")
    replay_safe_trace(page)  # a single-run trace replays as before: by events, with its own charts
    expect(page.locator("#replay-run-b")).to_be_hidden(timeout=30_000)
    expect(page.locator("#replay-timeline .main-svg").first).to_be_attached(timeout=120_000)
    expect(page.locator("#replay-status")).to_contain_text("Event ")
