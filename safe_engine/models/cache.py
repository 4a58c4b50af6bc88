"""The process's one model cache: each (spec, load options) loads once, whoever asks (CLI, app, server,
benchmarks, lm-eval), and concurrent requests never load one model twice."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import closing

from .loading import LoadedModel, LoadOptions, load_model
from .placement import placed

WARM_UP_TEXT = "a"  # one letter: every tokenizer that can decode anything spells it


_LOADED: dict[tuple[str, LoadOptions], LoadedModel] = {}  # the process's one model cache (CLI, app, benchmarks)
_LOADING = threading.Lock()  # the app loads from request threads; one load at a time, never one model twice


def load_models(
    specs: Sequence[str],
    options: LoadOptions = LoadOptions(),
    progress: Callable[[str], None] | None = None,
    warm: bool = False,
) -> list[LoadedModel]:
    """Load each spec once per process; later calls (another run, another UI session) reuse it. `options`:
    a device and a dtype for all or one per spec (`placement.placed`). `warm`: `warm_model` each model as it
    loads, so the first run's timing leaves out its lazy set-up."""
    with _LOADING:
        keys = list(zip(specs, placed(specs, options)))
        for key in keys:
            if key not in _LOADED:
                model = load_model(*key, progress)
                if warm:
                    warm_model(model)
                _LOADED[key] = model
        return [_LOADED[key] for key in keys]


def evict(which: Callable[[LoadedModel], bool]) -> list[LoadedModel]:
    """Drop the cached models `which` picks (a later load loads them anew) and return them, to be closed."""
    with _LOADING:
        keys = [key for key, lm in _LOADED.items() if which(lm)]
        return [_LOADED.pop(key) for key in keys]


def warm_model(lm: LoadedModel) -> None:
    """Pay a model's once-per-process costs before anything is timed: its token-byte tables (seconds for a
    262k vocabulary) and its first forward pass."""
    _ = lm.vocab.id_of_bytes
    with closing(lm.open_session()) as session:
        session.next_token_logits(lm.encode_prompt(WARM_UP_TEXT), [1])
