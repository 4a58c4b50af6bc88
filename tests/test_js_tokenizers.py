"""The npm vocabularies converted to Hugging Face tokenizers give the packages' own ids, text by text.

Each family is converted afresh into a temporary cache (so the current converter is what is tested),
then compared with the package's `encode` run by node on the hostile corpus.
"""

from __future__ import annotations

import json

import pytest
import regex
from families import require_node
from hostile_corpus import hostile_texts
from transformers import AutoTokenizer

import scripts.convert_js_tokenizers as converter
from safe_engine.tokenization.alignment import TokenBytes

pytestmark = pytest.mark.families

# ECMAScript's \s holds U+FEFF and lacks U+0085; Unicode White_Space (the Rust regex behind tiktoken,
# Oniguruma behind `tokenizers`, Python's `regex`) is the other way round. Llama 3's split regex uses \s.
JS_ONLY_WHITESPACE, UNICODE_ONLY_WHITESPACE = "\ufeff", "\x85"


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """Each family converted into a throwaway cache: {name: (tokenizer, folder)}."""
    require_node()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAFE_STUDIO_CACHE", str(tmp_path_factory.mktemp("cache")))
        folders = {name: converter.ensure_tokenizer(name) for name in converter.JS_FAMILIES}
    return {name: (AutoTokenizer.from_pretrained(folder), folder) for name, folder in folders.items()}


def without_js_whitespace_quirk(texts: list[str]) -> list[str]:
    return [t.replace(JS_ONLY_WHITESPACE, "").replace(UNICODE_ONLY_WHITESPACE, "") for t in texts]


@pytest.mark.parametrize("name", list(converter.JS_FAMILIES))
def test_ids_equal_the_npm_encoder_with_special_strings_as_text(fresh, name):
    tokenizer, _ = fresh[name]
    texts = hostile_texts([tokenizer]) + [""]
    if name == "llama-3":
        texts = without_js_whitespace_quirk(texts)
    ours = [tokenizer(t, add_special_tokens=False, split_special_tokens=True)["input_ids"] for t in texts]
    theirs = converter.js_encode(name, texts, "text")
    mismatches = [(t, a, b) for t, a, b in zip(texts, ours, theirs) if a != b]
    assert not mismatches, f"{len(mismatches)} of {len(texts)} texts differ; first: {mismatches[0]!r}"
    assert all(ids for t, ids in zip(texts, ours) if t) and len(texts) > len(hostile_texts())


def test_llama3_special_tokens_parse_to_the_npm_ids(fresh):
    tokenizer, _ = fresh["llama-3"]
    texts = without_js_whitespace_quirk(hostile_texts([tokenizer]))
    ours = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    assert ours == converter.js_encode("llama-3", texts, "specials")
    named = ("<|begin_of_text|>", "<|eot_id|>", "<|reserved_special_token_247|>")
    specials = {tokenizer.convert_tokens_to_ids(s) for s in named}
    assert specials == {128000, 128009, 128255} and specials <= {i for ids in ours for i in ids}


def test_llama3_splits_whitespace_the_unicode_way_where_javascript_differs(fresh):
    """The one place the npm encoder is not the reference: our split follows Unicode White_Space, as the
    real Llama 3 tokenizer does; the whole corpus pre-tokenizes like Python's `regex` reads the pattern."""
    tokenizer, _ = fresh["llama-3"]
    pattern = json.loads(tokenizer.backend_tokenizer.to_str())["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    for text in hostile_texts([tokenizer]):
        pieces = tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)
        assert [text[s:e] for _, (s, e) in pieces] == regex.findall(pattern, text)
    quirks = [" \x85nel", " \ufeffBOM"]
    ours = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in quirks]
    assert [tokenizer.decode(ids[:1]) for ids in ours] == [" ", " \ufeff"]
    assert all(a != b for a, b in zip(ours, converter.js_encode("llama-3", quirks, "text")))


@pytest.mark.parametrize("name", list(converter.JS_FAMILIES))
def test_metadata_of_the_converted_folder(fresh, name):
    tokenizer, folder = fresh[name]
    family = converter.JS_FAMILIES[name]
    assert (tokenizer.bos_token, tokenizer.eos_token) == (family.bos, family.eos)
    assert tokenizer("Hi").input_ids[0] == tokenizer.bos_token_id  # BOS added once, by the post-processor
    assert tokenizer("Hi", add_special_tokens=False).input_ids[0] != tokenizer.bos_token_id
    chat = [{"role": "user", "content": "Hi"}]
    prompt = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert prompt.startswith(tokenizer.bos_token) and "Hi" in prompt
    vocab = TokenBytes(tokenizer)
    assert vocab.kind == family.style and len(vocab) == len(tokenizer)
    assert {tokenizer.bos_token_id, tokenizer.eos_token_id} <= vocab.special_ids
    marker = (folder / "conversion-complete").read_text()
    assert f"{family.package}@{converter.package_version(family)}" in marker and "MIT" in marker


def test_a_conversion_runs_once_and_is_reused(fresh, monkeypatch):
    _, folder = fresh["mistral-7b"]
    monkeypatch.setenv("SAFE_STUDIO_CACHE", str(folder.parents[1]))
    monkeypatch.setattr(converter, "_node", lambda *args, **kwargs: pytest.fail("converted twice"))
    assert converter.ensure_tokenizer("mistral-7b") == folder


@pytest.mark.parametrize("name", list(converter.JS_FAMILIES))
def test_the_user_cache_holds_the_current_conversion(fresh, name):
    """The matrix reads the user cache: it must be what this converter writes (else delete the folder)."""
    _, folder = fresh[name]
    cached = converter.ensure_tokenizer(name)
    stale = f"stale conversion in {cached}: delete it, the next run converts again"
    assert (cached / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes(), stale
