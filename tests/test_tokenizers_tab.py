"""The Tokenizers tab without a browser: its examples, the corpus scan handler and CSV, the corpus summary,
and the aligned view a pinned OOV-like token shows in the live view's details."""

import json
import time
from pathlib import Path

import gradio as gr
import pandas as pd
import pytest
from tiny_models import unigram_tokenizer

from components.panel import tokenizations_html
from components.tokenizer_view import corpus_html
from components.tokenizers_tab import MAX_CORPUS_CHARS, TokenizersTab, corpus_text
from safe_engine.analysis.tokdiff import corpus_scan, load_vocabs, pair_view, vocab_overlap, word_agreement
from safe_engine.contract.errors import ConfigError
from safe_engine.data import TRACES_DIR
from safe_engine.pages.traces import read_trace
from safe_engine.pages.view import RunView
from safe_engine.tokenization.alignment import TokenBytes

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = json.loads((ROOT / "assets" / "tokenizer_examples.json").read_text(encoding="utf-8"))
SPECS = ["embedded:gemma-3-270m", "embedded:smollm2-135m-instruct"]
EVIL = "<script>alert(1)</script>"


def run_of(words: list[str], oov_at: int | None = None, specs: list[str] | None = None) -> RunView:
    """A one-round run committing `words` as tokens; the token at `oov_at` is OOV-like for "b"."""
    models = [
        {"name": name, "role": role} | ({"spec": spec} if specs else {})
        for name, role, spec in zip("ab", ("drafter", "verifier"), specs or SPECS)
    ]
    tokens, at = [], 0
    for i, word in enumerate(words):
        tokens.append(
            {
                "text": word,
                "start": at,
                "end": at + len(word),
                "ids": [i],
                "decision": "accepted",
                "drafted": None,
                "reason": None,
                "sharpened": False,
                "oov_like_for": ["b"] if i == oov_at else [],
            }
        )
        at += len(word)
    return RunView.of(
        [
            {
                "kind": "run_started",
                "strategy": "single",
                "drafter": "a",
                "models": models,
                "prompts": {},
                "config": {},
            },
            {"kind": "text_committed", "round": 1, "delta": "".join(words), "tokens": tokens, "elapsed_s": 1.0},
        ]
    )


def test_context_is_whole_words_around_the_token():
    words = ["Once"] + [f" word{i}" for i in range(60)]
    view = run_of(words)
    text = view.response
    for index in (0, 30, 60):
        window, offset = view.context(index, 100)
        token = view.tokens[index]
        assert window == text[offset : offset + len(window)] and len(window) <= 100
        assert offset <= token.start and token.end <= offset + len(window)
        assert offset == 0 or window[0] == " "  # starts at a space: the first word keeps its leading space
        assert offset + len(window) == len(text) or text[offset + len(window)] == " "  # ends before a space
    assert view.context(30, 100)[0].count("word") >= 10
    assert view.context(0, 1000) == (text, 0)


def test_corpus_text_prefers_the_file_and_is_bounded(tmp_path):
    file = tmp_path / "c.txt"
    file.write_text("from the file", encoding="utf-8")
    assert corpus_text("pasted", str(file)) == "from the file"
    assert corpus_text("pasted", None) == "pasted"
    cases = {("  ", None): "paste a text", ("x" * (MAX_CORPUS_CHARS + 1), None): "the limit here"}
    for args, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            corpus_text(*args)
    file.write_bytes(b"\xff\xfe bad")
    with pytest.raises(ConfigError, match="not UTF-8"):
        corpus_text("", str(file))
    file.write_bytes(b"x" * (4 * MAX_CORPUS_CHARS + 1))
    with pytest.raises(ConfigError, match="larger than"):
        corpus_text("", str(file))


def test_corpus_summary_counts_and_escapes():
    vocabs = {
        EVIL: TokenBytes(unigram_tokenizer(["hello", " world"])),
        "b": TokenBytes(unigram_tokenizer(["hel", "lo", " wor", "ld"])),
    }
    scan = corpus_scan(pair_view("hello world, hello world", vocabs))
    html = corpus_html(scan, word_agreement(vocabs, ["hello", "world", "a"]), vocab_overlap(vocabs))
    assert "<script" not in html and "&lt;script&gt;" in html
    assert "break at least once: 2 distinct" in html  # "hello" and "world"
    assert "word-list agreement: 33.3% of 3 common English words" in html
    assert (
        "tokens in the corpus: &lt;script&gt;alert(1)&lt;/script&gt; 6, b 10" in html
    )  # hello| world|,| |hello| world


def test_no_inline_tokenizations_without_an_oov_like_token_or_specs():
    assert tokenizations_html(run_of(["Hi", " there"], oov_at=None, specs=SPECS), 1) == ""
    assert tokenizations_html(run_of(["Hi", " there"], oov_at=1), 1) == ""  # the trace lacks the models' specs


@pytest.mark.real_models
def test_every_example_shows_a_mismatch_and_the_same_split_shows_none():
    vocabs = load_vocabs(SPECS)
    assert {e["label"] for e in EXAMPLES} >= {
        "rare place names",
        "numbers and symbols",
        "code",
        "emoji",
        "CJK",
        "mixed scripts",
    }
    for example in EXAMPLES:
        assert sum(map(len, pair_view(example["text"], vocabs).oov_like.values())) > 0, example["label"]
    assert sum(map(len, pair_view(" Antananarivo", vocabs).oov_like.values())) == 0
    assert sum(map(len, pair_view(" Ouagadougou", vocabs).oov_like.values())) > 0


@pytest.mark.real_models
def test_scan_handler_fills_the_tables_and_writes_the_csv(tmp_path):
    with gr.Blocks():
        tab = TokenizersTab(gr.Textbox(), EXAMPLES)
    corpus = "\n".join(e["text"] for e in EXAMPLES) + " " + EVIL
    out = tab.scan(corpus, None, "\n".join(SPECS))
    frame = out[tab.spans]
    assert len(frame) > 10 and list(frame.columns[:4]) == ["span", "count", "breaks", "break rate"]
    assert frame["breaks"].is_monotonic_decreasing and "Ouagadougou" in set(frame["span"])
    saved = pd.read_csv(out[tab.csv].value["path"], keep_default_na=False)
    assert saved["span"].tolist() == frame["span"].tolist()
    assert list(out[tab.rates]["direction"]) == [
        "gemma-3-270m->smollm2-135m-instruct",
        "smollm2-135m-instruct->gemma-3-270m",
    ]
    assert "word-list agreement: 94.2%" in out[tab.summary] and "vocabulary overlap" in out[tab.summary]
    with pytest.warns(UserWarning, match="paste a text"):  # gr.Warning outside a request
        bad = tab.scan("   ", None, "\n".join(SPECS))
    assert set(bad) == {tab.status} and "paste a text" in bad[tab.status]


@pytest.mark.real_models
def test_pinned_oov_like_token_shows_both_tokenizations_quickly():
    view = RunView.of(read_trace(TRACES_DIR / "1-safe-factorial.jsonl"))
    index = next(t.index for t in view.tokens if t.oov_like_for)
    tokenizations_html(view, index)  # loads the tokenizers once per process
    start = time.perf_counter()
    html = tokenizations_html(view, index)
    assert time.perf_counter() - start < 1.0
    assert 'class="td-tok' in html and "gemma-3-270m" in html and "smollm2-135m-instruct" in html
    assert "td-tok oov" in html
