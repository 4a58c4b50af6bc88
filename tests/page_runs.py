"""Runs and folders for the page tests (tests/test_pages.py, test_ui_pages.py, test_page_browser.py and the app's
browser tests): a what-if branch beside the run it branched from, decoded by two tiny models with different
tokenizers; a recorded trace whose every string a model or a person wrote is a hostile one; a --traces folder
with a symlink leading out of it; and a page's tags read back from its HTML."""

from __future__ import annotations

import itertools
import os
from html.parser import HTMLParser
from pathlib import Path

from hostile_corpus import HOSTILE
from tiny_models import char_tokenizer, tiny_model_folder, unigram_tokenizer

from safe_engine.contract.config import DecodeConfig
from safe_engine.data import TRACES_DIR
from safe_engine.models.cache import load_models
from safe_engine.pages.traces import read_trace
from safe_engine.strategies.decoding import decode

PROMPT = "the cat sat on"
WORDS = [" the", " cat", " sat", " on", " mat", " dog", " at", "the", "cat", "sat", "on", "ma", "t"]
# Markup that would run or reshape a page if it were not escaped, then the tokenizer traps.
MARKUP = [
    "</script><script>window.pwned=1</script>",
    "<img src=x onerror=window.pwned=1>",
    "</template><script>window.pwned=1</script>",
    "<!-- <script>window.pwned=1</script>",
    '"><svg onload=window.pwned=1>',
    "${1+1}` &amp; &lt;b&gt;",
]
TRAPS = MARKUP + HOSTILE


def tiny_specs(root: Path) -> list[str]:
    """A drafter with whole-word tokens and a verifier that spells by characters."""
    letters = char_tokenizer()
    letters.add_tokens(["H"])
    words = tiny_model_folder(root / "words", unigram_tokenizer(WORDS), seed=2)
    chars = tiny_model_folder(root / "chars", letters, seed=1)
    return [str(words), str(chars)]


def what_if(specs: list[str], at: int = 2, text: str = " dog") -> tuple[list[dict], list[dict]]:
    """A SAFE run and its branch with `text` forced at token `at`: the events of both."""
    models = load_models(specs)
    config = DecodeConfig(strategy="safe", max_new_tokens=12)
    original = [e.to_dict() for e in decode(models, PROMPT, config)]
    branch = DecodeConfig(strategy="safe", max_new_tokens=12, force=((at, text),))
    return original, [e.to_dict() for e in decode(models, PROMPT, branch)]


def hostile_trace(name: str = "1-safe-factorial.jsonl") -> list[dict]:
    """A shipped trace with every token text, draft candidate, verifier token, union row and prompt replaced by
    one of `TRAPS`, in turn."""
    traps = itertools.cycle(TRAPS)
    events = read_trace(TRACES_DIR / name)
    for event in events:
        kind = event["kind"]
        if kind == "run_started":
            event["prompts"] = {model: next(traps) for model in event["prompts"]}
        elif kind == "tokens_drafted":
            for token in event["tokens"]:
                token["text"] = next(traps)
                for candidate in token["top_k"]:
                    candidate["text"] = next(traps)
        elif kind == "position_verified":
            event["token"] = next(traps)
            for verifier in event["verifiers"]:
                if verifier.get("token") is not None:
                    verifier["token"], verifier["argmax"] = next(traps), next(traps)
        elif kind == "ensemble_point":
            event["chosen"] = next(traps)
            for row in event["table"]:
                row["text"] = next(traps)
        elif kind == "text_committed":
            for token in event["tokens"]:
                token["text"] = next(traps)
                if token["drafted"] is not None:
                    token["drafted"] = next(traps)
    return events


def saved_traces(root: Path) -> Path:
    """A folder for the app's --traces: a saved trace, and a symlink to a trace outside the folder (a real one,
    so a read through the symlink would succeed)."""
    folder, outside = root / "traces", root / "outside"
    folder.mkdir()
    outside.mkdir()
    trace = (TRACES_DIR / "1-safe-factorial.jsonl").read_text(encoding="utf-8")
    (folder / "saved-run.jsonl").write_text(trace, encoding="utf-8")
    (outside / "secret.jsonl").write_text(trace, encoding="utf-8")
    os.symlink(outside / "secret.jsonl", folder / "escape.jsonl")
    return folder


def as_parsed(text: str) -> str:
    """A token's text as a browser reads it back from a transcript: HTML parsing turns every CR into \\n (the
    transcript marks a \\n with a glyph, which parts CR from LF) and drops NUL from text."""
    return text.replace("\r", "\n").replace("\x00", "")


class Tags(HTMLParser):
    """Every start tag of a document, and the text of each <script> element."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[tuple[dict, str]] = []
        self._script: dict | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._script = dict(attrs)
            self.scripts.append((self._script, ""))

    def handle_data(self, data):
        if self._script is not None:
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)

    def handle_endtag(self, tag):
        if tag == "script":
            self._script = None
