"""Task files: JSONL rows → `Example`s with a declared scorer.

Accepted rows (detected per row, so people can bring public sets as they are on disk):

- native: ``{"id", "question", "answer", "scorer", ["choices"]}`` with a scorer from `SCORERS`;
- GSM8K: ``{"question", "answer": "... #### 42"}`` → numeric;
- MATH500: ``{"problem", "answer", ["unique_id"]}`` → numeric (LaTeX answers compared as strings);
- ARC: ``{"question": {"stem", "choices": [{"label", "text"}]}, "answerKey"}`` or the Hugging Face shape
  ``{"question", "choices": {"label": [...], "text": [...]}, "answerKey"}`` → choice;
- MMLU: ``{"question", "choices": [...], "answer": 2 or "C"}`` → choice.

Choice golds become letters by option position (ARC also labels options 1-4).
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from pathlib import Path

from ..contract.errors import ConfigError
from ..data import TASKS_DIR
from .scoring import SCORERS

LETTERS = string.ascii_uppercase


@dataclass(frozen=True)
class Example:
    task: str
    id: str
    question: str
    gold: str
    scorer: str
    choices: tuple[str, ...] = ()


def builtin_tasks() -> list[str]:
    """Names of the task sets the package ships (`safe_engine.data.TASKS_DIR`)."""
    return sorted(p.stem for p in TASKS_DIR.glob("*.jsonl"))


def task_path(name_or_file: str) -> Path:
    """A path to a JSONL file, or the name of a shipped task set."""
    path = Path(name_or_file).expanduser()
    if path.is_file():
        return path
    shipped = TASKS_DIR / f"{name_or_file}.jsonl"
    if shipped.is_file():
        return shipped
    raise ConfigError(f"no task file {name_or_file!r}; shipped task sets: {', '.join(builtin_tasks())}")


def load_task(name_or_file: str, limit: int | None = None) -> list[Example]:
    """The first `limit` examples of a task file; the task is named after the file."""
    path = task_path(name_or_file)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    examples = []
    for number, line in enumerate(lines, 1):
        if limit is not None and len(examples) >= limit:
            break
        if not line.strip():
            continue
        try:
            examples.append(_parse_row(json.loads(line), path.stem, str(number)))
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise ConfigError(f"{path}:{number}: {exc}") from exc
    if not examples:
        raise ConfigError(f"{path} holds no examples")
    ids = [e.id for e in examples]
    if len(set(ids)) < len(ids):
        raise ConfigError(f"{path}: example ids must be unique (results are keyed by them)")
    return examples


def _parse_row(row: dict, task: str, fallback_id: str) -> Example:
    """One row in any accepted shape; raises ValueError/KeyError on rows it cannot read."""
    row_id = str(row.get("id", row.get("unique_id", fallback_id)))
    if "scorer" in row:
        if row["scorer"] not in SCORERS:
            raise ValueError(f"scorer must be one of {', '.join(SCORERS)}, not {row['scorer']!r}")
        choices = tuple(row.get("choices", ()))
        return Example(task, row_id, row["question"], _nonempty(row["answer"]), row["scorer"], choices)
    if "problem" in row:
        return Example(task, row_id, row["problem"], _nonempty(row["answer"]), "numeric")
    if "answerKey" in row or "choices" in row:
        question, labels, texts = _choices(row)
        return Example(task, row_id, question, _gold_letter(row, labels), "choice", texts)
    if "####" in str(row.get("answer", "")):
        return Example(task, row_id, row["question"], _nonempty(row["answer"].rsplit("####", 1)[1]), "numeric")
    raise ValueError("unrecognised row: expected a native, GSM8K, MATH500, ARC or MMLU row")


def _choices(row: dict) -> tuple[str, list[str], tuple[str, ...]]:
    question, choices = row["question"], row.get("choices")
    if isinstance(question, dict):  # ARC as released: choices inside the question
        question, choices = question["stem"], question["choices"]
    if isinstance(choices, dict):  # ARC on Hugging Face: parallel label/text lists
        return question, [str(label) for label in choices["label"]], tuple(choices["text"])
    if choices and isinstance(choices[0], dict):
        return question, [str(c["label"]) for c in choices], tuple(c["text"] for c in choices)
    return question, list(LETTERS[: len(choices)]), tuple(choices)


def _gold_letter(row: dict, labels: list[str]) -> str:
    if "answerKey" in row:
        return LETTERS[labels.index(str(row["answerKey"]).strip())]
    answer = row["answer"]
    return LETTERS[answer] if isinstance(answer, int) else LETTERS[labels.index(str(answer).strip().upper())]


def _nonempty(answer) -> str:
    text = str(answer).strip()
    if not text:
        raise ValueError("empty answer")
    return text
