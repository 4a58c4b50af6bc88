"""The matrix: five real tokenizer families (Gemma 3, SmolLM2, Llama 3, Mistral 7B, Llama 2), every
ordered pair. Alignment invariants on the hostile corpus, OOV-like sets as tokdiff shows them, a full
single / per-token / SAFE decode with tiny random-weight models that carry the real tokenizers, and
tokdiff's word-list agreement, which docs/tokenizers.md publishes.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
from families import FAMILIES, tokenizer_spec
from hostile_corpus import hostile_texts
from tiny_models import tiny_model

from safe_engine.analysis.tokdiff import common_words, load_vocabs, pair_view, word_agreement
from safe_engine.cli import main
from safe_engine.contract.events import EnsemblePoint, PositionVerified, RunFinished, TextCommitted
from safe_engine.strategies.decoding import DecodeConfig, decode
from safe_engine.tokenization.alignment import TokenBytes, oov_like, tokenize

pytestmark = pytest.mark.families

ORDERED_PAIRS = list(itertools.permutations(FAMILIES, 2))
PROMPT = "Write one sentence about tokenizers."
TOKENIZERS_DOC = Path(__file__).resolve().parents[1] / "docs" / "tokenizers.md"
# What each family's metadata says ends a response: its EOS, and the token its chat template closes an
# assistant turn with (Gemma 3's GGUF-converted base has no template; its <end_of_turn> is a known marker).
END_TOKENS = {
    "gemma-3": {"<eos>", "<end_of_turn>"},
    "smollm2": {"<|im_end|>"},
    "llama-3": {"<|end_of_text|>", "<|eot_id|>"},
    "mistral-7b": {"</s>"},
    "llama-2": {"</s>"},
}
PADDED = {"gemma-3": 64}  # a padded output layer, as in Gemma 3's larger checkpoints (262,208 rows)


@pytest.fixture(scope="module")
def vocabs():
    """Through tokdiff's per-process cache, which the command-line test reuses."""
    return dict(zip(FAMILIES, load_vocabs([tokenizer_spec(family) for family in FAMILIES]).values()))


@pytest.fixture(scope="module")
def corpus(vocabs):
    return hostile_texts([vocab.tokenizer for vocab in vocabs.values()])


@pytest.fixture(scope="module")
def models(vocabs, tmp_path_factory):
    """One tiny random-weight causal LM per family with the real tokenizer (folder named after the family)."""
    root = tmp_path_factory.mktemp("families")
    return {
        family: tiny_model(
            root / family,
            vocab.tokenizer,
            arch="gemma3" if family == "gemma-3" else "llama",
            seed=seed,
            extra_rows=PADDED.get(family, 0),
            layers=1,
        )
        for seed, (family, vocab) in enumerate(vocabs.items())
    }


# ---------------------------------------------------------------- alignment


def expected_bytes(vocab: TokenBytes, text: str) -> bytes:
    """The text as the tokenizer reads it: SentencePiece families read a written "▁" as a space."""
    return (text.replace("▁", " ") if vocab.kind == "sentencepiece" else text).encode("utf-8")


@pytest.mark.parametrize("family", FAMILIES)
def test_tokens_lie_end_to_end_on_the_exact_bytes(vocabs, corpus, family):
    vocab = vocabs[family]
    for text in corpus:
        raw, tok = text.encode("utf-8"), tokenize(vocab, text)
        assert vocab.join(tok.ids) == expected_bytes(vocab, text), text
        starts, ends = [s for s, _ in tok.spans], [e for _, e in tok.spans]
        assert starts == [0] + ends[:-1] and ends[-1] == len(raw), text
        assert not set(tok.ids) & vocab.special_ids, f"special token (BOS? a special string?) in {text!r}"
        assert tok.boundaries == frozenset([0, *ends])
        for i, (s, e) in enumerate(tok.spans):
            if "▁" not in text:
                assert raw[s:e] == vocab[tok.ids[i]], text
            assert tok.token_starting_at(s) == i or s == e


@pytest.mark.parametrize("family", FAMILIES)
def test_byte_fallback_pieces_sit_on_their_bytes(vocabs, family):
    vocab = vocabs[family]
    text = "a 𓀀 b"  # a hieroglyph no vocabulary here has as a piece
    tok, raw = tokenize(vocab, text), text.encode("utf-8")
    glyph = raw.index("𓀀".encode())
    inside = [(s, e) for s, e in tok.spans if glyph < e and s < glyph + 4]
    assert vocab.join(tok.ids) == raw and all(e - s <= 4 for s, e in inside)
    if vocab.kind == "sentencepiece":  # <0xNN> pieces, one byte each
        pieces = [i for i, (s, e) in zip(tok.ids, tok.spans) if (s, e) in inside]
        assert set(pieces) <= vocab.byte_piece_ids and inside == [(glyph + k, glyph + k + 1) for k in range(4)]
    for piece in set(tok.ids):
        assert vocab.join(vocab.encode_bytes(vocab[piece])) == vocab[piece]


@pytest.mark.parametrize("a, b", ORDERED_PAIRS)
def test_oov_like_sets_match_tokdiff_both_ways(vocabs, corpus, a, b):
    for text in corpus:
        view = pair_view(text, {a: vocabs[a], b: vocabs[b]})
        swapped = pair_view(text, {b: vocabs[b], a: vocabs[a]})
        ta, tb = tokenize(vocabs[a], text), tokenize(vocabs[b], text)
        flagged = [span for span, flag in zip(ta.spans, oov_like(ta.spans, tb)) if flag]
        a_to_b = view.oov_like[f"{a}->{b}"]
        assert [(t.start_byte, t.end_byte) for t in a_to_b] == flagged, text
        assert a_to_b == swapped.oov_like[f"{a}->{b}"] and view.shared == swapped.shared
        # Each side's OOV-like tokens end exactly at its one-sided boundaries.
        assert {t.end_byte for t in a_to_b} == view.only(a)
        assert {t.end_byte for t in view.oov_like[f"{b}->{a}"]} == view.only(b)


