"""The one skeleton every tab that runs models shares (`Runner.stream`): check the form, load the models with
visible progress and this session's Stop armed, start the engine's iterator, stream throttled updates, disarm
Stop. Failures become a message in the page (never a stack trace) that leaves a previous run on screen."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any

import gradio as gr

from safe_engine.contract.errors import SafeEngineError
from safe_engine.models.loading import LoadedModel
from safe_engine.pages.transcript import status_html
from safe_engine.runtime.session import runs_sharing

from .pool import ModelPool
from .stops import Stops

log = logging.getLogger("safe_studio")
CHART_INTERVAL_S = 2.0  # Plotly figures are the costly part of every update (serialised, sent, remounted)
FRAME_INTERVAL_S = 0.25  # each update costs Gradio CPU on the cores the passes run on
# Events that run models share one queue; up to 8 run at once and step together in the engine's batching
# executor (one forward pass per model for every waiting run). On the CPU a pass of 8 rows costs far less than 8
# passes of one (benchmarks/RESULTS.md, "Many runs at once"), so 8 sessions finish far sooner than in turn;
# later sessions wait in the queue (`launch(max_size=64)`) rather than lengthen every running one's passes.
MODELS_QUEUE = {"concurrency_id": "models", "concurrency_limit": 8}
LOADING = "Loading models, once per process (the very first start converts the embedded models: minutes)."


def user_message(exc: BaseException) -> str:
    if isinstance(exc, SafeEngineError):
        return str(exc)
    log.error("run failed", exc_info=exc)
    return f"internal error ({type(exc).__name__}); the server log has the details"


def problem(status: gr.HTML, exc: BaseException, doing: str) -> dict:
    """A toast plus a status line; every other output keeps its value."""
    message = f"Could not {doing}: {user_message(exc)}."
    gr.Warning(message)
    return {status: status_html(message, "warn" if isinstance(exc, SafeEngineError) else "error")}


def sharing_html(models: list[LoadedModel]) -> str:
    """The small line that says how many runs, in every session, share these models' forward passes now."""
    n = runs_sharing([lm.sessions for lm in models])
    if n < 2:
        line = f"{n or 'No'} run on the models now."
    else:
        line = f"{n} runs share the models now: one forward pass serves them all (each run's time includes theirs)."
    return f'<div class="sharing">{line}</div>'


class Throttle:
    """Says when an update is due: at most every `interval` seconds (charts: CHART_INTERVAL_S)."""

    def __init__(self, interval: float = CHART_INTERVAL_S):
        self.interval = interval
        self._last = 0.0

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._last < self.interval:
            return False
        self._last = now
        return True


class Pace:
    """One streamed run's clocks: `frame()` for the cheap outputs (HTML), `charts()` for the Plotly ones."""

    def __init__(self):
        self.frame = Throttle(FRAME_INTERVAL_S).due
        self.charts = Throttle(CHART_INTERVAL_S).due


Check = Callable[[], tuple[list[str], Any]]  # → (model specs, the tab's checked plan: a config, a Plan…)
Start = Callable[[list[LoadedModel], Any, threading.Event], tuple[Iterable, dict]]  # → (items, first update)
Step = Callable[[Any, Pace], dict | None]  # one item → an update, or None when none is due
Finish = Callable[[str | None, bool], dict]  # (why it broke off or None, whether Stop was pressed) → last update


@dataclass(frozen=True)
class Runner:
    """What the tabs that run models share: the process's models and each browser session's Stop flag."""

    pool: ModelPool
    stops: Stops

    def stop_button(self, button: gr.Button, **api) -> None:
        """Stop raises the flag of the clicking session only; unqueued, so it lands while a run streams."""

        def stop(request: gr.Request) -> None:
            self.stops.stop(request.session_hash)

        button.click(stop, None, None, queue=False, **api)

    def stream(
        self, session: str, status: gr.HTML, doing: str, check: Check, start: Start, step: Step, finish: Finish
    ) -> Generator[dict, None, None]:
        """`yield from` it in an event handler. `check` raises a SafeEngineError for bad input; `start` gets
        the loaded models, the plan and the armed flag and returns the engine's iterator with the first
        update (a SafeEngineError it raises, e.g. a prompt too long for a model, is shown the same way);
        `step` folds each item in; `finish` words the outcome once Stop is disarmed, whatever happened."""
        try:
            specs, plan = check()
        except SafeEngineError as exc:
            yield problem(status, exc, doing)
            return
        flag = self.stops.arm(session)  # armed before loading, so Stop during loading cancels the run too
        try:
            loading = self.pool.start(specs)
            for message in loading:
                yield {status: status_html(f"{LOADING} {message}", "busy")}
            items, first = start(loading.result(), plan, flag)
        except Exception as exc:
            self.stops.disarm(session, flag)
            yield problem(status, exc, doing)
            return
        yield first
        pace, broke_off = Pace(), None
        try:
            for item in items:
                update = step(item, pace)
                if update:
                    yield update
        except Exception as exc:  # keep what was shown; `finish` says what happened
            broke_off = user_message(exc)
        finally:
            self.stops.disarm(session, flag)
        yield finish(broke_off, flag.is_set())
