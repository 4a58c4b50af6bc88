"""Serve embedded models with vLLM's CPU build, one server per model, for the real-engine tests and for people.

    python -m scripts.vllm_serve gemma-3-270m=8011            # serve until Ctrl-C
    python -m scripts.vllm_serve gemma-3-270m=8011 smollm2-135m-instruct=8012

Each server answers at http://127.0.0.1:PORT/v1 under the served name before the first dash (gemma,
smollm2): the model spec is ``openai:http://127.0.0.1:8011/v1#gemma``. vLLM lives in a venv of its own
(VLLM_PYTHON, default /opt/vllm-venv/bin/python; bash scripts/setup.sh --vllm installs it): it pins a torch and
a transformers of its own. The first start compiles for about 3 minutes (cached afterwards). The prefix cache
keeps whole blocks of 32 tokens (`--block-size`; the CPU build's default is 128): a served verifier's requests
reuse the context up to the last whole block and compute the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

VLLM_PYTHON = os.environ.get("VLLM_PYTHON", os.environ.get("VLLM_VENV", "/opt/vllm-venv") + "/bin/python")
READY_TIMEOUT_S = 600


def served_name(model: str) -> str:
    return model.split("-")[0]


def command(folder: Path, name: str, port: int) -> list[str]:
    return [
        VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
        "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
        "--max-model-len", "2048", "--max-logprobs", "50", "--block-size", "32",
    ]  # fmt: skip


@dataclass(frozen=True)
class Server:
    url: str  # the OpenAI API root, http://127.0.0.1:PORT/v1
    process: subprocess.Popen  # the API server, leading a process group of its own (the engine process too)

    def kill(self) -> None:
        """End it at once, as a crash would (the fault tests)."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


@contextmanager
def serving(models: dict[str, int], log_dir: Path | None = None):
    """Start one vLLM server per embedded model (name -> port), wait until each lists its model, yield
    {name: Server}, and stop them all (their process groups) on the way out."""
    from safe_engine.models.embedded import ensure_converted

    if not Path(VLLM_PYTHON).is_file():
        raise SystemExit(f"no vLLM at {VLLM_PYTHON}: run bash scripts/setup.sh --vllm or set VLLM_PYTHON")
    env = os.environ | {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    servers, started = [], {}
    try:
        for model, port in models.items():
            folder = ensure_converted(model)
            log = open((log_dir or Path("/tmp")) / f"vllm-{port}.log", "w")
            process = subprocess.Popen(
                command(folder, served_name(model), port), env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            servers.append((process, log))
            started[model] = Server(f"http://127.0.0.1:{port}/v1", process)
        for (process, log), server in zip(servers, started.values()):
            wait_ready(process, server.url, log.name)
        yield started
    finally:
        for process, log in servers:
            stop(process)
            log.close()


def wait_ready(process: subprocess.Popen, url: str, log: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vLLM for {url} exited with {process.returncode}; see {log}")
        try:
            with urllib.request.urlopen(url + "/models", timeout=2) as answer:
                if json.load(answer).get("data"):
                    return
        except OSError:
            time.sleep(2)
    raise RuntimeError(f"vLLM for {url} was not ready after {READY_TIMEOUT_S} s; see {log}")


def stop(process: subprocess.Popen) -> None:
    """End the server's process group (vLLM starts an engine process beside the API server)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _model_port(value: str) -> tuple[str, int]:
    model, _, port = value.partition("=")
    if not model or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not MODEL=PORT (e.g. gemma-3-270m=8011)")
    return model, int(port)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.vllm_serve", description=__doc__.splitlines()[0])
    parser.add_argument(
        "servers", nargs="+", type=_model_port, metavar="MODEL=PORT", help="an embedded model and a port"
    )
    models = dict(parser.parse_args(argv).servers)
    with serving(models) as servers:
        for model, server in servers.items():
            print(f"openai:{server.url}#{served_name(model)}", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
