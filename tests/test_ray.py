"""Models on Ray actors and benchmark sweeps on Ray replicas, on one local Ray cluster for the module.

Same outputs as in-process, item for item; a killed actor or replica (by its pid); a killed driver; a
model that fails to load; a call past its time. Actors reserve no CPU where a test runs several at once.
"""

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from ci import IN_CI
from tiny_models import tiny_model_folder, unigram_tokenizer

from safe_engine import cli
from safe_engine.bench import Bench, load_task, strategy_labels
from safe_engine.bench.store import RESULTS, load_results, load_settings, result_key
from safe_engine.contract.errors import ModelLoadError
from safe_engine.contract.events import TextCommitted
from safe_engine.models.cache import evict
from safe_engine.models.loading import LoadOptions, load_model
from safe_engine.models.specs import DEFAULT_MODELS
from safe_engine.orchestration.comparison import summarize
from safe_engine.strategies.decoding import DecodeConfig, decode

try:
    import ray
except ImportError:
    if IN_CI:
        raise
    pytest.skip("Ray is not installed (pip install -r requirements-ray.txt)", allow_module_level=True)

from safe_engine.distributed.ray_bench import RayBench
from safe_engine.distributed.ray_cluster import ActorLost, RemoteTimeout
from safe_engine.distributed.ray_decode import DecodeReplica, decode_on_replicas
from safe_engine.distributed.ray_models import ActorSessions
from safe_engine.distributed.ray_pool import ReplicaPool
from safe_engine.distributed.ray_spec import RayPlacement

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parents[1]
PROMPT = "hello the cat"
CONFIG = DecodeConfig(max_new_tokens=24)
FREE = "ray:cpus=0:"  # an actor that reserves no CPU, so several fit the two-CPU cluster at once


@pytest.fixture(scope="module", autouse=True)
def cluster():
    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    tok = unigram_tokenizer(["hello", "world", " the", " cat", " capital", " of", " is"])
    return [str(tiny_model_folder(root / "a", tok, seed=1)), str(tiny_model_folder(root / "b", tok, "gemma3", seed=2))]


@pytest.fixture(scope="module")
def local_pair(folders):
    return [load_model(folder) for folder in folders]


@pytest.fixture(scope="module")
def remote_pair(folders):
    models = [load_model(FREE + folder) for folder in folders]
    yield models
    for lm in models:
        lm.sessions.close()


def committed(events) -> tuple[list[list[int]], dict]:
    events = list(events)
    ids = [t.ids for e in events if isinstance(e, TextCommitted) for t in e.tokens]
    return ids, summarize(events)


@pytest.mark.parametrize("strategy", ["single", "per-token", "safe"])
def test_models_on_actors_commit_the_tokens_of_local_models(strategy, local_pair, remote_pair):
    config = replace(CONFIG, strategy=strategy)  # the damage meter's KL opens a second drafter session too
    local_ids, local = committed(decode(local_pair, PROMPT, config))
    remote_ids, remote = committed(decode(remote_pair, PROMPT, config))
    assert remote_ids == local_ids and remote["text"] == local["text"] and local_ids
    passes = {name: stats["passes"] for name, stats in local["stats"]["forward"].items()}
    assert {name: stats["passes"] for name, stats in remote["stats"]["forward"].items()} == passes
    assert remote_pair[0].describe()["placement"] == "ray" and remote_pair[0].vocab.special_ids
    assert remote_pair[0].describe()["runtime"] == "kv-slots"  # the actor's path


def test_sessions_of_finished_runs_are_freed_in_their_actors(remote_pair):
    committed(decode(remote_pair, PROMPT, replace(CONFIG, strategy="safe")))
    gc.collect()
    deadline = time.monotonic() + 30
    while any(ray.get(lm.sessions.actor.open_sessions.remote(), timeout=30) for lm in remote_pair):
        assert time.monotonic() < deadline, "sessions left open in the actors"
        time.sleep(0.1)


def test_a_run_whose_actor_dies_fails_clearly_and_a_new_run_uses_the_restarted_actor(local_pair, remote_pair):
    drafter = remote_pair[0]
    events = decode(remote_pair, PROMPT, replace(CONFIG, strategy="safe"))
    next(events), next(events)  # started, and the first draft: the drafter's session is open in its actor
    killed = drafter.sessions.pid()
    os.kill(killed, signal.SIGKILL)
    with pytest.raises(ActorLost, match=f"Ray actor .*{drafter.name}"):
        list(events)
    assert committed(decode(remote_pair, PROMPT, CONFIG))[0] == committed(decode(local_pair, PROMPT, CONFIG))[0]
    assert drafter.sessions.pid() != killed


def test_a_call_past_its_timeout_fails_instead_of_waiting(remote_pair):
    impatient = [
        replace(lm, sessions=replace(lm.sessions, placement=RayPlacement(cpus=0, timeout_s=0.001)))
        for lm in remote_pair
    ]
    with pytest.raises(RemoteTimeout, match="no answer within 0.001 s"):
        list(decode(impatient, PROMPT * 40, CONFIG))


