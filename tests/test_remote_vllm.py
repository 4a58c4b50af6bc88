"""Against a real engine: vLLM's CPU build serving Gemma-3-270M (scripts/vllm_serve.py), SmolLM2 in-process.

One server for the module (about 2 GB; its first start compiles for ~3 minutes, later starts ~1 minute). The
test that kills the server runs last. The full 20-prompt comparison is benchmarks/remote_vs_local.py.
"""

import json
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import astuple, replace
from pathlib import Path

import pytest
import torch
from ci import skip_or_fail
from servers import free_port

from safe_engine.contract.events import RunFinished, TextCommitted
from safe_engine.models.loading import load_model
from safe_engine.orchestration.comparison import summarize
from safe_engine.remote.http_client import RemoteError
from safe_engine.remote.request_shapes import PER_POSITION, PROMPT_LOGPROBS
from safe_engine.strategies.decoding import DecodeConfig, decode
from scripts.vllm_serve import VLLM_PYTHON, serving

pytestmark = [pytest.mark.vllm, pytest.mark.real_models]
PROMPT = "The capital of Madagascar is"
CONFIG = DecodeConfig(max_new_tokens=32, damage_kl_steps=0)
ROOT = Path(__file__).resolve().parents[1]
LONG_TEXT = ROOT / "docs" / "algorithm.md"  # any prose over 1024 tokens


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not Path(VLLM_PYTHON).is_file():
        skip_or_fail(f"no vLLM at {VLLM_PYTHON} (bash scripts/setup.sh --vllm)")
    with serving({"gemma-3-270m": free_port()}, tmp_path_factory.mktemp("vllm")) as servers:
        yield servers["gemma-3-270m"]


@pytest.fixture(scope="module")
def remote_gemma(server):
    return load_model(f"openai:{server.url}#gemma")


def committed(models, prompt=PROMPT, config=CONFIG) -> list[int]:
    return [i for e in decode(models, prompt, config) if isinstance(e, TextCommitted) for t in e.tokens for i in t.ids]


def test_the_tokenizer_comes_from_the_root_the_server_reports(remote_gemma, gemma):
    assert remote_gemma.tokenizer.get_vocab() == gemma.tokenizer.get_vocab()
    assert remote_gemma.eos_ids == gemma.eos_ids
    assert remote_gemma.describe()["placement"] == "openai"


@pytest.mark.parametrize("strategy", ["single", "per-token", "safe"])
def test_a_served_drafter_commits_the_tokens_of_the_in_process_run(strategy, remote_gemma, gemma, smollm):
    config = replace(CONFIG, strategy=strategy)
    local = committed([gemma, smollm], config=config)
    assert committed([remote_gemma, smollm], config=config) == local and len(local) == 32


@pytest.mark.parametrize("shape", [PROMPT_LOGPROBS, PER_POSITION])
def test_a_served_verifier_scores_as_the_in_process_one(shape, remote_gemma, gemma, smollm, monkeypatch):
    """SmolLM2 drafts, the served Gemma verifies, its rows asked in one request shape or the other."""
    monkeypatch.setenv("SAFE_OPENAI_VERIFY", shape)
    config = replace(CONFIG, strategy="safe")
    local = committed([smollm, gemma], config=config)
    events = list(decode([smollm, remote_gemma], PROMPT, config))
    assert [i for e in events if isinstance(e, TextCommitted) for t in e.tokens for i in t.ids] == local
    finished = next(e for e in events if isinstance(e, RunFinished))
    served = finished.stats["forward"]["gemma"]
    assert len(local) == 32 and set(served["shapes"]) == {shape}
    assert served["requests"] > served["passes"] if shape == PER_POSITION else served["requests"] == served["passes"]


def verify_round(lm, ids: list[int], starts: list[int]) -> tuple[torch.Tensor, float]:
    """A verifier's call in a session of its own: its rows and its seconds."""
    with lm.open_session() as session:
        began = time.perf_counter()
        rows = session.next_token_logits(ids, starts)
        return rows, time.perf_counter() - began


