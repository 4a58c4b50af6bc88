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
import socket
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


@dataclass(frozen=True)
class Launch:
    """One vLLM server to start: the model folder, the name it serves, its port, and where it computes."""

    folder: Path
    name: str
    port: int
    gpu: int | None = None  # the CUDA device it runs on, in bf16; None: the CPU build, in fp32
    gpu_share: float = 0.3  # of that GPU's memory vLLM may take (a check's in-process models hold the rest)
    python: str = VLLM_PYTHON  # an interpreter that imports vllm


def command(launch: Launch) -> list[str]:
    device = (
        ["--dtype", "float32"]
        if launch.gpu is None
        else ["--dtype", "bfloat16", "--gpu-memory-utilization", str(launch.gpu_share), "--enforce-eager"]
    )
    return [
        launch.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(launch.folder),
        "--served-model-name", launch.name, "--host", "127.0.0.1", "--port", str(launch.port), *device,
        "--max-model-len", "2048", "--max-logprobs", "50", "--block-size", "32",
    ]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    """Start one vLLM server per embedded model (name -> port) on the CPU build, wait until each lists its model,
    yield {name: Server}, and stop them all (their process groups) on the way out."""
    from safe_engine.models.embedded import ensure_converted

    launches = {model: Launch(ensure_converted(model), served_name(model), port) for model, port in models.items()}
    with serving_launches(launches, log_dir) as servers:
        yield servers


@contextmanager
def serving_launches(launches: dict[str, Launch], log_dir: Path | None = None):
    """Start each launch's server, wait until each lists its model, yield {key: Server}, stop them all."""
    for launch in launches.values():
        if not Path(launch.python).is_file():
            raise SystemExit(f"no vLLM at {launch.python}: run bash scripts/setup.sh --vllm or set VLLM_PYTHON")
    servers, started = [], {}
    try:
        for key, launch in launches.items():
            env = os.environ | {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
            if launch.gpu is not None:
                env["CUDA_VISIBLE_DEVICES"] = str(launch.gpu)
            log = open((log_dir or Path("/tmp")) / f"vllm-{launch.port}.log", "w")
            process = subprocess.Popen(
                command(launch), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            servers.append((process, log))
            started[key] = Server(f"http://127.0.0.1:{launch.port}/v1", process)
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