def test_a_model_that_cannot_load_in_its_actor_raises_its_own_load_error(tmp_path, folders):
    unigram_tokenizer(["hello"]).save_pretrained(tmp_path / "tokenizer-only")
    with pytest.raises(ModelLoadError, match="tokenizer only"):
        load_model(FREE + str(tmp_path / "tokenizer-only"))
    with pytest.raises(ModelLoadError, match="asks for 1 GPU, and the Ray cluster has 0"):
        load_model("ray:gpus=1:" + folders[0])


# ---------------------------------------------------------------- sweeps on replicas
EXAMPLES = load_task("facts", 3)
SWEEP = DecodeConfig(max_new_tokens=16)


def labels_of(folders) -> list[str]:
    return strategy_labels(["singles", "per-token", "safe"], [Path(f).name for f in folders], 0)


@pytest.fixture(scope="module")
def local_rows(tmp_path_factory, local_pair, folders):
    out = tmp_path_factory.mktemp("local-bench")
    list(Bench(local_pair, EXAMPLES, SWEEP, labels_of(folders), out).run())
    return {result_key(r): r["prediction"] for r in load_results(out)}


def rows_of(out: Path) -> dict:
    rows = load_results(out)
    keys = [result_key(r) for r in rows]
    assert len(keys) == len(set(keys)), "a row was written twice"
    return {result_key(r): r["prediction"] for r in rows}


