"""The web app end to end: `python app.py` on a free local port, driven by Playwright in Debian's Chromium.

One app process and one browser serve the whole module; each test opens its own page (its own session).
Timeouts are generous because a 2-core CI box needs ~20 s to start the app and ~20 s for the first Plotly
render, and the first real run loads (on a fresh machine: converts) the embedded models.
"""

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("playwright")
from offline_pages import Offline, offline_context, token_texts  # noqa: E402
from page_runs import saved_traces  # noqa: E402
from playwright.sync_api import expect, sync_playwright  # noqa: E402
from servers import free_port  # noqa: E402
from tiny_pair import tiny_pair_folders  # noqa: E402

from components.examples import Examples  # noqa: E402
from safe_engine.data import TRACES_DIR  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
ROOT = Path(__file__).resolve().parents[1]
SAFE_TRACE = TRACES_DIR / "1-safe-factorial.jsonl"
PLOT_MS = 120_000
RUN_MS = 420_000  # the first run loads the models (minutes if they were never converted on this machine)

# Outside CI a machine without Chromium skips these; CI installs it (scripts/setup.sh --tests) and must run them.
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists() and os.environ.get("CI") != "true",
    reason="Debian chromium is not installed (bash scripts/setup.sh --tests)",
)


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    port = free_port()
    log = open(tmp_path_factory.mktemp("app") / "app.log", "w")
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "GRADIO_TEMP_DIR": str(tmp_path_factory.mktemp("gradio"))}
    proc = subprocess.Popen(
        [
            sys.executable,
            "app.py",
            "--port",
            str(port),
            "--traces",
            str(saved_traces(tmp_path_factory.mktemp("saved"))),
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(f"{url}/gradio_api/info", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the app did not start; see {log.name}")
                time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, app_url):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(app_url)
    expect(page.locator("#run")).to_be_visible(timeout=60_000)
    yield page
    page.close()


def _run(page, prompt: str, max_new: int, models: str | None = None):
    page.locator("#prompt textarea").fill(prompt)
    if models is not None:
        page.locator("#models textarea").fill(models)
    page.locator("#max-new input").fill(str(max_new))
    page.locator("#run").click()


def replay_safe_trace(page):
    """In the Replay tab, switch from the first shipped trace (a per-token collapse) to the SAFE factorial run."""
    page.locator("#replay-trace input").click()
    page.get_by_role("option", name=SAFE_TRACE.stem).click()


def test_replay_opens_on_a_real_collapse_and_steps_through_a_shipped_trace(page, tmp_path):
    events = [json.loads(line) for line in SAFE_TRACE.read_text().splitlines()]
    committed = sum(len(e["tokens"]) for e in events if e["kind"] == "text_committed")
    manifest = json.loads((SAFE_TRACE.parent / "index.json").read_text(encoding="utf-8"))
    assert "why-per-token-fails" in manifest[0]["file"]
    page.get_by_role("tab", name="Replay").click()
    expect(page.locator("#replay-caption")).to_contain_text(manifest[0]["caption"])
    expect(page.locator("#replay-run")).to_be_visible()  # per-token, SAFE and the drafter alone
    expect(page.locator("#replay-transcript .tok.damage").first).to_be_attached(timeout=30_000)  # per-token opens
    replay_safe_trace(page)
    expect(page.locator("#replay-caption")).to_contain_text(
        next(e["caption"] for e in manifest if e["file"] == SAFE_TRACE.name), timeout=30_000
    )
    tokens = page.locator("#replay-transcript .tok")
    expect(tokens).to_have_count(committed, timeout=30_000)
    expect(page.locator("#replay-timeline .main-svg").first).to_be_attached(timeout=PLOT_MS)
    for cls in ("cons", "oov", "ens"):
        expect(page.locator(f"#replay-transcript .tok.{cls}").first).to_be_attached()
    tokens.nth(3).click()
    expect(page.locator("#replay-details")).to_contain_text("token #3")
    step = page.locator("#replay-step input[type=number]")
    step.fill("12")
    step.press("Enter")
    expect(page.locator("#replay-status")).to_contain_text("Event 12 of")
    assert tokens.count() < committed
    page.screenshot(path=str(tmp_path / "replay.png"), full_page=True)


def test_uploaded_trace_renders_markup_as_text(page, tmp_path):
    events = [json.loads(line) for line in SAFE_TRACE.read_text().splitlines()]
    evil = "<script>window.pwned=1</script><img src=x onerror=window.pwned=1>${1+1}`"
    for event in events:
        if event["kind"] == "text_committed":
            event["tokens"][0]["text"] = evil
    trace = tmp_path / "evil.jsonl"
    trace.write_text("".join(json.dumps(e) + "\n" for e in events))
    page.get_by_role("tab", name="Replay").click()
    page.locator("#replay-upload input[type=file]").set_input_files(str(trace))
    expect(page.locator("#replay-transcript .tok").first).to_contain_text(evil, timeout=30_000)
    assert page.locator("#replay-transcript script, #replay-transcript img").count() == 0
    assert page.evaluate("window.pwned") is None


def test_replays_download_page_holds_what_the_app_showed_and_reopens_in_replay(page, browser, tmp_path):
    page.get_by_role("tab", name="Replay").click()  # opens on the collapse: per-token beside SAFE
    shown = [page.locator(f"#{name}-transcript .tok") for name in ("replay", "replay-b")]
    expect(shown[1].first).to_be_attached(timeout=30_000)
    texts = [token_texts(tokens) for tokens in shown]
    with page.expect_download() as download:
        page.locator("#replay-page").click()
    saved = tmp_path / download.value.suggested_filename
    download.value.save_as(saved)
    assert saved.suffix == ".html"
    offline, context = Offline(), offline_context(browser)
    sent = offline.open(context, saved)
    expect(sent.locator("[data-figure] .main-svg").first).to_be_attached(timeout=PLOT_MS)
    runs = sent.locator("[data-run]")
    assert [token_texts(runs.nth(i).locator(".transcript .tok[data-i]")) for i in range(2)] == texts
    sent.locator("[data-run] .transcript .tok[data-i]").nth(5).click()
    expect(sent.locator("#r0-details")).to_contain_text("token #5 · round")
    assert offline.outside == [] and offline.errors == []
    context.close()
    page.locator("#replay-trace input").click()  # away from the collapse, then the page back in through the upload
    page.get_by_role("option", name=SAFE_TRACE.stem).click()
    expect(shown[1]).to_have_count(0, timeout=30_000)
    page.locator("#replay-upload input[type=file]").set_input_files(str(saved))
    expect(shown[1]).to_have_count(len(texts[1]), timeout=30_000)
    expect(shown[0]).to_have_count(len(texts[0]))


def test_a_link_opens_a_shipped_or_saved_trace_in_replay(browser, app_url):
    tab = browser.new_page(viewport={"width": 1400, "height": 1000})
    for name, committed in (("1-safe-factorial", 40), ("saved-run.jsonl", 40)):
        tab.goto(f"{app_url}/?trace={name}")
        expect(tab.locator("#replay-transcript .tok")).to_have_count(committed, timeout=60_000)
        expect(tab.locator("#replay-status")).to_contain_text("Event 69 of 69")
        expect(tab.locator("#replay-trace input")).to_have_value(name.removesuffix(".jsonl"))
    tab.close()


@pytest.mark.parametrize(
    "query, message",
    [
        ("../../etc/passwd", "is not a trace name"),
        ("..%2F..%2Fetc%2Fpasswd", "is not a trace name"),
        ("%252E%252E%252Foutside%252Fsecret", "is not a trace name"),
        ("/etc/passwd", "is not a trace name"),
        ("escape", "points outside its folder"),
        ("no-such-trace", "no trace named “no-such-trace”"),
    ],
)
def test_a_link_to_anything_else_is_a_message(browser, app_url, query, message):
    tab = browser.new_page()
    tab.goto(f"{app_url}/?trace={query}")
    expect(tab.locator("#replay-status")).to_contain_text(message, timeout=60_000)
    expect(tab.locator("#replay-status")).to_contain_text("Could not open the link's trace")
    assert "Traceback" not in tab.content()
    tab.close()


def test_an_example_button_fills_the_prompt_its_length_and_its_stop_sequence(page):
    examples = Examples.read(ROOT / "assets" / "examples.json")
    arithmetic = next(e for e in examples.live if e.label == "arithmetic")
    page.get_by_role("button", name="arithmetic", exact=True).click()  # Live's (Compare's are others)
    expect(page.locator("#prompt textarea")).to_have_value(arithmetic.prompt)
    expect(page.locator("#max-new input")).to_have_value(str(arithmetic.max_new_tokens))
    expect(page.locator("#stop-at textarea")).to_have_value("\\n")  # the line break, as the box writes it
    expect(page.locator(".example-notes").first).to_contain_text(examples.cannot_show[:40])


def test_bad_input_shows_a_message_and_no_trace(page):
    _run(page, "   ", 16)
    expect(page.locator("#live-status")).to_contain_text("the prompt is empty", timeout=30_000)
    _run(page, "Hello", 16, models="embedded:no-such-model")
    expect(page.locator("#live-status")).to_contain_text("unknown embedded model", timeout=30_000)
    _run(page, "Hello", 100_000, models="embedded:gemma-3-270m\nembedded:smollm2-135m-instruct")
    expect(page.locator("#live-status")).to_contain_text("Max new tokens: a whole number from 1 to 512", timeout=30_000)
    assert "Traceback" not in page.content()


@pytest.mark.real_models
def test_live_run_streams_coloured_tokens_and_charts(page, browser, app_url, tmp_path):
    expect(page.locator("#live-timeline .main-svg").first).to_be_attached(timeout=PLOT_MS)  # warm Plotly first
    _run(page, "The capital of Madagascar is", 16)
    expect(page.locator("#live-status")).to_contain_text("Done", timeout=RUN_MS)
    tokens = page.locator("#live-transcript .tok")
    assert 1 <= tokens.count() <= 16
    classes = set(" ".join(tokens.evaluate_all("els => els.map(e => e.className)")).split())
    assert classes & {"cons", "oov", "ens"}, classes
    expect(page.locator("#live-metrics")).to_contain_text("E/T")
    expect(page.locator("#live-timeline .main-svg").first).to_be_attached(timeout=PLOT_MS)
    expect(page.locator("#live-split .main-svg").first).to_be_attached(timeout=PLOT_MS)
    expect(page.locator("#live-download")).to_be_enabled()
    with page.expect_download() as download:  # the page holds the tokens the app shows
        page.locator("#live-page").click()
    download.value.save_as(tmp_path / "live.html")
    offline, context = Offline(), offline_context(browser)
    sent = offline.open(context, tmp_path / "live.html")
    assert token_texts(sent.locator("[data-run] .transcript .tok[data-i]")) == token_texts(tokens)
    assert offline.outside == [] and offline.errors == []
    context.close()
    tokens.first.click()
    expect(page.locator("#live-details")).to_contain_text("token #0")
    page.screenshot(path=str(tmp_path / "live.png"), full_page=True)
    other = browser.new_page()  # a second session sees none of the first one's run
    other.goto(app_url)
    expect(other.locator("#live-metrics")).to_contain_text("No run yet", timeout=60_000)
    assert other.locator("#live-transcript .tok").count() == 0
    other.close()


@pytest.mark.real_models
def test_stop_ends_a_run_within_a_round(page):
    expect(page.locator("#live-timeline .main-svg").first).to_be_attached(timeout=PLOT_MS)
    _run(page, "Write a Python function that returns the factorial of n.", 400)
    tokens = page.locator("#live-transcript .tok")
    expect(tokens.nth(4)).to_be_attached(timeout=RUN_MS)
    page.locator("#stop").click()
    expect(page.locator("#live-status")).to_contain_text("stopped", timeout=60_000)
    count = tokens.count()
    time.sleep(3)
    assert tokens.count() == count < 400
    expect(page.locator("#live-metrics")).to_contain_text("finished: stopped")
    _run(page, "Hi", 2)  # the app is still usable
    expect(page.locator("#live-status")).to_contain_text(
        re.compile(r"Done \((max new tokens reached|the model ended)"), timeout=RUN_MS
    )


@pytest.mark.real_models
def test_compare_runs_every_strategy_side_by_side(page, tmp_path):
    page.locator("#max-new input").fill("6")  # the Compare tab uses the Live tab's settings
    page.get_by_role("tab", name="Compare").click()
    page.locator("#compare-prompt textarea").fill("The capital of Madagascar is")
    page.locator("#compare-run").click()
    expect(page.locator("#compare-status")).to_contain_text("Done", timeout=RUN_MS)
    cards = page.locator("#compare-grid .card")
    expect(cards).to_have_count(4)
    expect(cards.nth(2)).to_contain_text("per-token")
    expect(page.locator("#compare-table")).to_contain_text("safe")
    expect(page.locator("#compare-bars .main-svg").first).to_be_attached(timeout=PLOT_MS)
    expect(page.locator("#compare-csv")).to_be_enabled()
    expect(page.locator("#compare-page")).to_be_enabled()
    damage = page.locator("#compare-damage")
    expect(damage.locator(".main-svg").first).to_be_attached(timeout=PLOT_MS)
    expect(damage).to_contain_text("non-canonical tokens")
    expect(damage).to_contain_text("KL (nats)")
    expect(damage.locator(".legendtext")).to_have_count(4)  # one line per run
    expect(page.locator("#compare-table")).to_contain_text("drafter non-canonical")
    expect(page.locator("#compare-table")).to_contain_text("longest token run")
    measured = page.locator("#compare-measured")
    expect(measured).to_contain_text(
        re.compile(r"SAFE ensembled \d+ of \d+ tokens \(E/T \d+%\) and took \d+\.\d\d× the wall time")
    )
    expect(measured).to_contain_text("OOV-like predictions: per-token")
    assert "about as much as" not in page.content()
    page.screenshot(path=str(tmp_path / "compare.png"), full_page=True)


def _method(page, strategy: str, method: str):
    page.locator("#strategy").get_by_label(strategy, exact=True).check()
    page.get_by_text("More options").click()
    page.locator("#ensemble-method").get_by_label(method, exact=True).check()


def _pin_an_ensembled_token(page, shows: str):
    """Click the first ensembled token of the Live run and wait for the details to hold `shows`."""
    expect(page.locator("#live-status")).to_contain_text("Done", timeout=RUN_MS)
    ensembled = page.locator("#live-transcript .tok.ens")
    expect(ensembled.first).to_be_attached()
    ensembled.first.click()
    expect(page.locator("#live-details")).to_contain_text(shows, timeout=30_000)
    assert "Traceback" not in page.content()


@pytest.mark.real_models
def test_core_runs_live_and_in_compare_and_shows_its_weights(page, tmp_path):
    """CoRE per-token on the embedded pair: a pinned ensembled token shows the models' consistency weights;
    Compare runs CoRE with the Live tab's settings, every strategy side by side."""
    _method(page, "per-token", "core")
    _run(page, "The capital of Madagascar is", 6)
    _pin_an_ensembled_token(page, "CoRE's model weights (after the anchor clip): gemma-3-270m")
    expect(page.locator("#live-details")).to_contain_text("score smollm2-135m-instruct")
    page.get_by_role("tab", name="Compare").click()
    page.locator("#compare-prompt textarea").fill("The capital of Madagascar is")
    page.locator("#compare-run").click()
    expect(page.locator("#compare-status")).to_contain_text("Done", timeout=RUN_MS)
    expect(page.locator("#compare-grid .card")).to_have_count(4)
    expect(page.locator("#compare-table")).to_contain_text("per-token")
    page.screenshot(path=str(tmp_path / "core.png"), full_page=True)


def test_eva_runs_live_on_a_pair_given_as_folders_and_shows_its_mapping(page, tmp_path):
    """EVA per-token on two tiny random-weight models typed in as folders (their alignment is built in a
    moment): a pinned ensembled token shows the assisting model's tokens mapped into the drafter's vocabulary."""
    drafter, verifier = tiny_pair_folders(tmp_path)
    page.locator("#models textarea").fill(f"{drafter}\n{verifier}")
    page.locator("#drafter input").fill(drafter)
    page.locator("#drafter input").press("Enter")
    _method(page, "per-token", "eva")
    _run(page, "the answer is", 6)
    _pin_an_ensembled_token(page, "EVA: the assisting models' top tokens in the drafter's vocabulary")


def test_what_if_without_a_finished_run_says_so(page):
    page.locator("#whatif-run").click()
    expect(page.locator("#branch-status")).to_contain_text("no finished run to branch from", timeout=30_000)
    assert "Traceback" not in page.content()


@pytest.mark.real_models
def test_what_if_branch_forces_a_token_and_marks_the_first_difference(page, tmp_path):
    expect(page.locator("#live-timeline .main-svg").first).to_be_attached(timeout=PLOT_MS)
    _run(page, "The capital of Madagascar is", 8)
    expect(page.locator("#live-status")).to_contain_text("Done", timeout=RUN_MS)
    original = page.locator("#live-transcript .tok")
    count = original.count()
    page.locator("#whatif-run").click()
    expect(page.locator("#branch-status")).to_contain_text("pin a token", timeout=30_000)
    original.nth(2).click()
    expect(page.locator("#whatif-hint")).to_contain_text("token #2", timeout=30_000)
    expect(page.locator("#live-details")).to_contain_text("damage after the commit that holds it")
    page.locator("#whatif-choices label").first.click()
    expect(page.locator("#whatif-text textarea")).not_to_have_value("")
    expect(page.locator("#branch-section")).to_be_hidden()  # nothing to show before a branch starts
    page.locator("#whatif-run").click()
    expect(page.locator("#branch-section")).to_be_visible(timeout=RUN_MS)
    expect(page.locator("#branch-status")).to_contain_text("first differ at token #2", timeout=RUN_MS)
    forced = page.locator("#branch-transcript .tok.forced")
    expect(forced).to_have_count(1)
    expect(forced).to_have_attribute("data-i", "2")
    expect(forced).to_have_class(re.compile(r"\bdiverge\b"))
    expect(page.locator("#live-transcript .tok.diverge")).to_have_attribute("data-i", "2")
    assert original.count() == count  # the original run stays as it was
    expect(page.locator("#branch-metrics")).to_contain_text("non-canonical")
    expect(page.locator("#branch-damage .main-svg").first).to_be_attached(timeout=PLOT_MS)
    expect(page.locator("#branch-damage .legendtext")).to_have_count(2)
    expect(page.locator("#branch-page")).to_be_enabled()
    page.screenshot(path=str(tmp_path / "what-if.png"), full_page=True)
    page.locator("#whatif-text textarea").fill("")
    page.locator("#whatif-run").click()
    expect(page.locator("#branch-status")).to_contain_text("pick a candidate or type", timeout=30_000)
    expect(forced).to_have_count(1)  # a bad input keeps the branch already shown
    _run(page, "The capital of Madagascar is", 0)  # a Live run refused: the branch stays too
    expect(page.locator("#live-status")).to_contain_text("max new tokens", timeout=30_000)
    expect(page.locator("#branch-section")).to_be_visible()
    _run(page, "The capital of Madagascar is", 4)  # a new Live run: the old branch no longer applies
    expect(page.locator("#live-status")).to_contain_text("Done", timeout=RUN_MS)
    expect(page.locator("#branch-section")).to_be_hidden(timeout=30_000)
    expect(page.locator("#branch-status")).to_contain_text("No branch yet")
    assert "Traceback" not in page.content()


@pytest.mark.real_models
def test_tokenizers_tab_shows_both_tokenizations(page, tmp_path):
    page.get_by_role("tab", name="Tokenizers").click()
    expect(page.get_by_role("tab", name="Tokenizers")).to_have_count(1)
    page.locator("#tok-text textarea").fill("Reykjavík <script>x</script>")
    page.locator("#tok-run").click()
    expect(page.locator("#tok-pair .td-tok").first).to_be_attached(timeout=RUN_MS)
    assert page.locator("#tok-pair script").count() == 0
    expect(page.locator("#tok-stats")).to_contain_text("shared boundaries")
    page.locator("#tok-corpus textarea").fill("It was unbelievable in Ouagadougou. " * 3 + "<b>bold</b> 🚀")
    page.locator("#tok-scan").click()
    expect(page.locator("#tok-spans")).to_contain_text("Ouagadougou", timeout=RUN_MS)
    expect(page.locator("#tok-summary")).to_contain_text("word-list agreement")
    with page.expect_download() as download:
        page.locator("#tok-csv").click()
    rows = download.value.path().read_text(encoding="utf-8").splitlines()
    assert rows[0].startswith("span,count,breaks,break rate") and any(r.startswith("Ouagadougou,3,3") for r in rows)
    page.screenshot(path=str(tmp_path / "tokenizers.png"), full_page=True)


@pytest.mark.real_models
def test_pinning_an_oov_like_token_shows_the_tokenizations_inline(page, tmp_path):
    page.get_by_role("tab", name="Replay").click()
    replay_safe_trace(page)
    oov = page.locator("#replay-transcript .tok.oov").first
    expect(oov).to_be_attached(timeout=30_000)
    oov.click()
    expect(page.locator("#replay-details .td-tok.oov").first).to_be_attached(timeout=RUN_MS)
    expect(page.locator("#replay-details")).to_contain_text("smollm2-135m-instruct")
    page.locator("#replay-details").screenshot(path=str(tmp_path / "pinned.png"))
