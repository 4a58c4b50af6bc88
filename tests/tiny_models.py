"""Tokenizers and random-weight models built inside the tests (real code paths, seconds to build)."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from safe_engine.models.loading import LoadedModel, LoadOptions, load_model

EOS = "</s>"


def unigram_tokenizer(pieces: list[str], prepend: str = "never") -> PreTrainedTokenizerFast:
    """SentencePiece-style tokenizer (▁ for spaces, <0xNN> byte fallback) over the given pieces.

    Longer pieces get better scores, so the tokenizer prefers them, like a trained vocabulary.
    """
    vocab = [("<unk>", 0.0), (EOS, 0.0)] + [(f"<0x{b:02X}>", -30.0) for b in range(256)]
    chars = sorted({c for p in pieces for c in p} | set("abcdefghijklmnopqrstuvwxyz ") - {" "})
    seen = set()
    for piece in ["▁"] + chars + [p.replace(" ", "▁") for p in pieces]:
        if piece not in seen:
            seen.add(piece)
            vocab.append((piece, -10.0 + 2.0 * len(piece)))
    tok = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prepend, split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token=EOS)


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character of a small alphabet, no byte fallback and no unknown token.

    Every text has exactly one tokenization and every token a model can emit is that canonical
    one, so two copies of a model always see the same ids (the identity tests rely on this).
    """
    vocab = [(EOS, 0.0), ("▁", -1.0)] + [(c, -1.0) for c in "abcdefghijklmnopqrstuvwxyz.,"]
    tok = Tokenizer(models.Unigram(vocab, unk_id=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse()])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS)


def tiny_model_folder(
    folder: Path,
    tokenizer,
    arch: str = "llama",
    seed: int = 0,
    sliding_window: int = 8,
    extra_rows: int = 0,
    layers: int = 2,
) -> Path:
    """Save a random-weight causal LM with peaky output distributions (clear argmaxes) and its tokenizer.

    BOS and EOS come from the tokenizer; `extra_rows` pads the vocabulary past the tokenizer's size, as
    real checkpoints do (Gemma 3, Qwen); one layer (`layers=1`) halves the cost of a decoding step.
    """
    from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig

    common = dict(
        vocab_size=len(tokenizer) + extra_rows,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        pad_token_id=None,
        initializer_range=0.3,
    )
    if arch == "gemma3":
        config = Gemma3TextConfig(
            **common,
            head_dim=8,
            sliding_window=sliding_window,
            layer_types=["sliding_attention", "full_attention"][:layers],
        )
    else:
        config = LlamaConfig(**common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_model(folder: Path, tokenizer, **kwargs) -> LoadedModel:
    """Loaded all fp32 (`streamed`), so tests can compare its logits to 1e-4 (an int8 head's are bf16)."""
    return load_model(str(tiny_model_folder(folder, tokenizer, **kwargs)), LoadOptions(cpu_linear="streamed"))


def byte_bpe_tokenizer(corpus: list[str], merges: int = 40) -> PreTrainedTokenizerFast:
    """Byte-level BPE (GPT-2's byte alphabet and pre-tokenizer, as SmolLM2's) trained on `corpus`: the 256
    byte tokens, `merges` learned merges and an end token."""
    from tokenizers import trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=len(alphabet) + merges + 1, initial_alphabet=alphabet, special_tokens=[EOS], show_progress=False
    )
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS)