def busy_replicas(kind: str = "BenchReplica") -> list[int]:
    """Pids of replica processes running a job now (Ray titles them by the method they run)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            title = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if entry.name.isdigit() and title.startswith(f"ray::{kind}.run".encode()):
            pids.append(int(entry.name))
    return pids


class ReplicaKiller(threading.Thread):
    """Kills (SIGKILL, by pid) a replica that is running a job once `out` holds `rows` rows."""

    def __init__(self, out: Path | None, rows: int = 0, kind: str = "BenchReplica"):
        super().__init__(daemon=True)
        self.out, self.rows, self.kind, self.killed = out, rows, kind, []

    def run(self):
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            pids = busy_replicas(self.kind) if not self.rows or len(load_results(self.out)) >= self.rows else []
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                self.killed.append(pids[0])
                return
            time.sleep(0.02)


def test_a_sweep_on_two_replicas_writes_each_local_row_once_though_a_replica_dies(tmp_path, folders, local_rows):
    bench = RayBench(folders, LoadOptions(), EXAMPLES, SWEEP, labels_of(folders), tmp_path, replicas=2, cpus=0.5)
    assert (bench.done, bench.total) == (0, len(local_rows))
    killer = ReplicaKiller(tmp_path, rows=2)
    killer.start()
    assert len(list(bench.run())) == len(local_rows)
    killer.join(timeout=10)
    assert killer.killed and bench.pool.lost_jobs == 1 and bench.done == bench.total
    assert rows_of(tmp_path) == local_rows


def test_a_replica_whose_model_cannot_load_ends_the_sweep_with_that_error(tmp_path, folders):
    unigram_tokenizer(["hello"]).save_pretrained(tmp_path / "tokenizer-only")
    specs = [folders[0], str(tmp_path / "tokenizer-only")]
    bench = RayBench(specs, LoadOptions(), EXAMPLES, SWEEP, ["safe"], tmp_path / "out", cpus=0.5, timeout_s=120)
    with pytest.raises(ModelLoadError, match="tokenizer only"):
        list(bench.run())
    assert load_results(tmp_path / "out") == []


def test_a_killed_driver_leaves_whole_rows_and_a_rerun_completes_them(tmp_path, folders, local_rows):
    out, log = tmp_path / "out", tmp_path / "driver.log"
    argv = ["bench", "--tasks", "facts", "--limit", "3", "--models", *folders, "--max-new-tokens", "16"]
    argv += ["--ray", "--replica-cpus", "0.5", "--out", str(out)]
    address = ["--ray-address", ray.get_runtime_context().gcs_address]
    with open(log, "wb") as stderr:
        driver = subprocess.Popen([sys.executable, "-m", "safe_engine", *argv, *address], cwd=ROOT, stderr=stderr)
        deadline = time.monotonic() + 240
        while len(load_results(out)) < 3:
            assert driver.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.05)
        driver.kill()
        driver.wait(timeout=30)
    written = len(load_results(out))
    assert written < len(local_rows)
    with open(out / RESULTS, "ab") as handle:
        handle.write(b'{"task": "facts", "id": "cut off mid-')  # what a kill during a write leaves
    assert cli.main(argv) == 0  # joins this process's cluster
    assert rows_of(out) == local_rows
    assert (out / RESULTS).read_bytes().endswith(b"}\n")  # the half line was cut off before appending


def test_a_grid_sweep_on_two_replicas_gives_the_table_of_a_local_one(tmp_path, folders):
    """One pool for the whole grid: each job carries its point's config; the table is the local sweep's (its
    wall-time figures aside), and a rerun on Ray adds nothing."""
    from safe_engine.bench.fronts import sweep_table

    argv = ["sweep", "--tasks", "facts", "--limit", "2", "--models", *folders, "--max-new-tokens", "8"]
    argv += ["--strategies", "single,safe", "--grid", "lookahead=2,4", "--batch-size", "1"]
    assert cli.main([*argv, "--out", str(tmp_path / "local")]) == 0
    on_ray = [*argv, "--ray", "--replicas", "2", "--replica-cpus", "0.5", "--out", str(tmp_path / "ray")]
    on_ray += ["--ray-address", ray.get_runtime_context().gcs_address]
    assert cli.main(on_ray) == 0
    lines = sorted(p.read_text() for p in (tmp_path / "ray").glob("runs/*/" + RESULTS))
    assert (
        cli.main(on_ray) == 0 and sorted(p.read_text() for p in (tmp_path / "ray").glob("runs/*/" + RESULTS)) == lines
    )
    times = ["s_per_token", "ratio_to_drafter", "pareto"]
    local, remote = (sweep_table(tmp_path / where).drop(columns=times) for where in ("local", "ray"))
    assert len(remote) == 4  # two singles, SAFE at two points
    assert remote.equals(local)


def test_prompts_decoded_on_replicas_come_back_in_order_as_local_runs(folders, local_pair):
    prompts, config = [PROMPT, "the capital of", PROMPT], replace(CONFIG, strategy="safe")
    remote = decode_on_replicas(folders, LoadOptions(), prompts, config, cpus=0.5)
    assert [r["text"] for r in remote] == [committed(decode(local_pair, p, config))[1]["text"] for p in prompts]


def test_a_pool_whose_only_replica_dies_for_good_fails_instead_of_waiting(folders):
    pool = ReplicaPool(DecodeReplica, (folders, LoadOptions()), cpus=0.5, max_restarts=0)
    killer = ReplicaKiller(None, kind="DecodeReplica")
    killer.start()
    with pytest.raises(ActorLost, match="every replica died for good"):
        list(pool.map([(i, PROMPT, CONFIG) for i in range(50)]))
    killer.join(timeout=10)
    assert killer.killed and pool.lost_jobs == 1


# ---------------------------------------------------------------- the embedded pair, through the CLI
@pytest.fixture
def release_ray_models():
    """The CLI keeps loaded models for the process; end the actors a test made that way."""
    yield
    for lm in evict(lambda lm: isinstance(lm.sessions, ActorSessions)):
        lm.sessions.close()


@pytest.mark.real_models
def test_generate_with_ray_models_commits_the_tokens_of_local_models(
    tmp_path, capsys, embedded_pair, release_ray_models
):
    argv = ["generate", "--prompt", "Name three colours.", "--max-new-tokens", "20", "--json"]
    runs = {}
    for name, specs in (("local", list(DEFAULT_MODELS)), ("ray", [f"ray:{spec}" for spec in DEFAULT_MODELS])):
        trace = tmp_path / f"{name}.jsonl"
        assert cli.main([*argv, "--models", *specs, "--trace", str(trace)]) == 0
        events = [json.loads(line) for line in trace.read_text(encoding="utf-8").splitlines()]
        ids = [t["ids"] for e in events if e["kind"] == "text_committed" for t in e["tokens"]]
        runs[name] = ids, json.loads(capsys.readouterr().out)["text"]
    assert runs["ray"] == runs["local"] and runs["local"][0]


@pytest.mark.real_models
def test_a_bench_on_two_replicas_matches_the_single_process_rows_survives_a_kill_and_resumes(tmp_path, embedded_pair):
    argv = ["bench", "--tasks", "facts", "--limit", "4", "--max-new-tokens", "6"]  # the check, smaller
    assert cli.main([*argv, "--out", str(tmp_path / "local")]) == 0
    local = rows_of(tmp_path / "local")

    out = tmp_path / "ray"
    killer = ReplicaKiller(out, rows=2)
    killer.start()
    ray_argv = [*argv, "--ray", "--out", str(out)]
    assert cli.main([*ray_argv, "--replicas", "2"]) == 0
    killer.join(timeout=10)
    assert killer.killed and rows_of(out) == local
    assert load_settings(out) == load_settings(tmp_path / "local")  # one folder resumes with or without --ray

    lines = (out / RESULTS).read_bytes().splitlines(keepends=True)
    (out / RESULTS).write_bytes(b"".join(lines[:-4]) + lines[-4][:20])  # a sweep killed mid-write
    assert cli.main([*ray_argv, "--replicas", "1"]) == 0  # the replicas are no setting of the folder
    assert rows_of(out) == local
