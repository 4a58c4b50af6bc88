"""Byte spans, boundaries and SAFE's OOV-like test, on tokenizers built here and on the real pair."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import unigram_tokenizer

from safe_engine.tokenization.alignment import (
    CharIndex,
    TokenBytes,
    complete_utf8_prefix,
    display_piece,
    oov_like,
    shared_boundaries,
    tokenize,
)

PAPER_PIECES = [" Inc", "orr", "ect", " Incorrect", " is", " answer", " The"]


def pieces(vocab, tok):
    return [display_piece(vocab[i]) for i in tok.ids]


@pytest.fixture(scope="module")
def drafter_vocab():
    # No " Incorrect" piece: the drafter spells it " Inc|orr|ect".
    return TokenBytes(unigram_tokenizer([p for p in PAPER_PIECES if p != " Incorrect"]))


@pytest.fixture(scope="module")
def verifier_vocab():
    return TokenBytes(unigram_tokenizer(PAPER_PIECES))


def test_paper_example_inc_orr_ect(drafter_vocab, verifier_vocab):
    text = "The answer is Incorrect is"
    draft = tokenize(drafter_vocab, text)
    verify = tokenize(verifier_vocab, text)
    assert pieces(drafter_vocab, draft)[-4:] == [" Inc", "orr", "ect", " is"]
    assert pieces(verifier_vocab, verify)[-2:] == [" Incorrect", " is"]
    flags = dict(zip(pieces(drafter_vocab, draft), oov_like(draft.spans, verify)))
    assert flags[" Inc"] and flags["orr"] and not flags["ect"] and not flags[" is"]
    # Ensembling is allowed at a token only if the boundary *before* it exists for the verifier.
    starts = {pieces(drafter_vocab, draft)[j]: s in verify.boundaries for j, (s, _) in enumerate(draft.spans)}
    assert starts[" Inc"] and not starts["orr"] and not starts["ect"]
    # The verifier's own token at the allowed boundary is the whole word.
    inc_start = draft.spans[pieces(drafter_vocab, draft).index(" Inc")][0]
    assert display_piece(verifier_vocab[verify.ids[verify.token_starting_at(inc_start)]]) == " Incorrect"


def test_byte_fallback_pieces_have_exact_byte_spans(verifier_vocab):
    text = "The 😀 is 世界"
    tok = tokenize(verifier_vocab, text)
    assert b"".join(verifier_vocab[i] for i in tok.ids) == text.encode()
    assert "<0xF0>" in pieces(verifier_vocab, tok)  # the emoji falls back to bytes
    index = CharIndex(text)
    # A boundary inside the emoji is not a character boundary; the ones around it are.
    emoji_start = text.encode().index("😀".encode())
    assert emoji_start + 1 in tok.boundaries and not index.is_char_boundary(emoji_start + 1)
    assert index.char_of_byte(emoji_start + 4) == text.index("😀") + 1


def test_dummy_prefix_is_not_added_to_a_response():
    """Llama 2 / Mistral tokenizers put "▁" before any text they encode. A response continues its prompt,
    so its tokens spell exactly its bytes: " Incorrect" only where the text has the space."""
    vocab = TokenBytes(unigram_tokenizer(PAPER_PIECES, prepend="always"))
    assert vocab.tokenizer.tokenize("Incorrect is") == ["▁Incorrect", "▁is"]  # the tokenizer's own prefix
    tok = tokenize(vocab, "Incorrect is")
    assert vocab.join(tok.ids) == b"Incorrect is" and tok.spans[-1] == (9, 12)
    assert pieces(vocab, tokenize(vocab, " Incorrect is")) == [" Incorrect", " is"]
    assert vocab.encode_bytes(b"Incorrect") == tok.ids[:-1]


def test_special_token_strings_in_a_response_are_plain_text():
    tokenizer = unigram_tokenizer(PAPER_PIECES)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|turn|>"]})
    vocab = TokenBytes(tokenizer)
    text = "The answer<|turn|> is"
    assert tokenizer.convert_tokens_to_ids("<|turn|>") in tokenizer(text, add_special_tokens=False).input_ids
    tok = tokenize(vocab, text)
    assert vocab.join(tok.ids) == text.encode() and not set(tok.ids) & vocab.special_ids
    # The tokenizer the prompts are encoded with (maybe at the same time, in another thread) is untouched.
    assert tokenizer.backend_tokenizer.encode_special_tokens is False


def test_a_written_metaspace_character_is_read_as_a_space_with_exact_spans():
    vocab = TokenBytes(unigram_tokenizer(PAPER_PIECES))
    text = "The ▁answer 😀"  # SentencePiece normalizes the written "▁" to a space; the emoji falls back to bytes
    tok = tokenize(vocab, text)
    assert vocab.join(tok.ids) == text.replace("▁", " ").encode()
    assert [s for s, _ in tok.spans] == [0] + [e for _, e in tok.spans[:-1]] and tok.spans[-1][1] == len(text.encode())
    emoji = text.encode().index("😀".encode())
    assert [span for span in tok.spans if span[0] >= emoji] == [(emoji + i, emoji + i + 1) for i in range(4)]


def test_display_piece_and_utf8_prefix():
    assert display_piece("é".encode()[:1]) == "<0xC3>"
    assert display_piece(b"a\xe4\xb8") == "a<0xE4><0xB8>"
    assert complete_utf8_prefix("a世".encode()[:3]) == 1
    assert complete_utf8_prefix("a世".encode()) == 4


@pytest.mark.real_models
def test_real_pair_unbelievable(gemma, smollm):
    text = "It was unbelievable in Antananarivo"
    g, s = tokenize(gemma.vocab, text), tokenize(smollm.vocab, text)
    assert " unbelievable" in pieces(gemma.vocab, g)
    assert " unbelie" in pieces(smollm.vocab, s) and "vable" in pieces(smollm.vocab, s)
    smol_flags = dict(zip(pieces(smollm.vocab, s), oov_like(s.spans, g)))
    gemma_flags = dict(zip(pieces(gemma.vocab, g), oov_like(g.spans, s)))
    assert smol_flags[" unbelie"] and not smol_flags["vable"]
    assert not gemma_flags[" unbelievable"]
    assert text.encode().index(b" unbelievable") + len(" unbelie") not in shared_boundaries([g, s])


@pytest.mark.real_models
def test_real_pair_emoji_and_cjk_split_inside_characters(gemma, smollm):
    text = "Tokyo 東京 😀!"
    g, s = tokenize(gemma.vocab, text), tokenize(smollm.vocab, text)
    index = CharIndex(text)
    mid_char = [b for b in s.boundaries if not index.is_char_boundary(b)]
    assert mid_char, "SmolLM2's byte-level BPE splits CJK/emoji inside characters"
    assert all(flag for (_, end), flag in zip(s.spans, oov_like(s.spans, g)) if end in mid_char)


@pytest.mark.real_models
@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_real_tokenizers_spans_cover_the_text_exactly(gemma, smollm, text):
    for lm in (gemma, smollm):
        tok = tokenize(lm.vocab, text)
        joined, raw = lm.vocab.join(tok.ids), text.encode()
        # Exact, unless the vocabulary cannot spell some byte at all (SmolLM2 lacks e.g. 0xF1).
        assert joined == raw or len(joined) < len(raw)
        ends = [e for _, e in tok.spans]
        assert ends == sorted(ends) and all(0 <= s <= e <= len(raw) for s, e in tok.spans)


@pytest.mark.real_models
def test_regular_pieces_win_over_byte_fallback_pieces(gemma):
    """Gemma spells "2", " " and "." both as byte pieces (<0x32>, low ids) and as regular pieces."""
    for text in ("2", " ", "."):
        token_id = gemma.vocab.id_of_bytes[text.encode()]
        assert token_id not in gemma.vocab.byte_piece_ids
        assert gemma.tokenizer(text, add_special_tokens=False)["input_ids"] == [token_id]
    assert gemma.vocab.encode_bytes("é".encode()[:1]) == [gemma.vocab.id_of_bytes[b"\xc3"]]


def test_byte_pieces_still_spell_bytes_nothing_else_can(verifier_vocab):
    token_id = verifier_vocab.id_of_bytes[b"\xf0"]
    assert token_id in verifier_vocab.byte_piece_ids
    assert verifier_vocab.id_of_bytes[b"I"] not in verifier_vocab.byte_piece_ids
