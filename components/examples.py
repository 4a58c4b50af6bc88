"""The example buttons of the Live and Compare tabs (assets/examples.json): each says what it shows on the embedded
pair, measured there and pinned by tests/test_examples.py, and the page says what the pair cannot show."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from .settings import stop_text


@dataclass(frozen=True)
class Example:
    label: str
    prompt: str
    shows: str  # what the example shows on the embedded pair, in the page under the buttons
    max_new_tokens: int = 48
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Examples:
    live: tuple[Example, ...]
    compare: tuple[Example, ...]
    cannot_show: str

    @staticmethod
    def read(path: Path) -> Examples:
        raw = json.loads(path.read_text(encoding="utf-8"))

        def examples(key: str) -> tuple[Example, ...]:
            return tuple(Example(**(entry | {"stop": tuple(entry.get("stop", ()))})) for entry in raw[key])

        return Examples(examples("live"), examples("compare"), raw["cannot_show"])


def gallery(examples: tuple[Example, ...], cannot_show: str, prompt, max_new=None, stop=None) -> None:
    """The buttons (each fills the prompt, and the length and stop sequences where given) and, under them, what
    each shows and what the pair cannot."""
    inputs = [prompt] + ([max_new, stop] if max_new is not None else [])
    rows = [[e.prompt] + ([e.max_new_tokens, stop_text(e.stop)] if max_new is not None else []) for e in examples]
    gr.Examples(rows, inputs, example_labels=[e.label for e in examples])
    lines = "\n".join(f"- **{e.label}**: {e.shows}" for e in examples)
    gr.Markdown(f"{lines}\n\n{cannot_show}", elem_classes=["example-notes"])
