"""The app's view of the engine's one model cache (`safe_engine.models.cache.load_models`): loading in a thread
that reports progress, so the page can say what is happening during the minutes a first conversion takes."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence

from safe_engine.models.cache import load_models
from safe_engine.models.loading import LoadedModel, LoadOptions


class ModelPool:
    """The load options the app was started with (the CLI's loading flags: `--devices`, `--dtype`,
    `--cpu-linear`, …); the models live in the engine's cache."""

    def __init__(self, options: LoadOptions = LoadOptions()):
        self.options = options

    def load(self, specs: Sequence[str], progress) -> list[LoadedModel]:
        return load_models(specs, self.options, progress, warm=True)

    def start(self, specs: Sequence[str]) -> Loading:
        return Loading(self, specs)


class Loading:
    """Iterate it for progress messages; then `result()` gives the models or raises the loading error."""

    def __init__(self, pool: ModelPool, specs: Sequence[str]):
        self._messages: queue.Queue[str | None] = queue.Queue()
        self._models: list[LoadedModel] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, args=(pool, list(specs)), daemon=True)
        self._thread.start()

    def _work(self, pool: ModelPool, specs: list[str]) -> None:
        try:
            self._models = pool.load(specs, self._messages.put)
        except BaseException as exc:  # handed to the request thread, which reports it
            self._error = exc
        finally:
            self._messages.put(None)

    def __iter__(self) -> Iterator[str]:
        while (message := self._messages.get()) is not None:
            yield message

    def result(self) -> list[LoadedModel]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._models
