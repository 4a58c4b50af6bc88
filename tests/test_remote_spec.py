"""The ``openai:`` spec without a real engine: parsing, load-time refusals, retries, a stalled server, the
documented top-k approximation, the choice of a scoring call's request shape. A real vLLM server is the check
of the rest (test_remote_vllm.py)."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from safe_engine import DecodeConfig, ModelLoadError, ModelSpecError, load_model
from safe_engine.models.embedded import converted_dir
from safe_engine.models.specs import resolve_spec
from safe_engine.remote.http_client import HttpSettings, JsonClient, RemoteError
from safe_engine.remote.openai_session import Row
from safe_engine.remote.openai_spec import parse_openai_spec
from safe_engine.remote.request_shapes import PER_POSITION, PROMPT_LOGPROBS, ShapeCosts
from safe_engine.strategies.decoding import decode


def test_a_spec_names_url_model_and_optional_tokenizer():
    parsed = parse_openai_spec("openai:http://127.0.0.1:8011/v1/#gemma@/models/gemma")
    assert (parsed.base_url, parsed.name, parsed.tokenizer) == ("http://127.0.0.1:8011/v1", "gemma", "/models/gemma")
    assert resolve_spec("openai:http://h:1/v1#smollm2").short_name == "smollm2"


@pytest.mark.parametrize(
    "spec, said",
    [
        ("openai:http://127.0.0.1:8011/v1", "names no served model"),
        ("openai:127.0.0.1:8011#gemma", "no http.s. URL"),
        ("openai:http://127.0.0.1:99999/v1#gemma", "bad port"),
    ],
)
def test_a_malformed_spec_is_refused_before_any_call(spec, said):
    with pytest.raises(ModelSpecError, match=said):
        resolve_spec(spec)


def test_an_unreachable_host_is_refused_at_load_time(monkeypatch):
    monkeypatch.setenv("SAFE_OPENAI_RETRIES", "1")
    began = time.monotonic()
    with pytest.raises(ModelLoadError, match="unreachable after 2 tries .*is the server running"):
        load_model("openai:http://127.0.0.1:9/v1#gemma")
    assert time.monotonic() - began < 5


def test_the_kept_top_k_is_exact_and_the_rest_shares_what_is_left():
    row = Row({3: -0.5, 7: -1.5}).dense(10)
    probs = torch.softmax(row, 0)
    assert probs[3].item() == pytest.approx(0.6065, abs=1e-4) and probs[7].item() == pytest.approx(0.2231, abs=1e-4)
    rest = (1 - 0.6065 - 0.2231) / 8
    assert probs[0].item() == pytest.approx(rest, abs=1e-4) and int(probs.argmax()) == 3


def test_a_scoring_call_tries_each_shape_then_takes_the_cheaper_one_at_its_context_length():
    costs = ShapeCosts()
    assert costs.choose(40) == PROMPT_LOGPROBS  # nothing measured: today's one request
    costs.note(PROMPT_LOGPROBS, 40, 0.30)
    assert costs.choose(40) == PER_POSITION  # untried here
    costs.note(PER_POSITION, 40, 0.40)
    assert costs.choose(40) == PROMPT_LOGPROBS
    assert costs.choose(100) == PROMPT_LOGPROBS  # the next band: 0.30 and 0.40 are lower bounds there
    costs.note(PROMPT_LOGPROBS, 100, 0.80)  # the prefill grew with the context
    assert costs.choose(100) == PER_POSITION
    costs.note(PER_POSITION, 100, 0.42)
    assert costs.choose(100) == costs.choose(1000) == PER_POSITION  # 0.42 against at least 0.80
    costs.note(PER_POSITION, 1000, 0.45)
    assert costs.choose(1000) == PER_POSITION
    for _ in range(4):  # a moving average: slow calls move it, and the choice with it
        costs.note(PER_POSITION, 1000, 3.0)
    assert costs.choose(1000) == PROMPT_LOGPROBS


def test_safe_openai_verify_fixes_the_shape_and_a_bad_value_is_refused(monkeypatch):
    costs = ShapeCosts()
    costs.note(PER_POSITION, 40, 9.0)
    monkeypatch.setenv("SAFE_OPENAI_VERIFY", PER_POSITION)
    assert costs.choose(40) == PER_POSITION
    monkeypatch.setenv("SAFE_OPENAI_VERIFY", "fastest")
    with pytest.raises(RemoteError, match="SAFE_OPENAI_VERIFY must be auto, prompt_logprobs or per_position"):
        costs.choose(40)


class StandIn(BaseHTTPRequestHandler):
    """A server that lists one model (SmolLM2's converted folder as its root) and then misbehaves on
    completions: `stall` seconds without answering, or `status` every time."""

    stall, status, posts = 0.0, 200, 0

    def do_GET(self):
        root = str(converted_dir("smollm2-135m-instruct"))
        self._send(200, {"data": [{"id": "smollm2", "root": root, "max_model_len": 2048}]})

    def do_POST(self):
        type(self).posts += 1
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.stall:
            time.sleep(self.stall)
        self._send(self.status, {"error": {"message": "overloaded, try later"}})

    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def stand_in():
    handler = type("Handler", (StandIn,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield handler, f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_transient_errors_are_retried_with_backoff_then_fail_with_the_servers_message(stand_in):
    handler, url = stand_in
    handler.status = 503
    client = JsonClient(url, None, HttpSettings(timeout_s=5, retries=2, backoff_s=0.05))
    with pytest.raises(RemoteError, match="answered 503: overloaded, try later"):
        client.post("/completions", {})
    assert handler.posts == 3


def test_an_unknown_served_name_is_refused_at_load_time_with_the_names_served(stand_in):
    with pytest.raises(ModelLoadError, match="does not serve 'gemma'; it serves: smollm2"):
        load_model(f"openai:{stand_in[1]}#gemma")


@pytest.mark.real_models
@pytest.mark.parametrize("served", ["drafter", "verifier"])
def test_a_stalled_server_fails_its_run_after_the_timeout_while_a_local_run_goes_on(
    served, stand_in, smollm, monkeypatch
):
    """As the verifier, every request of its round (one per scored position) waits on the stalled server."""
    handler, url = stand_in
    handler.stall = 30
    monkeypatch.setenv("SAFE_OPENAI_TIMEOUT_S", "1")
    monkeypatch.setenv("SAFE_OPENAI_VERIFY", PER_POSITION)
    remote = load_model(f"openai:{url}#smollm2")
    assert remote.describe()["placement"] == remote.describe()["runtime"] == "openai"
    assert len(remote.tokenizer) == len(smollm.tokenizer)
    outcome = {}

    def local():
        events = list(decode([smollm], "Name a colour.", DecodeConfig(strategy="single", max_new_tokens=24)))
        outcome["local"] = events[-1].kind

    thread = threading.Thread(target=local)
    thread.start()
    began = time.monotonic()
    models, strategy = ([remote], "single") if served == "drafter" else ([smollm, remote], "safe")
    with pytest.raises(RemoteError, match="did not answer within 1 s"):
        list(decode(models, "Name a colour.", DecodeConfig(strategy=strategy, max_new_tokens=8, damage_kl_steps=0)))
    assert time.monotonic() - began < 10
    thread.join()
    assert outcome["local"] == "run_finished"
