"""Shared fixtures. Real embedded models load once per test session (conversion is cached on disk).

`SAFE_TEST_BATCHED=1` runs the tests' decodes through the batched path: each test module's `decode` (the
name it imported from safe_engine or safe_engine.strategies.decoding) is swapped for `batched_decode`, which
drives the run alongside two companions on the same models and prompt, so that their requests share forward passes.
The run under test must still give the events it gives alone (every test keeps its assertions), up to
float differences between batch shapes: a test that compares two runs' floats bit for bit is marked
`alone` and decodes alone in either mode.
"""

import dataclasses
import os
import threading
import time
from contextlib import ExitStack

import pytest

from safe_engine.models.cache import load_models
from safe_engine.models.loading import LoadOptions
from safe_engine.models.specs import DEFAULT_MODELS
from safe_engine.runtime.session import SCHEDULER
from safe_engine.strategies import decoding

BATCHED = os.environ.get("SAFE_TEST_BATCHED") == "1"
DEFAULT_CONFIG = decoding.DecodeConfig()


def out_of_step(config: decoding.DecodeConfig) -> decoding.DecodeConfig:
    """The second companion's config: a token less per round, so its rows are ragged and at other offsets."""
    return dataclasses.replace(config, lookahead=max(1, config.lookahead - 1))


def hold_first_pass(models, runs: int, held: threading.Event, ended: threading.Event) -> None:
    """Hold the models' devices until each of the runs queued its first request (or the run under test
    ended), so that the first pass is shared by all; the twins then stay in step."""
    executors = {lm.sessions.executor(SCHEDULER) for lm in models}
    with ExitStack() as devices:
        for device in sorted({str(lm.device) for lm in models}):
            devices.enter_context(SCHEDULER.device(device))
        held.set()
        deadline = time.monotonic() + 5
        while not ended.is_set() and time.monotonic() < deadline:
            with SCHEDULER.lock:
                if sum(e.waiting() for e in executors) >= runs:
                    return
            time.sleep(0.001)


class BatchedDecodes:
    """`decode` run with companions: a twin (the same config, every pass shared) and one `out_of_step`."""

    def __init__(self):
        self.errors: list[Exception] = []

    def decode(self, models, prompt, config=DEFAULT_CONFIG, cancel=None):
        events = decoding.decode(models, prompt, config, cancel)  # bad input raises here, as alone
        stop = threading.Event()
        companions = [decoding.decode(models, prompt, c, stop) for c in (config, out_of_step(config))]
        return self._alongside(models, events, companions, stop)

    def _alongside(self, models, events, companions, stop):
        held = threading.Event()
        threads = [threading.Thread(target=hold_first_pass, args=(models, 1 + len(companions), held, stop))]
        threads += [threading.Thread(target=self._drain, args=(c,), name="companion-decode") for c in companions]
        threads[0].start()
        held.wait()
        for thread in threads[1:]:
            thread.start()
        try:
            yield from events
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)

    def _drain(self, events) -> None:
        try:
            for _ in events:
                pass
        except Exception as exc:  # a companion must not fail where the run under test does not
            self.errors.append(exc)


@pytest.fixture
def batched_decode():
    """`decode` alongside companion runs sharing its passes; the test fails if a companion failed."""
    decodes = BatchedDecodes()
    yield decodes.decode
    assert not decodes.errors, f"a companion run failed: {decodes.errors[0]!r}"


@pytest.fixture(autouse=True)
def _decodes_in_a_batch(request, monkeypatch):
    alone = request.node.get_closest_marker("alone")
    if BATCHED and not alone and getattr(request.module, "decode", None) is decoding.decode:
        monkeypatch.setattr(request.module, "decode", request.getfixturevalue("batched_decode"))


@pytest.fixture(scope="session")
def gemma():
    # load_models keeps one copy per process, so the CLI and the app under test reuse these.
    return load_models(["embedded:gemma-3-270m"])[0]


@pytest.fixture(scope="session")
def smollm():
    return load_models(["embedded:smollm2-135m-instruct"])[0]


@pytest.fixture(scope="session")
def fp32_pair():
    """The pair in fp32 with transformers' own linear layers (`--cpu-linear torch`): for comparing logits tightly,
    a test of the runtime or the conversion, not of the CPU kernels (the default streamed layers change their
    form with the row count, and the opt-in int8 head's logits are bf16)."""
    return load_models(list(DEFAULT_MODELS), LoadOptions(cpu_linear="torch"))


@pytest.fixture(scope="session")
def embedded_pair(gemma, smollm):
    """The default order: Gemma drafts, SmolLM2 verifies."""
    return [gemma, smollm]
