"""A page opened as someone would open a file they were sent, with the network cut off: from file://, every
request but file: and data: aborted and recorded, console errors and uncaught exceptions collected. Used by the
page tests in the browser (tests/test_page_browser.py) and the app's download test (tests/test_app_browser.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

ALLOWED = ("file:", "data:")
# The text each pinnable token of a transcript shows, its whitespace glyphs read back as what they stand for
# (␣ a space; ↵ and → stand before the \n or \t they mark) and a replaced draft left out: the token's own text.
TOKEN_TEXTS = """
els => els.map(el => {
  const copy = el.cloneNode(true);
  copy.querySelectorAll('del.was').forEach(d => d.remove());
  copy.querySelectorAll('.ws').forEach(w => w.replaceWith(w.textContent.replace(/␣/g, ' ').replace(/[↵→]/g, '')));
  return copy.textContent;
})
"""


@dataclass
class Offline:
    """What a page did while it was open: every request it made and every error it logged."""

    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def open(self, context, path: Path):
        page = context.new_page()
        page.on("request", lambda request: self.requests.append(request.url))
        page.on("console", lambda message: message.type == "error" and self.errors.append(message.text))
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.goto(path.resolve().as_uri())
        return page

    @property
    def outside(self) -> list[str]:
        return [url for url in self.requests if not url.startswith(ALLOWED)]


def offline_context(browser):
    """A browser context that can reach nothing but files and data: URLs."""
    context = browser.new_context(accept_downloads=True, viewport={"width": 1400, "height": 1000})
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(ALLOWED) else route.abort())
    return context


def token_texts(locator) -> list[str]:
    return locator.evaluate_all(TOKEN_TEXTS)
