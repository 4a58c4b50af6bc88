"""Two random-weight models with different tokenizers and architectures, saved once per test module."""

from __future__ import annotations

from pathlib import Path

from tiny_models import tiny_model_folder, unigram_tokenizer

PIECES = ["the", "answer", "is", " the", " answer", " is", "Question", "Answer", "Q:", "A:", "12", "1", "2"]


def tiny_pair_folders(root: Path) -> list[str]:
    """Folder specs of a Llama (drafter) and a Gemma 3 (verifier) whose vocabularies split words differently."""
    first = tiny_model_folder(root / "tiny-llama", unigram_tokenizer(PIECES), seed=1, layers=1)
    second = tiny_model_folder(
        root / "tiny-gemma", unigram_tokenizer(PIECES[:6] + ["an", "sw"]), seed=2, arch="gemma3", layers=1
    )
    return [str(first), str(second)]
