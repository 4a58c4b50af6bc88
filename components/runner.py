"""Glue shared by the tabs that run models: loading with visible progress, and turning failures into a
message in the page (never a stack trace) without touching what a previous run left on screen."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Generator

import gradio as gr

from safe_engine.decoding import DecodeConfig
from safe_engine.errors import SafeEngineError
from safe_engine.models import LoadedModel

from . import settings
from .pool import ModelPool
from .stops import Stops
from .transcript import status_html

log = logging.getLogger("safe_studio")
CHART_INTERVAL_S = 2.0  # Plotly figures are the costly part of every update (serialised, sent, remounted)
FRAME_INTERVAL_S = 0.25  # Gradio handles each update between two engine steps, so every update stalls decoding


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


Prepared = tuple[DecodeConfig, list[LoadedModel], threading.Event]


def prepare(
    pool: ModelPool, stops: Stops, status: gr.HTML, session: str, prompt: str, form: tuple, doing: str
) -> Generator[dict, None, Prepared | None]:
    """`prepared = yield from prepare(...)`: the checked config, the loaded models (progress streamed into
    `status`) and this session's armed stop flag; None once the page says why a run cannot start."""
    try:
        specs, config = settings.build(prompt, *form)
    except SafeEngineError as exc:
        yield problem(status, exc, doing)
        return None
    loaded = yield from load(pool, stops, status, session, specs, doing)
    return None if loaded is None else (config, *loaded)


def load(
    pool: ModelPool, stops: Stops, status: gr.HTML, session: str, specs: list[str], doing: str
) -> Generator[dict, None, tuple[list[LoadedModel], threading.Event] | None]:
    """`loaded = yield from load(...)`: the models (progress streamed into `status`) and this session's armed
    stop flag; None once the page says why they could not load."""
    flag = stops.arm(session)  # armed before loading, so Stop during loading cancels the run too
    try:
        loading = pool.start(specs)
        for message in loading:
            yield {
                status: status_html(
                    f"Loading models, once per process (the very first start converts the embedded models: about two minutes). {message}",
                    "busy",
                )
            }
        return loading.result(), flag
    except Exception as exc:
        stops.disarm(session, flag)
        yield problem(status, exc, doing)
        return None


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


def stopper(stops: Stops):
    """A Stop-button handler that raises the stop flag of the clicking session only."""

    def stop(request: gr.Request) -> None:
        stops.stop(request.session_hash)

    return stop
