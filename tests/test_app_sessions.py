"""The app serving several sessions at once through its API (gradio_client, one client per session, against
the app launched in this process on tiny models): their runs step together in the batching executor, each
session gets the output it gets alone, and Stop ends only the run of the session that pressed it."""

import json
import threading
import time
from dataclasses import astuple
from pathlib import Path

import pytest
from servers import free_port
from tiny_models import char_tokenizer, tiny_model_folder, unigram_tokenizer

from components.run_stream import sharing_html
from components.settings import RunSettings
from components.stops import Stops
from safe_engine.models.cache import load_models
from safe_engine.runtime.session import SCHEDULER, runs_sharing
from safe_engine.strategies.decoding import DecodeConfig, decode

Client = pytest.importorskip("gradio_client").Client
PROMPTS = ["the cat sat on", "a dog", "on the mat the cat sat at the"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from components import studio

    words = [" the", " cat", " sat", " on", " mat", " dog", " at", "the", "cat", "sat", "on", "ma", "t"]
    specs = [
        str(tiny_model_folder(tmp_path_factory.mktemp("a"), char_tokenizer(), arch="gemma3", seed=1)),
        str(tiny_model_folder(tmp_path_factory.mktemp("b"), unigram_tokenizer(words), seed=2)),
    ]
    demo = studio.build_demo(specs)
    port = free_port()
    studio.launch(demo, port=port, prevent_thread_lock=True, quiet=True)
    try:
        yield f"http://127.0.0.1:{port}/", specs
    finally:
        demo.close()


def _finished(result) -> dict:
    """The run_finished event of the trace the run's Download button offers."""
    download = next(v for v in result if isinstance(v, dict) and str(v.get("value", "")).endswith(".jsonl"))
    lines = Path(download["value"]).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if '"run_finished"' in line][-1]


def _wait_queued(lm, n: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with SCHEDULER.lock:
            if lm.sessions.executor(SCHEDULER).waiting() == n:
                return
        time.sleep(0.02)
    pytest.fail(f"{n} sessions' runs did not wait on the models together")


def _sessions_at_once(url, drafter, calls, while_held=lambda clients: None):
    """Each call(client) in a thread with a client (a session) of its own, their first passes held back
    until every run waits on the drafter (with one run at a time this fails); `while_held` runs then."""
    clients = [Client(url, verbose=False) for _ in calls]
    results = [None] * len(calls)

    def work(i):
        results[i] = calls[i](clients[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(calls))]
    with SCHEDULER.device(drafter.device):
        for thread in threads:
            thread.start()
        _wait_queued(drafter, len(calls))
        while_held(clients)
    for thread in threads:
        thread.join(120)
    return results


def _generate(specs, prompt, max_new=20, strategy="safe"):
    settings = RunSettings.defaults(specs, strategy, max_new)
    return lambda client: client.predict(prompt, *astuple(settings), api_name="/generate")


def test_sessions_run_at_once_and_each_gets_its_run_alone(served):
    url, specs = served
    drafter = load_models(specs)[0]  # the app's own models: one cache per process
    alone = [_finished(_generate(specs, p)(Client(url, verbose=False))) for p in PROMPTS]
    results = _sessions_at_once(url, drafter, [_generate(specs, p) for p in PROMPTS])
    together = [_finished(r) for r in results]
    assert [f["text"] for f in together] == [f["text"] for f in alone]
    for finished in together:
        forward = finished["stats"]["forward"]
        assert any(entry["rows"] > entry["passes"] for entry in forward.values())  # passes were shared
    assert runs_sharing([lm.sessions for lm in load_models(specs)]) == 0


def test_stop_ends_only_the_run_of_the_session_that_pressed_it(served):
    url, specs = served
    drafter = load_models(specs)[0]
    alone = _finished(_generate(specs, PROMPTS[1], max_new=40)(Client(url, verbose=False)))
    runs = [_generate(specs, PROMPTS[0], max_new=40), _generate(specs, PROMPTS[1], max_new=40)]
    # the first session presses Stop while both runs wait on a pass
    results = _sessions_at_once(url, drafter, runs, lambda clients: clients[0].predict(api_name="/stop"))
    stopped, other = _finished(results[0]), _finished(results[1])
    assert stopped["stop_reason"] == "stopped" and stopped["stats"]["tokens"] < 40
    assert other["stop_reason"] != "stopped" and other["text"] == alone["text"]


def test_the_sharing_line_counts_the_runs_on_the_models(served):
    _, specs = served
    models = load_models(specs)
    assert "No run on the models now" in sharing_html(models)
    runs = [decode(models, p, DecodeConfig(max_new_tokens=8)) for p in PROMPTS[:2]]
    for run in runs:
        next(run)
    assert "2 runs share the models now" in sharing_html(models)
    runs[0].close()
    assert "1 run on the models now" in sharing_html(models)
    runs[1].close()


def test_a_sessions_overlapping_runs_share_its_stop_flag():
    stops = Stops()
    live, compare, other = stops.arm("a"), stops.arm("a"), stops.arm("b")
    assert live is compare and other is not live
    stops.stop("a")
    assert live.is_set() and not other.is_set()
    fresh = stops.arm("a")  # a run started after the Stop gets a flag of its own
    assert not fresh.is_set()
    stops.disarm("a", live)
    stops.disarm("a", compare)
    assert stops._flags == {"a": fresh, "b": other}
    stops.disarm("a", fresh)
    stops.disarm("b", other)
    assert stops._flags == {}
