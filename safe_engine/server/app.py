"""The FastAPI app: /v1/models, /v1/completions, /v1/chat/completions, streaming or not, and /health.

Each request decodes on a worker thread through the engine's public `decode` (`integrations.runs`), so
concurrent requests can step together in the engine. At most `concurrency` run at once and `queue` more
wait; beyond that a request gets 429, and one that waited `queue_timeout_s` without starting gets 503.
A client that disconnects, streaming or not, sets its run's stop event, which ends the run and frees its
worker (a waiting one is polled every `DISCONNECT_POLL_S`).
Every error is OpenAI's JSON body with a 4xx status (5xx only for a fault of ours, without a traceback).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..contract.errors import SafeEngineError
from ..contract.events import Event, RunStarted, TextCommitted
from ..integrations.requests import Completion, complete, flatten_messages, plain
from ..models.loading import LoadedModel
from ..options import parse_options
from .schemas import ChatRequest, CompletionRequest, Sampling

logger = logging.getLogger(__name__)

FIXED_OPTIONS = ("models", "devices", "dtype", "trust_remote_code", "no_chat_template", "cpu_int8", "cpu_linear")
"""Decoding options that belong to the server's loaded models, not to a request."""
DISCONNECT_POLL_S = 0.25  # how often a non-streaming request checks that its client is still there


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code


def _error_body(message: str, kind: str, code: str | None = None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass
class Settings:
    options: dict  # the server's decoding options (parsed CLI arguments by name), requests override them
    strategy: str = "safe"  # what the pair's own model id runs
    api_key: str | None = None
    concurrency: int = 8
    queue: int = 32
    queue_timeout_s: float = 300.0


@dataclass
class Counters:
    running: int = 0
    waiting: int = 0
    completed: int = 0
    cancelled: int = 0  # runs a disconnecting client stopped
    lock: threading.Lock = field(default_factory=threading.Lock)


class Run:
    """One request's run: its stop event, and its events handed from the worker thread to the event loop."""

    END = object()

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.stop = threading.Event()
        self.started: asyncio.Future = loop.create_future()
        self.items: asyncio.Queue = asyncio.Queue()

    def _started(self, error: BaseException | None = None) -> None:
        if not self.started.done():
            self.started.set_exception(error) if error else self.started.set_result(None)

    def push(self, item) -> None:
        def deliver():
            self._started()
            self.items.put_nowait(item)

        self.loop.call_soon_threadsafe(deliver)

    def fail_to_start(self, error: BaseException) -> bool:
        """Report an error before the first event; False when the run had already started."""
        self.loop.call_soon_threadsafe(self._started, error)
        return not self.started.done()


class Engine:
    def __init__(self, models: Sequence[LoadedModel], settings: Settings):
        self.templated = list(models)
        for lm in self.templated:
            _ = lm.vocab.id_of_bytes  # build the byte tables once, before threads (and the plain views) share them
        self.untemplated = [plain(lm) for lm in models]
        self.settings = settings
        self.counters = Counters()
        self.pool = ThreadPoolExecutor(max_workers=settings.concurrency, thread_name_prefix="safe-run")
        names = [lm.name for lm in models]
        self.pair_id = "+".join(names)
        self.model_ids = {self.pair_id: (settings.strategy, None)}
        if len(models) > 1:
            self.model_ids |= {"safe": ("safe", None), "per-token": ("per-token", None)}
        self.model_ids |= {f"single:{name}": ("single", name) for name in names}

    def placement(self, model_id: str) -> list[dict]:
        """The loaded models a model id runs, each as `LoadedModel.describe` says (its device and dtype too)."""
        single = self.model_ids[model_id][1]
        return [lm.describe() for lm in self.templated if single is None or lm.name == single]

    # ------------------------------------------------------------ a request → a checked config
    def config(self, body: Sampling, max_tokens: int | None):
        if body.model not in self.model_ids:
            raise ApiError(404, f"the model {body.model!r} does not exist; see GET /v1/models", code="model_not_found")
        if body.n != 1:
            raise ApiError(400, "only n = 1 is supported", code="unsupported_parameter")
        extra = dict(body.safe)
        extra.pop("events", None)
        fixed = sorted(set(extra) & set(FIXED_OPTIONS) | {k.replace("-", "_") for k in extra} & set(FIXED_OPTIONS))
        if fixed:
            raise ApiError(
                400, f"{', '.join(fixed)} belong to the server, not to a request", code="invalid_safe_option"
            )
        strategy, drafter = self.model_ids[body.model]
        request = {
            "strategy": strategy,
            "max_new_tokens": max_tokens,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "seed": body.seed,
        } | extra
        if drafter is not None:
            request["drafter"] = drafter
        options = self.settings.options | {k: v for k, v in request.items() if v is not None}
        options["stop"] = list(self.settings.options.get("stop") or []) + body.stops
        try:
            return parse_options(options)[1]
        except SafeEngineError as exc:
            raise ApiError(400, str(exc), code="invalid_value") from exc

    def usage(self, models: Sequence[LoadedModel], config, prompt: str, result: Completion) -> dict:
        """Token counts in the drafter's tokens (each model of an ensemble has its own)."""
        prompt_tokens = len(models[config.drafter].encode_prompt(prompt))
        completion = result.completion_tokens
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        }

    # ------------------------------------------------------------ running
    def admit(self) -> None:
        with self.counters.lock:
            if self.counters.running + self.counters.waiting >= self.settings.concurrency + self.settings.queue:
                raise ApiError(429, "the server's request queue is full; retry later", "rate_limit_error", "queue_full")
            self.counters.waiting += 1

    async def start(self, models, prompt: str, config, on_event: bool) -> Run:
        """Queue the run; return once it decodes (its first event), raising ApiError if it cannot start."""
        run = Run(asyncio.get_running_loop())
        self.admit()

        def work():
            with self.counters.lock:
                self.counters.waiting -= 1
                self.counters.running += 1
            stopped = False
            try:
                if run.stop.is_set():  # the client gave up while it waited
                    run.fail_to_start(ApiError(503, "the server was too busy to start this request", "server_error"))
                    return
                push = run.push if on_event else (lambda event: run.push(event) if _is_start(event) else None)
                result = complete(models, prompt, config, run.stop, on_event=push)
                stopped = result.stop_reason == "stopped"
                run.push(result)
            except BaseException as exc:  # noqa: BLE001 - every failure reaches the client as JSON
                if not run.fail_to_start(exc):
                    run.push(exc)
            finally:
                with self.counters.lock:
                    self.counters.running -= 1
                    self.counters.completed += 1
                    self.counters.cancelled += stopped
                run.push(Run.END)

        self.pool.submit(work)
        try:
            await asyncio.wait_for(asyncio.shield(run.started), self.settings.queue_timeout_s)
        except TimeoutError:
            run.stop.set()
            raise ApiError(503, "the server is busy: the request waited too long to start", "server_error") from None
        except SafeEngineError as exc:
            raise ApiError(400, str(exc), code="invalid_value") from exc
        return run


