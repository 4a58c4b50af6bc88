"""Models shared by every browser session: loaded lazily, once per process, in a thread that reports
progress, so the page can say what is happening during the minutes a first conversion takes."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence

from safe_engine.compare import warm_up
from safe_engine.models import LoadedModel, LoadOptions, load_model


class ModelPool:
    def __init__(self, options: LoadOptions = LoadOptions()):
        self.options = options
        self._models: dict[str, LoadedModel] = {}
        self._lock = threading.Lock()

    def load(self, specs: Sequence[str], progress) -> list[LoadedModel]:
        with self._lock:
            for spec in specs:
                if spec not in self._models:
                    progress(f"loading {spec}")
                    model = load_model(spec, self.options, progress)
                    warm_up([model])  # the first forward pays for lazy set-up; keep it out of the first run's timing
                    self._models[spec] = model
            return [self._models[spec] for spec in specs]

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
