"""The README's screenshot: the app after a finished Live run, saved to docs/images/studio-run.png.

    python -m scripts.screenshot [--prompt TEXT] [--max-new-tokens N] [--out PATH] [--full-page]

Starts `python app.py --port <a free port>` on the embedded models, drives it with Playwright in Debian's
Chromium (headless; never `playwright install`), runs one short SAFE run in the "Ensemble live" tab, waits for it
to finish and for its charts, pins an ensembled token so its details show, and saves a PNG. The first run on a
machine converts the embedded models (minutes); later runs take about a minute. The picture is the first
screen of the page (the form, the transcript and the pinned token's details); `--full-page` takes the whole page
with every chart. Exit status 0 when the PNG was written; on failure the app's log is kept and its path printed.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import expect, sync_playwright

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "images" / "studio-run.png"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
PROMPT = "Write one sentence about the history of Kyoto."
START_S = 180  # a 2-core machine needs ~20 s to start the app
PLOT_MS = 120_000  # the first Plotly render
RUN_MS = 600_000  # the first run loads the models (converts them on a fresh machine)
VIEWPORT = {"width": 1440, "height": 1200}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(port: int, log) -> subprocess.Popen:
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "GRADIO_TEMP_DIR": tempfile.mkdtemp(prefix="shot-")}
    return subprocess.Popen(
        [sys.executable, "app.py", "--port", str(port)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )


def wait_until_up(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_S
    while True:
        try:
            urllib.request.urlopen(f"{url}/gradio_api/info", timeout=2)
            return
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"the app exited with status {proc.returncode}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"the app did not answer within {START_S} s") from None
            time.sleep(1)


def stop_app(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def shoot(url: str, prompt: str, max_new_tokens: int, out: Path, full_page: bool) -> None:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(url)
            expect(page.locator("#run")).to_be_visible(timeout=60_000)
            expect(page.locator("#live-timeline .main-svg").first).to_be_attached(timeout=PLOT_MS)
            page.locator("#prompt textarea").fill(prompt)
            page.locator("#max-new input").fill(str(max_new_tokens))
            page.locator("#run").click()
            expect(page.locator("#live-status")).to_contain_text("Done", timeout=RUN_MS)
            expect(page.locator("#live-metrics")).to_contain_text("E/T", timeout=30_000)
            for chart in ("#live-timeline", "#live-split"):
                expect(page.locator(f"{chart} .main-svg").first).to_be_attached(timeout=PLOT_MS)
            tokens = page.locator("#live-transcript .tok")
            expect(tokens.first).to_be_attached(timeout=30_000)
            ensembled = page.locator("#live-transcript .tok.ens")
            (ensembled.first if ensembled.count() else tokens.first).click()
            expect(page.locator("#live-details")).to_contain_text("token #", timeout=30_000)
            page.mouse.move(0, 0)  # no hover card over the picture
            page.evaluate("window.scrollTo(0, 0)")  # pinning scrolled the token into view; the picture starts on top
            page.wait_for_timeout(1_000)  # let the charts finish their transitions
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out), full_page=full_page)
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.screenshot", description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=OUT, help="where the PNG goes (default: %(default)s)")
    parser.add_argument("--full-page", action="store_true", help="the whole page, not only the first screen")
    args = parser.parse_args(argv)
    if not Path(CHROMIUM).exists():
        print(f"error: {CHROMIUM} is missing (bash scripts/setup.sh --tests installs it)", file=sys.stderr)
        return 2
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = Path(tempfile.gettempdir()) / f"studio-screenshot-{port}.log"
    with open(log_path, "w") as log:
        proc = start_app(port, log)
        try:
            wait_until_up(url, proc)
            shoot(url, args.prompt, args.max_new_tokens, args.out, args.full_page)
        except Exception as exc:
            print(f"error: {exc}; the app's log: {log_path}", file=sys.stderr)
            return 1
        finally:
            stop_app(proc)
    log_path.unlink(missing_ok=True)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
