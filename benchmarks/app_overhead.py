"""Does the web app slow decoding? Tokens/s of the same SAFE runs through `python app.py` vs the engine alone.

The app's run handler consumes the engine's event iterator and renders after every commit, so any UI
cost lands inside the run's own wall time. Both sides report the engine's `tokens_per_s` from the
run_finished event (the app's comes from its downloadable trace); runs alternate between the two, one
at a time, so machine noise hits both alike.

    python -m benchmarks.app_overhead [--max-new-tokens 48] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import astuple
from pathlib import Path

from components.settings import RunSettings
from safe_engine.models.cache import load_models
from safe_engine.models.specs import DEFAULT_MODELS
from safe_engine.orchestration.comparison import warm_up
from safe_engine.strategies.decoding import DecodeConfig, decode

ROOT = Path(__file__).resolve().parents[1]

PROMPTS = [
    "Tom has 3 apples and buys 5 more. How many apples does he have?",
    "The capital of Madagascar is",
    "List three facts about the Moon.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, seconds: float = 180) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"{url} did not come up")


def app_tokens_per_s(client, prompt: str, max_new: int) -> float:
    settings = RunSettings.defaults(list(DEFAULT_MODELS), "safe", max_new)  # the form at the engine's defaults
    result = client.predict(
        prompt,
        *astuple(settings),
        api_name="/generate",
    )
    download = next(item for item in result if isinstance(item, dict) and str(item.get("value", "")).endswith(".jsonl"))
    trace = Path(download["value"])  # the app's "Download trace" button, on this machine's disk
    finished = [json.loads(line) for line in trace.read_text().splitlines() if '"run_finished"' in line][-1]
    return finished["stats"]["tokens_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from gradio_client import Client

    port = free_port()
    app = subprocess.Popen(
        [sys.executable, "app.py", "--port", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for(f"http://127.0.0.1:{port}/")
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        app_tokens_per_s(client, "Hi", 4)  # loads and warms the app's models
        models = load_models(list(DEFAULT_MODELS))
        config = DecodeConfig(max_new_tokens=args.max_new_tokens)
        warm_up(models, config)
        ratios = []
        print("| prompt | engine tok/s | app tok/s | app / engine |\n|---|---|---|---|")
        for _ in range(args.repeats):
            for prompt in PROMPTS:
                engine = list(decode(models, prompt, config))[-1].stats["tokens_per_s"]
                through_app = app_tokens_per_s(client, prompt, args.max_new_tokens)
                ratios.append(through_app / engine)
                print(f"| {prompt[:40]} | {engine:.2f} | {through_app:.2f} | {ratios[-1]:.3f} |", flush=True)
        print(
            f"\nmedian app / engine tokens/s over {len(ratios)} runs: {statistics.median(ratios):.3f} "
            f"(streaming overhead {1 - statistics.median(ratios):.1%}; target <= 5 %)"
        )
    finally:
        app.terminate()
        app.wait(timeout=30)


if __name__ == "__main__":
    main()
