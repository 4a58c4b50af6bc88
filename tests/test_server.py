"""The OpenAI-compatible server with the real `openai` client on a free local port: completions and chat,
streaming and not, several clients at once, a client disconnecting mid-stream, the queue's 429/503, the
bad-request corpus, and lm-eval's `local-completions` model running one of our offline tasks against it."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import uvicorn

openai = pytest.importorskip("openai")

from tiny_pair import tiny_pair_folders  # noqa: E402

from safe_engine.cli import build_parser  # noqa: E402
from safe_engine.contract.events import RunStarted  # noqa: E402
from safe_engine.integrations import LM_EVAL_TASKS_DIR  # noqa: E402
from safe_engine.integrations.requests import Completion  # noqa: E402
from safe_engine.models.cache import load_models  # noqa: E402
from safe_engine.options import decoding_values  # noqa: E402
from safe_engine.runtime.session import SCHEDULER  # noqa: E402
from safe_engine.server import app as server_app  # noqa: E402
from safe_engine.server.app import Settings, StopHoldback, create_app  # noqa: E402

KEY = "test-key"


class LiveServer:
    def __init__(self, app):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"
        self.engine = app.state.engine

    def close(self):
        self.server.should_exit = True
        self.thread.join(10)


def _app(models, api_key=KEY, **settings):
    args = build_parser().parse_args(["serve", "--models", *[m.spec.spec for m in models], "--max-new-tokens", "8"])
    return create_app(models, Settings(decoding_values(args), api_key=api_key, **settings))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return load_models(tiny_pair_folders(tmp_path_factory.mktemp("pair")))


@pytest.fixture(scope="module")
def live(models):
    server = LiveServer(_app(models))
    yield server
    server.close()


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=live.url + "/v1", api_key=KEY, max_retries=0)


def test_models_lists_each_strategy_and_the_pair(client):
    ids = [m.id for m in client.models.list()]
    assert ids == ["tiny-llama+tiny-gemma", "safe", "per-token", "single:tiny-llama", "single:tiny-gemma"]


def test_models_says_where_each_model_lives(live):
    data = httpx.get(live.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()["data"]
    where = {m["id"]: [(x["name"], x["device"], x["dtype"]) for x in m["models"]] for m in data}
    assert where["safe"] == [("tiny-llama", "cpu", "float32"), ("tiny-gemma", "cpu", "float32")]
    assert where["single:tiny-gemma"] == [("tiny-gemma", "cpu", "float32")]


def test_completion_carries_usage_and_safes_summary(client):
    reply = client.completions.create(
        model="safe", prompt="the answer is", max_tokens=6, extra_body={"safe": {"lookahead": 2}}
    )
    choice = reply.choices[0]
    assert choice.finish_reason in ("stop", "length") and reply.usage.completion_tokens <= 6
    assert reply.usage.prompt_tokens > 0
    safe = reply.model_extra["safe"]
    assert safe["strategy"] == "safe" and set(safe["oov_skips"]) == {"tiny-gemma"} and 0 <= safe["e_t"] <= 1


def test_greedy_completions_repeat_and_streaming_says_the_same(client):
    kwargs = dict(model="per-token", prompt="Q: the", max_tokens=8, temperature=0)
    whole = client.completions.create(**kwargs).choices[0].text
    assert client.completions.create(**kwargs).choices[0].text == whole
    pieces = [chunk.choices[0].text for chunk in client.completions.create(stream=True, **kwargs) if chunk.choices]
    assert "".join(pieces) == whole


def test_chat_streams_with_engine_events_and_usage(client):
    chunks = list(
        client.chat.completions.create(
            model="safe",
            messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "the answer"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"safe": {"events": True}},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    events = [e["kind"] for c in chunks for e in (c.model_extra or {}).get("safe_events") or []]
    assert events[0] == "run_started" and "text_committed" in events
    last_choice = [c for c in chunks if c.choices][-1]
    assert last_choice.choices[0].finish_reason in ("stop", "length") and "e_t" in last_choice.model_extra["safe"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens <= 6


def test_raw_stream_ends_with_done(live):
    body = {"model": "single:tiny-llama", "prompt": "the", "max_tokens": 4, "stream": True}
    with httpx.stream("POST", live.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}) as r:
        lines = [line for line in r.iter_lines() if line]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"


def test_several_clients_at_once(client):
    prompts = ["the", "the answer", "Q: the", "A: is"]

    def ask(prompt):
        return client.completions.create(model="safe", prompt=prompt, max_tokens=6).choices[0].text

    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(ask, prompts))
    assert together == [ask(p) for p in prompts]  # the same answers as one at a time


def test_a_client_disconnecting_mid_stream_cancels_its_run(live):
    before = live.engine.counters.cancelled
    body = {"model": "per-token", "prompt": "the", "max_tokens": 400, "stream": True}
    with httpx.stream("POST", live.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}) as r:
        next(r.iter_lines())  # the run has started; now hang up
    deadline = time.time() + 20
    while live.engine.counters.cancelled == before and time.time() < deadline:
        time.sleep(0.05)
    assert live.engine.counters.cancelled == before + 1 and live.engine.counters.running == 0


def test_a_client_that_hangs_up_on_a_plain_request_cancels_its_run(live):
    """Not streaming: the handler polls for the client while it waits, so a long run is not decoded for
    nobody."""
    before = live.engine.counters.cancelled
    body = {"model": "per-token", "prompt": "the", "max_tokens": 400}
    with SCHEDULER.device(live.engine.templated[0].device):  # its passes wait until the client has gone
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                live.url + "/v1/completions",
                json=body,
                headers={"Authorization": f"Bearer {KEY}"},
                timeout=httpx.Timeout(10, read=0.5),
            )
        time.sleep(4 * server_app.DISCONNECT_POLL_S)
    deadline = time.time() + 20
    while live.engine.counters.cancelled == before and time.time() < deadline:
        time.sleep(0.05)
    assert live.engine.counters.cancelled == before + 1 and live.engine.counters.running == 0


BAD = [
    ("/v1/completions", "{not json", 400, "invalid_value"),
    ("/v1/completions", {"model": "nope", "prompt": "x"}, 404, "model_not_found"),
    ("/v1/completions", {"model": "safe", "prompt": "x", "max_tokens": 0}, 400, "invalid_value"),
    ("/v1/completions", {"model": "safe", "prompt": "x", "max_tokens": 10**6}, 400, "invalid_value"),
    ("/v1/completions", {"model": "safe", "prompt": 5}, 400, "invalid_value"),
    ("/v1/completions", {"model": "safe", "prompt": "x", "temperature": "hot"}, 400, "invalid_value"),
    ("/v1/completions", {"model": "safe", "prompt": "x", "n": 2}, 400, "unsupported_parameter"),
    ("/v1/completions", {"model": "safe", "prompt": "x", "safe": {"lookahead": "many"}}, 400, "invalid_value"),
    ("/v1/completions", {"model": "safe", "prompt": "x", "safe": {"models": ["a"]}}, 400, "invalid_safe_option"),
    ("/v1/completions", {"model": "safe", "prompt": "the answer " * 400, "max_tokens": 8}, 400, "invalid_value"),
    ("/v1/completions", {"model": "safe", "prompt": "   "}, 400, "invalid_value"),
    ("/v1/chat/completions", {"model": "safe", "messages": []}, 400, "invalid_value"),
    ("/v1/chat/completions", {"model": "safe", "messages": [{"role": "wizard", "content": "x"}]}, 400, "invalid_value"),
    ("/v1/chat/completions", {"model": "safe", "messages": "hello"}, 400, "invalid_value"),
]


@pytest.mark.parametrize("path, body, status, code", BAD)
def test_bad_requests_get_openai_errors(live, path, body, status, code):
    content = body if isinstance(body, str) else json.dumps(body)
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    reply = httpx.post(live.url + path, content=content, headers=headers)
    assert reply.status_code == status
    error = reply.json()["error"]
    assert error["code"] == code and error["message"] and "Traceback" not in reply.text


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}])
def test_a_missing_or_wrong_api_key_is_refused(live, headers):
    reply = httpx.get(live.url + "/v1/models", headers=headers)
    assert reply.status_code == 401 and reply.json()["error"]["code"] == "invalid_api_key"


def test_the_openai_client_raises_on_an_unknown_model(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x")


def test_a_full_queue_answers_429_and_a_long_wait_503(models, monkeypatch):
    gate = threading.Event()

    def held(models_, prompt, config, stop, on_event):  # a run that lasts until the test lets it go
        on_event(RunStarted("safe", "tiny-llama", [], {}, {}))
        gate.wait(20)
        return Completion("done", "eos", {}, 1)

    monkeypatch.setattr(server_app, "complete", held)
    server = LiveServer(_app(models, api_key=None, concurrency=1, queue=1, queue_timeout_s=1.0))
    body = {"model": "safe", "prompt": "the"}
    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(httpx.post, server.url + "/v1/completions", json=body, timeout=30)
            while server.engine.counters.running == 0:
                time.sleep(0.02)
            waiting = pool.submit(httpx.post, server.url + "/v1/completions", json=body, timeout=30)
            while server.engine.counters.waiting == 0:
                time.sleep(0.02)
            full = httpx.post(server.url + "/v1/completions", json=body)
            assert full.status_code == 429 and full.json()["error"]["code"] == "queue_full"
            assert waiting.result().status_code == 503
            gate.set()
            assert first.result().json()["choices"][0]["text"] == "done"
    finally:
        gate.set()
        server.close()


def test_stop_sequences_are_held_back_while_streaming():
    holdback = StopHoldback(["\n\n", "END"])
    assert holdback.ready("one\n") == "one"  # "\n" may start "\n\n"
    assert holdback.ready("one\nE") == "\n"  # "E" may start "END"
    assert holdback.ready("one\nEx") == "Ex"
    assert holdback.rest("one\nEx y") == " y"


def test_lm_evals_local_completions_runs_our_offline_task_against_the_server(models):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    server = LiveServer(_app(models, api_key=None))
    try:
        results = lm_eval.simple_evaluate(
            model="local-completions",
            model_args={
                "base_url": server.url + "/v1/completions",
                "model": "safe",
                "tokenizer_backend": None,
                "tokenized_requests": False,
                "eos_string": "</s>",
                "max_retries": 1,
            },
            tasks=["safe_arithmetic"],
            limit=2,
            gen_kwargs="max_gen_toks=4",
            task_manager=TaskManager(include_path=str(LM_EVAL_TASKS_DIR)),
        )
    finally:
        server.close()
    assert "bench_correct,none" in results["results"]["safe_arithmetic"]
    assert server.engine.counters.completed == 2
