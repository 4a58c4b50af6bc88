"""The front doors as a user reaches them once the package is installed, run from a folder outside any checkout with
no PYTHONPATH: the console scripts beside this interpreter, in a venv at either end of the dependency ranges
(tests/test_dependency_ends.py sets SAFE_ENDS_INNER; at the pins test_package.py covers these doors), on the
embedded pair.

- `safe-ensemble generate` runs SAFE, per-token and the drafter alone and prints the reference's texts
  (tests/reference_texts.json).
- `safe-studio` starts, and one run through its `generate` API (gradio_client, as the page's own calls) ends
  with tokens in the transcript and the trace it offers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import astuple
from pathlib import Path

import pytest
from servers import free_port, stop, wait_until_serving

from safe_engine import DEFAULT_MODELS

pytestmark = [
    pytest.mark.real_models,
    pytest.mark.skipif(
        not os.environ.get("SAFE_ENDS_INNER"),
        reason="runs inside the venvs at both ends (tests/test_dependency_ends.py); at the pins, test_package.py "
        "runs the installed front doors",
    ),
]
BIN = Path(sys.executable).parent
REFERENCE = json.loads((Path(__file__).parent / "reference_texts.json").read_text(encoding="utf-8"))
FLAGS = {"strategy": "--strategy", "safe_mode": "--safe-mode", "draft_gate": "--draft-gate", "max_new_tokens": None}


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> dict:
    """subprocess arguments for a command run from an empty folder, with no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["GRADIO_ANALYTICS_ENABLED"] = "False"
    return {"cwd": tmp_path_factory.mktemp("elsewhere"), "env": env}


def _flags(config: dict) -> list[str]:
    flags = ["--max-new-tokens", str(config["max_new_tokens"])]
    for key, flag in FLAGS.items():
        if flag and key in config:
            flags += [flag, str(config[key])]
    return flags


@pytest.mark.parametrize("name", ["safe", "per-token", "single:gemma-3-270m"])
def test_generate_prints_the_reference_text_for_each_strategy(outside, name):
    run = next(r for r in REFERENCE["runs"] if r["name"] == name)
    argv = [BIN / "safe-ensemble", "generate", "--prompt", run["prompt"], *_flags(run["config"]), "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, **outside)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)
    assert result["models"][0] == "gemma-3-270m" and result["text"] == run["text"]


def test_the_app_starts_and_a_run_through_its_api_ends_with_tokens(outside, tmp_path):
    from gradio_client import Client
    from safe_studio.settings import RunSettings

    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    with open(tmp_path / "studio.log", "w") as log:
        app = subprocess.Popen(
            [BIN / "safe-studio", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, **outside
        )
    try:
        wait_until_serving(f"{url}gradio_api/info", app, tmp_path / "studio.log")
        settings = RunSettings.defaults(list(DEFAULT_MODELS), "safe", 12)
        shown = Client(url, verbose=False).predict(
            "The capital of Madagascar is", *astuple(settings), api_name="/generate"
        )
    finally:
        stop(app)
    trace = next(v["value"] for v in shown if isinstance(v, dict) and str(v.get("value", "")).endswith(".jsonl"))
    events = [json.loads(line) for line in Path(trace).read_text(encoding="utf-8").splitlines()]
    assert events[-1]["kind"] == "run_finished" and 1 <= events[-1]["stats"]["tokens"] <= 12, shown[0]
    committed = [e for e in events if e["kind"] == "text_committed"]
    assert committed and any('class="tok' in v for v in shown if isinstance(v, str))  # the transcript drew them
