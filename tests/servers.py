"""Servers the tests start as processes of their own (the app, vLLM): a free port, and waiting until one answers."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path

from scripts.vllm_serve import free_port  # noqa: F401  (re-exported: one way to pick a port)


def wait_until_serving(url: str, process: subprocess.Popen, log: Path, seconds: float = 180) -> None:
    """Return once `url` answers; fail with the process's log if it exits or `seconds` pass first."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(url, timeout=10).close()
            return
        except OSError:
            assert process.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-4000:]
            time.sleep(0.5)


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
