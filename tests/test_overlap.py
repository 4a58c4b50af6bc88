"""SAFE with overlap (`overlap.py`) decodes exactly what the sequential loop decodes.

Forced on here, on the CPU: the verifiers' passes run in threads and the drafter drafts ahead in another
(passes on one device still take turns). Every test compares overlap on against off, event for event.
"""

import threading
from types import SimpleNamespace

import pytest
from tiny_models import tiny_model, unigram_tokenizer
from tiny_pair import tiny_pair_folders

from safe_engine.contract.config import DecodeConfig
from safe_engine.contract.errors import ConfigError
from safe_engine.contract.events import EnsemblePoint, PositionVerified, RunFinished, TextCommitted
from safe_engine.models.loading import load_model
from safe_engine.run.participant import Participant
from safe_engine.runtime.scheduler import ActiveRun, Scheduler
from safe_engine.runtime.session import ModelSession
from safe_engine.strategies import overlap
from safe_engine.strategies.decoding import decode

PROMPT = "Q: the answer is"
MODES = [dict(safe_mode=m, **s) for m in ("exact", "fast") for s in (dict(), dict(temperature=1.5, seed=3))]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A drafter and two verifiers with three different tokenizers (so a round has two verifier passes)."""
    pair = [load_model(spec) for spec in tiny_pair_folders(tmp_path_factory.mktemp("pair"))]
    third = unigram_tokenizer(["th", "e ", " an", "swer", " i", "s ", "12", "Q"])
    return pair + [tiny_model(tmp_path_factory.mktemp("third"), third, seed=5, layers=1)]


def trace(models, prompt=PROMPT, cancel=None, **config) -> list:
    """What a run decided, event by event (no timings)."""
    out = []
    for event in decode(models, prompt, DecodeConfig(**{"max_new_tokens": 40} | config), cancel):
        if isinstance(event, PositionVerified):
            out.append(("check", event.position, event.token, event.decision, event.reason_code, event.accept_p))
        elif isinstance(event, EnsemblePoint):
            out.append(("ensemble", event.position, event.chosen, event.changed))
        elif isinstance(event, TextCommitted):
            out.append(("commit", [(t.ids, t.decision) for t in event.tokens]))
            if cancel is not None:
                cancel.set()
        elif isinstance(event, RunFinished):
            stats = {k: event.stats[k] for k in ("tokens", "rounds", "ensembled", "replaced", "accepted_drafts")}
            out.append(("finished", event.text, event.stop_reason, stats))
    return out


@pytest.fixture
def spied(monkeypatch):
    """Which threads scored for the verifiers and how often the drafter drafted ahead."""
    seen = SimpleNamespace(verify_threads=set(), ahead=0)
    real_logits, real_draft_after = Participant.logits, overlap.draft_after

    def logits(self, response_ids, starts):
        if threading.current_thread().name.startswith("safe-verify"):
            seen.verify_threads.add(threading.current_thread().name)
        return real_logits(self, response_ids, starts)

    def draft_after(*args):
        seen.ahead += 1
        return real_draft_after(*args)

    monkeypatch.setattr(Participant, "logits", logits)
    monkeypatch.setattr(overlap, "draft_after", draft_after)
    return seen


@pytest.mark.parametrize("mode", MODES, ids=["exact-greedy", "exact-sampled", "fast-greedy", "fast-sampled"])
def test_overlap_decodes_what_the_sequential_loop_decodes(models, spied, mode):
    sequential = trace(models, overlap=False, **mode)
    assert spied.ahead == 0 and not spied.verify_threads
    overlapped = trace(models, overlap=True, **mode)
    assert overlapped == sequential
    assert spied.ahead > 0 and len(spied.verify_threads) == 2  # both overlaps ran
    stats = sequential[-1][3]
    assert stats["replaced"] > 0 and stats["accepted_drafts"] > 0  # drafts ahead were both discarded and used


def test_the_next_round_reads_the_draft_ahead_from_the_drafters_memo(models, monkeypatch):
    drafter_passes = []
    real = ModelSession._forward

    def forward(self, ids, feed_from, wanted):
        if self.executor is models[0].sessions.executor(self.scheduler):
            drafter_passes.append(threading.current_thread().name)
        return real(self, ids, feed_from, wanted)

    monkeypatch.setattr(ModelSession, "_forward", forward)
    config = dict(max_new_tokens=40, damage_kl_steps=0)
    list(decode(models, PROMPT, DecodeConfig(overlap=False, **config)))
    off = len(drafter_passes)
    drafter_passes.clear()
    list(decode(models, PROMPT, DecodeConfig(overlap=True, **config)))
    ahead = drafter_passes.count("safe-draft-ahead")
    assert ahead > 0 and len(drafter_passes) - ahead < off  # the run's own draft skipped what was drafted ahead


@pytest.mark.parametrize("sampled", [False, True])
def test_stop_sequences_and_cancellation_end_the_same_way(models, sampled):
    mode = dict(temperature=1.5, seed=11) if sampled else {}
    for stop in [("is",), ("answer", " 1")]:
        assert trace(models, overlap=True, stop=stop, **mode) == trace(models, overlap=False, stop=stop, **mode)
    cancelled = trace(models, overlap=True, cancel=threading.Event(), **mode)
    assert cancelled == trace(models, overlap=False, cancel=threading.Event(), **mode)
    assert cancelled[-1][2] == "stopped"


def test_closing_a_run_mid_round_leaves_no_thread_behind(models):
    events = decode(models, PROMPT, DecodeConfig(max_new_tokens=40, overlap=True))
    for event in events:
        if isinstance(event, PositionVerified):
            break
    events.close()
    assert not [t for t in threading.enumerate() if t.name.startswith(("safe-draft-ahead", "safe-verify"))]


def _run(devices, overlap_setting=None):
    parts = [SimpleNamespace(lm=SimpleNamespace(device=d)) for d in devices]
    return SimpleNamespace(config=DecodeConfig(overlap=overlap_setting), parts=parts)


def test_auto_overlaps_only_with_every_model_on_its_own_non_cpu_device():
    assert overlap.wanted(_run(["cuda:0", "cuda:1"]))
    assert overlap.wanted(_run(["cuda:1", "cuda:0", "cuda:2"]))
    assert not overlap.wanted(_run(["cuda:0", "cuda:0"]))
    assert not overlap.wanted(_run(["cpu", "cuda:0"]))
    assert not overlap.wanted(_run(["cpu", "cpu"]))
    assert overlap.wanted(_run(["cpu", "cpu"], True)) and not overlap.wanted(_run(["cuda:0", "cuda:1"], False))


def test_overlap_must_be_a_boolean_or_unset():
    with pytest.raises(ConfigError, match="overlap"):
        DecodeConfig(overlap="yes").validate(2)


def test_a_run_is_busy_while_any_of_its_threads_computes():
    scheduler = Scheduler()
    run = ActiveRun(scheduler)
    scheduler.set_busy(run, True)  # its driver computes
    with run.waiting():  # the driver waits on its helpers
        assert not scheduler.is_busy(run)
        with run.helper():
            assert scheduler.is_busy(run)
        assert not scheduler.is_busy(run)
    assert scheduler.is_busy(run) and run.threads_computing == 1


@pytest.mark.real_models
@pytest.mark.parametrize("mode", [dict(safe_mode="exact"), dict(safe_mode="fast", temperature=0.8, seed=5)])
def test_the_embedded_pair_decodes_the_same_with_overlap(embedded_pair, mode):
    config = dict(max_new_tokens=24, damage_kl_steps=0, **mode)
    prompt = "Name three colours of the rainbow."
    assert trace(embedded_pair, prompt, overlap=True, **config) == trace(embedded_pair, prompt, overlap=False, **config)
