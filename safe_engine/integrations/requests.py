"""One request through the engine's public `decode`, as lm-eval's model and the OpenAI server both need it:
the text without its stop sequence (they expect it cut *before* the stop, the engine ends right after it),
SAFE's provenance of the run, and conversations flattened into the one user turn `decode` takes.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..contract.config import DecodeConfig
from ..contract.events import Event, RunFinished, RunStarted
from ..models.loading import LoadedModel
from ..orchestration.comparison import summarize
from ..strategies.decoding import decode

FINISH_REASONS = {"eos": "stop", "stop": "stop", "max_new_tokens": "length", "stopped": "stop"}
"""The engine's stop reasons as OpenAI's finish_reason."""


@dataclass(frozen=True)
class Completion:
    text: str  # the response, cut before the stop sequence that ended it
    stop_reason: str  # the engine's: eos | stop | max_new_tokens | stopped
    provenance: dict  # `provenance(...)` of the run
    completion_tokens: int  # committed response positions (the drafter's tokens)

    @property
    def finish_reason(self) -> str:
        return FINISH_REASONS[self.stop_reason]


def plain(lm: LoadedModel) -> LoadedModel:
    """The same loaded model (weights, tokenizer, byte table) fed its prompt as plain text, no chat template:
    lm-eval's contexts and /v1/completions prompts are the model's whole input."""
    view = copy.copy(lm)
    view.use_chat_template = False
    return view


def without_stop(text: str, stop_reason: str, stops: Sequence[str]) -> str:
    """The engine's text ends right after the first stop sequence it met; clients expect the text before it."""
    if stop_reason == "stop":
        for stop in sorted(stops, key=len, reverse=True):
            if text.endswith(stop):
                return text[: -len(stop)]
    return text


PROVENANCE = (
    "strategy", "drafter", "models", "tokens", "ensembled", "replaced", "e_t", "oov_skips", "consensus_skips",
    "sharpened", "rounds", "wall_s", "stop_reason", "seed",
)  # fmt: skip


def provenance(started: RunStarted, finished: RunFinished) -> dict:
    """What SAFE did in one run, as a flat JSON record: E/T, ensembled / replaced, OOV-like skips per verifier,
    consensus skips by reason, the time split, the stop reason and the seed (to replay it); the CLI's
    `--json` record (`compare.summarize`) narrowed to these fields."""
    record = summarize([started, finished])
    return {key: record[key] for key in PROVENANCE} | {"time_split": finished.stats["time_split"]}


def complete(
    models: Sequence[LoadedModel],
    prompt: str,
    config: DecodeConfig,
    stop: threading.Event | None = None,
    on_event: Callable[[Event], None] | None = None,
) -> Completion:
    """Decode one prompt to its end (or until `stop` is set), handing every event to `on_event` as it comes.

    Bad input raises the engine's SafeEngineError before any decoding."""
    started = finished = None
    for event in decode(models, prompt, config, stop):
        if on_event is not None:
            on_event(event)
        if isinstance(event, RunStarted):
            started = event
        elif isinstance(event, RunFinished):
            finished = event
    text = without_stop(finished.text, finished.stop_reason, config.stop)
    return Completion(text, finished.stop_reason, provenance(started, finished), finished.stats["tokens"])


def flatten_messages(messages: Sequence[Mapping[str, str]]) -> str:
    """A conversation as the one user turn the engine takes (each model then wraps it in its own template).

    The engine's `decode` takes a prompt, not a conversation, because each model of an ensemble has its own
    chat template: a system instruction leads the turn (as Gemma's template does for its missing system
    role), and earlier turns stay as labelled lines before the last user message."""
    system = [m["content"] for m in messages if m["role"] == "system"]
    turns = [m for m in messages if m["role"] != "system"]
    *history, last = turns
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in history]
    return "\n\n".join([*system, *lines, last["content"]])