# ---------------------------------------------------------------- metadata and decoding


@pytest.mark.parametrize("family", FAMILIES)
def test_special_tokens_come_from_the_metadata(models, family):
    lm = models[family]
    tokenizer = lm.tokenizer
    assert {tokenizer.convert_ids_to_tokens(i) for i in lm.eos_ids} == END_TOKENS[family]
    ids = lm.encode_prompt(PROMPT)  # chat template where the family has one, else plain text
    assert ids[0] == tokenizer.bos_token_id and ids[1] != tokenizer.bos_token_id  # BOS exactly once
    assert lm.model.config.vocab_size == len(tokenizer) + PADDED.get(family, 0)


def run(models, strategy):
    events = list(decode(models, PROMPT, DecodeConfig(strategy=strategy, max_new_tokens=32)))
    assert isinstance(events[-1], RunFinished)
    return events, events[-1]


def check_events(events, finished, drafter):
    """Offsets index the committed text, positions only grow, ids are real tokens, the text is UTF-8."""
    text = "".join(e.delta for e in events if isinstance(e, TextCommitted))
    assert text == finished.text and text.encode("utf-8").decode("utf-8") == text
    tokens = [t for e in events if isinstance(e, TextCommitted) for t in e.tokens]
    assert len(tokens) == finished.stats["tokens"] <= 32
    assert len(tokens) == 32 or finished.stop_reason == "eos"
    starts = [t.start for t in tokens]
    assert starts == sorted(starts) and all(t.start <= t.end <= len(text) for t in tokens)
    for t in tokens:
        assert max(t.ids) < len(drafter.tokenizer)
        if t.end > t.start and "<0x" not in t.text and "\ufffd" not in text[t.start : t.end]:
            assert text[t.start : t.end] == t.text
    for kind in (PositionVerified, EnsemblePoint):
        positions = [e.position for e in events if isinstance(e, kind)]
        assert positions == sorted(set(positions))
    return tokens


@pytest.mark.parametrize("family", FAMILIES)
def test_single_decode_32_tokens(models, family):
    """`single` runs the drafter alone: one run per family stands for each of its ordered pairs."""
    events, finished = run([models[family]], "single")
    assert {t.decision for t in check_events(events, finished, models[family])} == {"accepted"}


@pytest.mark.parametrize("a, b", ORDERED_PAIRS)
def test_per_token_and_safe_decode_32_tokens(models, a, b):
    events, finished = run([models[a], models[b]], "per-token")
    tokens = check_events(events, finished, models[a])
    ensembled = sum(t.decision == "ensembled" for t in tokens)
    assert all(t.decision == "ensembled" or t.reason == "inside a character" for t in tokens)
    assert finished.stats["e_t"] == pytest.approx(ensembled / len(tokens))
    assert ensembled == sum(isinstance(e, EnsemblePoint) for e in events)

    events, finished = run([models[a], models[b]], "safe")
    tokens = check_events(events, finished, models[a])
    assert 0 <= finished.stats["e_t"] <= 1
    assert finished.stats["ensembled"] == sum(t.decision == "ensembled" for t in tokens)


# ---------------------------------------------------------------- tokdiff and the published table


@pytest.mark.parametrize("a, b", ORDERED_PAIRS)
def test_tokdiff_pair_view_and_word_agreement(vocabs, a, b, capsys):
    text = "It was unbelievable in Ouagadougou, 東京 😀!"
    view = pair_view(text, {a: vocabs[a], b: vocabs[b]})
    assert set(view.tokens) == {a, b} and 0 <= view.counts()["shared_ratio"] <= 1
    agreement = word_agreement({a: vocabs[a], b: vocabs[b]})
    assert agreement.words == len(common_words()) and 0 < agreement.rate < 1
    for row in agreement.differing[:50]:
        assert row.pieces[a] != row.pieces[b] and "".join(row.pieces[a].split("|")) == "␣" + row.span
    # The command line takes the same tokenizers by spec (converted folders hold a tokenizer only).
    assert main(["tokdiff", "--models", tokenizer_spec(a), tokenizer_spec(b), "--text", text, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["agreement"] == pytest.approx(agreement.rate)
    assert [t["text"] for t in data["tokens"][data["models"][0]]] == [t.text for t in view.tokens[a]]


def test_the_docs_publish_the_agreement_table(vocabs):
    doc = TOKENIZERS_DOC.read_text(encoding="utf-8")
    published = {}
    for line in doc.splitlines():
        match = re.match(r"\| (\S+) \| (.+) \|$", line)
        if match and match.group(1) in FAMILIES:
            cells = [c.strip() for c in match.group(2).split("|")]
            published.update({(match.group(1), f): c for f, c in zip(FAMILIES, cells)})
    for a, b in itertools.combinations(FAMILIES, 2):
        rate = word_agreement({a: vocabs[a], b: vocabs[b]}).rate
        assert published.get((a, b)) == published.get((b, a)) == f"{100 * rate:.1f} %", (a, b)
    assert f"All five agree on {100 * word_agreement(vocabs).rate:.1f} %" in doc
    assert f"the {len(common_words()):,} alphabetic words" in doc
