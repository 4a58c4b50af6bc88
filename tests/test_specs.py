"""Model specs resolve (or fail with a clear message) without loading anything."""

import pytest

from safe_engine.contract.errors import ModelSpecError
from safe_engine.models.embedded import cache_root, converted_dir
from safe_engine.models.specs import resolve_spec


def test_embedded_specs_resolve():
    assert resolve_spec("embedded:gemma-3-270m").kind == "embedded"
    assert resolve_spec("embedded:smollm2-135m-instruct").short_name == "smollm2-135m-instruct"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("", "empty"),
        ("embedded:nope", "unknown embedded model"),
        ("./no/such/folder", "not found"),
        ("/tmp/definitely-missing.gguf", "GGUF file not found"),
        ("not a spec at all", "unknown model spec"),
    ],
)
def test_bad_specs_say_why(spec, message):
    with pytest.raises(ModelSpecError, match=message):
        resolve_spec(spec)


def test_folder_without_config_is_rejected(tmp_path):
    with pytest.raises(ModelSpecError, match="config.json"):
        resolve_spec(str(tmp_path))


def test_folder_and_hub_specs(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_spec(str(tmp_path)).kind == "folder"
    assert resolve_spec("HuggingFaceTB/SmolLM2-135M-Instruct").kind == "hub"


def test_cache_dir_is_overridable(monkeypatch, tmp_path):
    monkeypatch.setenv("SAFE_STUDIO_CACHE", str(tmp_path))
    assert cache_root() == tmp_path
    assert converted_dir("gemma-3-270m") == tmp_path / "models" / "gemma-3-270m"


def test_a_model_that_is_not_a_causal_lm_is_refused(tmp_path):
    from transformers import ViTConfig

    from safe_engine.contract.errors import ModelLoadError
    from safe_engine.models.loading import load_model

    ViTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="not a causal language model"):
        load_model(str(tmp_path))


def test_a_folder_without_weights_says_so(tmp_path):
    from transformers import LlamaConfig

    from safe_engine.contract.errors import ModelLoadError
    from safe_engine.models.loading import load_model

    LlamaConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8).save_pretrained(
        tmp_path
    )
    with pytest.raises(ModelLoadError, match="could not load"):
        load_model(str(tmp_path))


def test_a_tokenizer_only_folder_serves_tokdiff_but_not_decoding(tmp_path, capsys):
    from tiny_models import char_tokenizer, unigram_tokenizer

    from safe_engine.cli import main
    from safe_engine.contract.errors import ModelLoadError
    from safe_engine.models.loading import load_model, load_tokenizer

    words, chars = tmp_path / "words", tmp_path / "chars"
    unigram_tokenizer([" cat", " sat"]).save_pretrained(words)
    char_tokenizer().save_pretrained(chars)
    assert resolve_spec(str(words)).kind == "tokenizer" and resolve_spec(str(words)).short_name == "words"
    assert load_tokenizer(str(words)).tokenize(" cat") == ["▁cat"]
    with pytest.raises(ModelLoadError, match="tokenizer only"):
        load_model(str(words))
    assert main(["tokdiff", "--models", str(words), str(chars), "--text", "the cat sat"]) == 0
    out = capsys.readouterr().out
    assert "== words: 5 tokens" in out and "== chars: 11 tokens" in out