def test_a_verify_round_after_1024_tokens_costs_at_most_1_5x_one_after_32_with_the_same_scores(
    remote_gemma, monkeypatch
):
    """Gemma scores a 5-token draft after 32 and after 1024 tokens of context, four rounds each, the context
    growing by 5 tokens a round as in a run (the first round leaves its prefix in the server's cache, as a
    run's earlier rounds do; the other three are timed, median). The 1024-token round costs at most 1.5x the
    cheaper shape's 32-token round, and gives the rows that prompt_logprobs gives (one round of it at 1024:
    about 12 s of prefill)."""
    text = remote_gemma.tokenizer(LONG_TEXT.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    seconds, rows = {}, {}
    for shape, context, rounds in [
        (PROMPT_LOGPROBS, 32, 4),
        (PER_POSITION, 32, 4),
        (PROMPT_LOGPROBS, 1024, 1),
        (PER_POSITION, 1024, 4),
    ]:
        monkeypatch.setenv("SAFE_OPENAI_VERIFY", shape)
        times = []
        for r in range(rounds):
            start = context + 5 * r
            rows[shape, context, r], took = verify_round(remote_gemma, text[: start + 5], list(range(start, start + 5)))
            times.append(took)
        seconds[shape, context] = statistics.median(times[1:] or times)
    for (shape, context, r), row in rows.items():
        if shape == PER_POSITION and (PROMPT_LOGPROBS, context, r) in rows:
            torch.testing.assert_close(row, rows[PROMPT_LOGPROBS, context, r], atol=1e-4, rtol=0)
    short = min(seconds[PROMPT_LOGPROBS, 32], seconds[PER_POSITION, 32])
    assert seconds[PER_POSITION, 1024] <= 1.5 * short, seconds


def test_the_cli_runs_a_served_model_beside_a_local_one(server, gemma, smollm):
    models = [f"openai:{server.url}#gemma", "embedded:smollm2-135m-instruct"]
    argv = ["generate", "--models", *models, "--max-new-tokens", "16", "--json", "--prompt", PROMPT]
    out = subprocess.run([sys.executable, "-m", "safe_engine", *argv], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    local = summarize(list(decode([gemma, smollm], PROMPT, replace(CONFIG, max_new_tokens=16))))
    assert json.loads(out.stdout)["text"] == local["text"]


def test_a_seed_reproduces_a_sampled_run_over_the_server(remote_gemma, smollm):
    """Sampling is done here, from the distributions the server returns (greedy requests, no server seed):
    a seed reproduces the run; another seed gives another run."""
    sampled = replace(CONFIG, temperature=0.9, seed=7, max_new_tokens=12)  # sampled drafts miss the lookahead: slow
    first = committed([remote_gemma, smollm], "Write a short story about a fox.", sampled)
    assert committed([remote_gemma, smollm], "Write a short story about a fox.", sampled) == first
    assert committed([remote_gemma, smollm], "Write a short story about a fox.", replace(sampled, seed=8)) != first


def test_the_app_runs_a_served_pair_like_a_local_one(server, remote_gemma, smollm, tmp_path):
    Client = pytest.importorskip("gradio_client").Client
    from components import studio
    from components.settings import RunSettings

    specs = [f"openai:{server.url}#gemma", "embedded:smollm2-135m-instruct"]
    demo = studio.build_demo(specs)
    port = free_port()
    studio.launch(demo, port=port, prevent_thread_lock=True, quiet=True)
    try:
        settings = RunSettings.defaults(specs, "safe", 16)
        result = Client(f"http://127.0.0.1:{port}/", verbose=False).predict(
            PROMPT, *astuple(settings), api_name="/generate"
        )
    finally:
        demo.close()
    download = next(v for v in result if isinstance(v, dict) and str(v.get("value", "")).endswith(".jsonl"))
    events = [json.loads(line) for line in Path(download["value"]).read_text(encoding="utf-8").splitlines()]
    started = next(e for e in events if e["kind"] == "run_started")
    assert started["models"][0]["placement"] == "openai"
    expected = summarize(list(decode([remote_gemma, smollm], PROMPT, replace(CONFIG, max_new_tokens=16))))
    assert [e for e in events if e["kind"] == "run_finished"][-1]["text"] == expected["text"]


def recipe_command(url: str, out: Path) -> list[str]:
    """docs/served_recipe.md's rehearsal bench command, with this module's server for Gemma, SmolLM2 in process
    (one server per module), one row per task, 24 tokens and `out` as the folder."""
    page = (ROOT / "docs" / "served_recipe.md").read_text(encoding="utf-8")
    block = re.search(r"## Rehearse on a CPU.*?```bash\n(.*?)```", page, re.S).group(1)
    line = next(line for line in block.replace("\\\n", " ").splitlines() if line.startswith("safe-ensemble bench"))
    served = {"openai:http://127.0.0.1:8011/v1#gemma": f"openai:{url}#gemma"}
    served["openai:http://127.0.0.1:8012/v1#smollm2"] = "embedded:smollm2-135m-instruct"
    argv = [served.get(arg, arg) for arg in shlex.split(line)[1:]]
    for option, value in {"--limit": "1", "--max-new-tokens": "24", "--out": str(out)}.items():
        argv[argv.index(option) + 1] = value
    return [sys.executable, "-m", "safe_engine", *argv]


def test_the_recipes_bench_command_prints_the_papers_table(server, tmp_path):
    command = recipe_command(server.url, tmp_path / "paper")
    assert "--style" in command and "cot" in command and f"openai:{server.url}#gemma" in command
    out = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    header, *rows = out.stdout.strip().splitlines()
    assert header.split()[:6] == ["task", "strategy", "examples", "accuracy", "mean_e_t", "median_wall_ratio"]
    strategies = {row.split()[1] for row in rows}
    assert {"single:gemma", "single:smollm2-135m-instruct", "per-token", "safe"} <= strategies, out.stdout
    assert {row.split()[0] for row in rows} == {"gsm8k_sample", "math500_sample", "all"}, out.stdout


def test_a_server_killed_mid_run_fails_that_run_and_a_local_run_goes_on(server, remote_gemma, smollm, monkeypatch):
    """Last in the module (pytest keeps file order): the server stays down."""
    monkeypatch.setenv("SAFE_OPENAI_RETRIES", "2")
    local_done = {}

    def local():
        local_done["ids"] = committed([smollm], config=replace(CONFIG, strategy="single", max_new_tokens=48))

    events = decode([remote_gemma, smollm], PROMPT, replace(CONFIG, max_new_tokens=64))
    next(events), next(events)  # started, first draft: the run is under way on the server
    thread = threading.Thread(target=local)
    thread.start()
    server.kill()
    began = time.monotonic()
    with pytest.raises(RemoteError, match="unreachable|dropped the connection"):
        for _ in events:
            pass
    assert time.monotonic() - began < 60
    thread.join(120)
    assert len(local_done["ids"]) == 48
