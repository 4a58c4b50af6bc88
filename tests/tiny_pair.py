"""Two random-weight models with different tokenizers and architectures, saved once per test module, and the
JSONL task files the bench tests run them on."""

from __future__ import annotations

import json
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


def word_pair_folders(root_factory, words: list[str]) -> list[str]:
    """Folder specs of a Gemma 3 over `words` and a Llama over every other one (the bench tests' pair);
    `root_factory`: pytest's tmp_path_factory."""
    return [
        str(tiny_model_folder(root_factory.mktemp("a"), unigram_tokenizer(words), arch="gemma3", seed=3)),
        str(tiny_model_folder(root_factory.mktemp("b"), unigram_tokenizer(words[::2]), seed=4)),
    ]


def task_file(root_factory, name: str, rows: list[dict]) -> str:
    """`rows` as a JSONL task file NAME in a fresh folder."""
    path = root_factory.mktemp("tasks") / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)