def _is_start(event: Event) -> bool:
    return isinstance(event, RunStarted)


class StopHoldback:
    """Streams text without ever sending part of a stop sequence: a tail that could begin one waits."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.sent = 0

    def ready(self, text: str) -> str:
        hold = max((k for s in self.stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        safe = max(self.sent, len(text) - hold)
        delta, self.sent = text[self.sent : safe], safe
        return delta

    def rest(self, final: str) -> str:
        delta, self.sent = final[self.sent :], len(final)
        return delta


class ApiKeyCheck:
    """Every /v1/ path needs the key. Plain ASGI on purpose: through Starlette's `BaseHTTPMiddleware` (what
    `@app.middleware` makes) a handler never sees its client disconnect."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            header = dict(scope["headers"]).get(b"authorization", b"")
            given = header[7:] if header.lower().startswith(b"bearer ") else b""
            if not hmac.compare_digest(given, self.key):
                message = "a wrong API key" if given else "no API key (send 'Authorization: Bearer KEY')"
                refusal = JSONResponse(_error_body(message, "invalid_request_error", "invalid_api_key"), 401)
                return await refusal(scope, receive, send)
        await self.app(scope, receive, send)


def create_app(models: Sequence[LoadedModel], settings: Settings) -> FastAPI:
    engine = Engine(models, settings)
    app = FastAPI(title="SAFE Ensemble Studio (OpenAI-compatible)", docs_url=None, redoc_url=None)
    app.state.engine = engine

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return JSONResponse(_error_body(exc.message, exc.kind, exc.code), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        if first.get("type") == "json_invalid":
            message, where = "the body is not valid JSON", ""
        else:
            message = f"{where or 'body'}: {first.get('msg', 'invalid value')}"
        return JSONResponse(_error_body(message, "invalid_request_error", "invalid_value", where or None), 400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return JSONResponse(_error_body(str(exc.detail), "invalid_request_error"), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def fault(request: Request, exc: Exception):
        logger.exception("request failed")
        return JSONResponse(_error_body("internal error", "server_error"), status_code=500)

    if settings.api_key:
        app.add_middleware(ApiKeyCheck, key=settings.api_key)

    @app.get("/health")
    async def health():
        c = engine.counters
        return {"running": c.running, "waiting": c.waiting, "completed": c.completed, "cancelled": c.cancelled}

    @app.get("/v1/models")
    async def list_models():
        created = int(time.time())
        data = [
            {"id": i, "object": "model", "created": created, "owned_by": "safe-ensemble", "models": engine.placement(i)}
            for i in engine.model_ids
        ]
        return {"object": "list", "data": data}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        if len(prompts) != 1:
            raise ApiError(
                400, "send one prompt per request (a list of prompts is not supported)", code="invalid_value"
            )
        if body.echo or body.logprobs:
            raise ApiError(400, "echo and logprobs are not supported", code="unsupported_parameter")
        prompt = prompts[0]
        if not prompt.strip():
            raise ApiError(400, "the prompt is empty", code="invalid_value")
        return await _respond(engine, request, body, engine.untemplated, prompt, body.max_tokens, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        if not body.messages:
            raise ApiError(
                400,
                "messages is empty",
                code="invalid_value",
            )
        if body.messages[-1].role != "user":
            raise ApiError(400, "the last message must be the user's", code="invalid_value")
        prompt = flatten_messages([{"role": m.role, "content": m.text} for m in body.messages])
        if not prompt.strip():
            raise ApiError(400, "the messages hold no text", code="invalid_value")
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        return await _respond(engine, request, body, engine.templated, prompt, max_tokens, chat=True)

    return app


async def _respond(engine: Engine, request: Request, body: Sampling, models, prompt: str, max_tokens, chat: bool):
    config = engine.config(body, max_tokens)
    events = bool(body.safe.get("events"))
    run = await engine.start(models, prompt, config, on_event=body.stream)
    frame = {
        "id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24],
        "created": int(time.time()),
        "model": body.model,
    }
    if not body.stream:
        result = await _final(run, request)
        if result is None:  # nobody is left to answer
            return JSONResponse(_error_body("the client disconnected", "client_error"), status_code=499)
        choice = {"index": 0, "finish_reason": result.finish_reason}
        if chat:
            choice["message"] = {"role": "assistant", "content": result.text}
        else:
            choice |= {"text": result.text, "logprobs": None}
        return {
            **frame,
            "object": "chat.completion" if chat else "text_completion",
            "choices": [choice],
            "usage": engine.usage(models, config, prompt, result),
            "safe": result.provenance,
        }
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    stream = _stream(engine, run, frame, models, config, prompt, chat, events, include_usage)
    return StreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _final(run: Run, request: Request) -> Completion | None:
    """The run's result, or None once its client has disconnected: the run is stopped then, as a streaming
    client's is, since nothing would read its answer."""
    result = asyncio.ensure_future(_result(run))
    try:
        while not (await asyncio.wait({result}, timeout=DISCONNECT_POLL_S))[0]:
            if await request.is_disconnected():
                return None
        return result.result()
    finally:
        if not result.done():
            run.stop.set()
            result.cancel()


async def _result(run: Run) -> Completion:
    while True:
        item = await run.items.get()
        if isinstance(item, Completion):
            return item
        if isinstance(item, BaseException):
            raise ApiError(500, "the run failed", "server_error") from item


async def _stream(engine, run: Run, frame, models, config, prompt, chat, events, include_usage) -> AsyncIterator[str]:
    """SSE chunks: text as it is committed (a possible stop sequence held back), the engine's events in
    ``safe_events`` when asked for, the finish reason and SAFE's summary last, then ``data: [DONE]``."""
    kind = "chat.completion.chunk" if chat else "text_completion"

    def sse(body: dict) -> str:
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    def chunk(delta: str, finish: str | None = None, **extra) -> str:
        if chat:
            choice = {"index": 0, "delta": {"content": delta} if delta else {}, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta, "finish_reason": finish, "logprobs": None}
        return sse({**frame, "object": kind, "choices": [choice], **extra})

    holdback = StopHoldback(config.stop)
    text, pending = "", []
    try:
        if chat:
            yield sse({**frame, "object": kind, "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
        while (item := await run.items.get()) is not Run.END:
            if isinstance(item, BaseException):
                yield sse(_error_body("the run failed", "server_error"))
                break
            if isinstance(item, Completion):
                yield chunk(holdback.rest(item.text), item.finish_reason, safe=item.provenance)
                if include_usage:
                    usage = engine.usage(models, config, prompt, item)
                    yield sse({**frame, "object": kind, "choices": [], "usage": usage})
                continue
            if events:
                pending.append(item.to_dict())
            delta = ""
            if isinstance(item, TextCommitted):
                text += item.delta
                delta = holdback.ready(text)
            if delta or pending:
                yield chunk(delta, **({"safe_events": pending} if events else {}))
                pending = []
        yield "data: [DONE]\n\n"
    finally:
        run.stop.set()  # a client that went away ends its run (a finished run ignores it)
