"""The pages the app offers for download ("Download page (HTML)" beside each trace download), written once per
content: a page is about 5 MB (most of it plotly.js), and every visitor who opens the same shipped trace gets
the same page, so the file is named by a hash of what it holds and never written twice."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from safe_engine.pages.page import Page

PAGES_DIR = Path(tempfile.gettempdir()) / "safe-studio-pages"  # under the temp folder, which Gradio may serve


def page_file(page: Page, name: str) -> str:
    """The path of `page` as `name`.html, written unless a page with the same content already is."""
    html = page.html().encode("utf-8")
    path = PAGES_DIR / hashlib.sha256(html).hexdigest()[:24] / f"{name}.html"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, partial = tempfile.mkstemp(dir=path.parent, suffix=".part")  # sessions may write it at once
        with os.fdopen(handle, "wb") as out:
            out.write(html)
        os.replace(partial, path)
    return str(path)
