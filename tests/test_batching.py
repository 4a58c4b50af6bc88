"""Many runs sharing forward passes: every row keeps its own cache, output and failure."""

import random
import threading
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from passes import full_forward, start_together, together, wait_for
from scripted_models import ScriptedLM, scripted
from tiny_models import char_tokenizer, tiny_model, tiny_model_folder, unigram_tokenizer

from safe_engine import DecodeRequest, decode_ahead, decode_many
from safe_engine.contract.errors import ConfigError
from safe_engine.contract.events import RunFinished, TextCommitted
from safe_engine.models.loading import LoadOptions, load_model
from safe_engine.runtime.kv_slots import KVSlot, row_mask
from safe_engine.runtime.scheduler import ActiveRun, Executor, LockNotHeld, Request, Scheduler
from safe_engine.runtime.session import LocalSessions, runs_sharing
from safe_engine.strategies.decoding import DecodeConfig, decode


@pytest.fixture
def scheduler():
    """The test's own scheduler: its executors, slots and runs are no other test's (nor the process's)."""
    return Scheduler()


class Clock:
    """A scheduler's clock that moves only when the test says."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def tiny(request, tmp_path_factory):
    # Gemma 3 with a sliding window of 8: the runs below go far past it.
    return tiny_model(tmp_path_factory.mktemp(request.param), char_tokenizer(), arch=request.param, sliding_window=8)


def test_row_mask_matches_transformers_masks():
    from transformers.masking_utils import causal_mask_function, sdpa_mask, sliding_window_causal_mask_function

    for window in (None, 3, 8):
        function = causal_mask_function if window is None else sliding_window_causal_mask_function(window)
        for offset in range(0, 12):
            for count in (1, 2, 5, 9):
                reference = sdpa_mask(
                    1, count, offset + count, q_offset=offset, mask_function=function, allow_is_causal_skip=False
                )
                first, mask = row_mask(offset, count, window, is_causal_ok=False)
                assert not reference[..., :first].any()
                expected = reference[..., first:]
                assert expected.all() if mask is None else torch.equal(mask, expected), (window, offset, count)


def test_rows_with_random_edits_match_fresh_forwards(tiny, scheduler):
    """Four runs drafting, rewinding and re-tokenising on their own, every step one shared pass."""
    rng = random.Random(0)
    vocab = list(range(3, len(tiny.tokenizer)))
    sessions = [tiny.sessions.open(scheduler) for _ in range(4)]
    ids = [[rng.choice(vocab) for _ in range(rng.randint(2, 9))] for _ in sessions]
    for _ in range(25):
        for i in range(len(ids)):
            if rng.random() < 0.3:  # a rollback: a SAFE replacement, a dropped draft
                cut = max(1, len(ids[i]) - rng.randint(1, 6))
                ids[i] = ids[i][:cut] + [rng.choice(vocab) for _ in range(rng.randint(1, 5))]
            else:
                ids[i] = ids[i] + [rng.choice(vocab) for _ in range(rng.randint(1, 3))]
        starts = [sorted({rng.randint(1, len(x)), len(x)}) for x in ids]  # the last id is new: a pass each
        calls = [lambda s=s, x=list(x), t=t: s.next_token_logits(x, t) for s, x, t in zip(sessions, ids, starts)]
        results, errors = together(scheduler, tiny, calls)
        assert errors == [None] * len(calls)
        for got, x, t in zip(results, ids, starts):
            torch.testing.assert_close(got, full_forward(tiny, x, t), atol=1e-4, rtol=1e-4)
    assert min(len(x) for x in ids) > 20  # past Gemma's window of 8
    for session in sessions:
        assert session.stats.rows == 4 * session.stats.passes  # every pass was shared by the four
        session.close()


def test_eager_attention_rows_match_fresh_forwards(tmp_path, scheduler):
    """A model loaded with eager attention: float masks, the family's own eager function."""
    folder = tiny_model_folder(tmp_path, char_tokenizer(), arch="gemma3", sliding_window=4)
    lm = load_model(str(folder), LoadOptions(attn_implementation="eager"))
    sessions = [lm.sessions.open(scheduler) for _ in range(3)]
    assert lm.model.config._attn_implementation.startswith("safe-slots-eager")
    ids = [[3 + (i * 7 + j) % 25 for j in range(4 + 5 * i)] for i in range(3)]
    for step in range(6):
        ids = [x[:-2] + [3 + (step + i) % 25] * 3 if step % 2 else x + [3 + step] for i, x in enumerate(ids)]
        calls = [lambda s=s, x=list(x): s.next_token_logits(x, [len(x) - 1, len(x)]) for s, x in zip(sessions, ids)]
        results, errors = together(scheduler, lm, calls)
        assert errors == [None] * 3
        for got, x in zip(results, ids):
            torch.testing.assert_close(got, full_forward(lm, x, [len(x) - 1, len(x)]), atol=1e-4, rtol=1e-4)
    for session in sessions:
        session.close()


def test_a_row_gets_the_logits_it_gets_alone(tiny, scheduler):
    prompt = list(range(3, 20))
    with tiny.sessions.open(scheduler) as alone:
        expected = alone.next_token_logits(prompt, [len(prompt) - 2, len(prompt)])
    others = [tiny.sessions.open(scheduler) for _ in range(3)]
    me = tiny.sessions.open(scheduler)
    calls = [
        lambda s=s, n=n: s.next_token_logits([3 + i % 20 for i in range(n)], [n]) for s, n in zip(others, (5, 30, 11))
    ]
    calls.append(lambda: me.next_token_logits(prompt, [len(prompt) - 2, len(prompt)]))
    results, errors = together(scheduler, tiny, calls)
    assert errors == [None] * 4
    torch.testing.assert_close(results[-1], expected, atol=1e-5, rtol=1e-5)
    for session in [*others, me]:
        session.close()


def test_slots_are_reused_and_the_free_ones_bounded(tiny, scheduler):
    executor = tiny.sessions.executor(scheduler)
    with tiny.sessions.open(scheduler) as first:
        first.next_token_logits(list(range(3, 13)), [10])
        slot = first.slot
    with tiny.sessions.open(scheduler) as second:
        torch.testing.assert_close(
            second.next_token_logits([5, 6, 7], [3]), full_forward(tiny, [5, 6, 7], [3]), atol=1e-4, rtol=1e-4
        )
        assert second.slot is slot and slot.length == 3
    many = [tiny.sessions.open(scheduler) for _ in range(executor.keep_free + 3)]
    for session in many:
        session.next_token_logits([5], [1])  # a session takes its slot at its first feed
    for session in many:
        session.close()
    assert executor.free_slots() == executor.keep_free and not executor.open_slots()
    with pytest.raises(RuntimeError, match="closed"):
        many[0].next_token_logits([5], [1])


def test_the_fire_rule(tiny):
    """Due at once when no run holding the model computes (a run alone never waits); else after the
    wait (20 ms, or half the model's recent pass if shorter), counted from the end of the pass the request
    arrived behind."""
    clock = Clock()
    scheduler = Scheduler(clock=clock)
    executor = tiny.sessions.executor(scheduler)
    holder = ActiveRun(scheduler)
    with holder.opening():
        session = tiny.sessions.open()  # the run's, on the run's scheduler
    with scheduler.lock:
        assert not scheduler.is_due(executor)  # nothing waits
        executor.enqueue(Request(ActiveRun(scheduler), KVSlot(), 0, [3], [0], submitted=clock()))
    clock.now += 1.0
    with scheduler.device(executor.device_key):  # a pass on the device ends now, after the request arrived
        pass
    with scheduler.lock:
        assert scheduler.is_due(executor)  # the holder is not computing
        scheduler.set_busy(holder, True)
        assert not scheduler.is_due(executor)  # it is, and the pass this request waited behind just ended
        assert scheduler.seconds_until_due(executor) == pytest.approx(scheduler.max_wait_s)
        executor.recent_pass_s = 0.01  # a model whose passes take 10 ms waits half of one
        assert scheduler.seconds_until_due(executor) == pytest.approx(0.005)
        clock.now += 0.006
        assert scheduler.is_due(executor)  # it has waited long enough
        scheduler.set_busy(holder, False)
    session.close()
    with scheduler.lock:
        assert runs_sharing([tiny.sessions], scheduler) == 0 and executor.waiting() == 1


def test_the_device_goes_to_the_model_with_most_rows_waiting_unless_another_was_passed_over(pair):
    """Two models due on one device: the one with more rows waiting goes first, so runs waiting on the
    verifier gather while others still draft; one passed over `patience` times goes first; none while the
    device is held."""
    clock = Clock()
    scheduler = Scheduler(clock=clock)
    drafter, verifier = (lm.sessions.executor(scheduler) for lm in pair)
    assert drafter.device_key == verifier.device_key

    def enqueue(executor, count):
        for _ in range(count):
            executor.enqueue(Request(ActiveRun(scheduler), KVSlot(), 0, [3], [0], submitted=clock()))

    with scheduler.lock:
        enqueue(drafter, 1)  # older, but alone
        clock.now += 1.0
        enqueue(verifier, 3)
        assert scheduler.is_due(drafter) and scheduler.is_due(verifier)
        for passes in range(1, scheduler.patience + 1):
            assert scheduler.has_turn(verifier) and not scheduler.has_turn(drafter)
            scheduler.take_device(verifier)  # a verifier pass that left its rows waiting
            assert scheduler.passed_over(drafter) == passes and not scheduler.has_turn(drafter)  # the device is in use
            with pytest.raises(RuntimeError, match="held"):
                scheduler.take_device(drafter)
            scheduler.release_device(verifier.device_key)
        assert scheduler.has_turn(drafter) and not scheduler.has_turn(verifier)  # passed over `patience` times
        scheduler.take_device(drafter)
        assert drafter.take_batch(scheduler.max_rows, scheduler.max_tokens)
        assert scheduler.passed_over(drafter) == 0 and scheduler.passed_over(verifier) == 1
        scheduler.release_device(drafter.device_key)
        assert not scheduler.is_due(drafter) and scheduler.has_turn(verifier)  # no rival left
    with scheduler.device(verifier.device_key), scheduler.lock:
        assert scheduler.is_due(verifier) and not scheduler.has_turn(verifier)


def test_the_lock_is_held_where_the_scheduler_needs_it(tiny):
    """The queue, the fire rule and the device hand-over refuse a thread that does not hold the lock, and
    `answer` refuses one that does (it waits for a pass)."""
    scheduler = Scheduler()
    executor = tiny.sessions.executor(scheduler)
    run = ActiveRun(scheduler)
    request = Request(run, KVSlot(), 0, [3], [0])
    needs_lock = [
        lambda: executor.enqueue(request),
        lambda: executor.waiting(),
        lambda: executor.take_batch(1, 1),
        lambda: scheduler.is_due(executor),
        lambda: scheduler.has_turn(executor),
        lambda: scheduler.take_device(executor),
        lambda: run.holds(executor),
    ]
    for call in needs_lock:
        with pytest.raises(LockNotHeld):
            call()
    elsewhere = []
    with scheduler.lock:
        assert scheduler.lock.held() and not scheduler.is_due(executor)
        thread = threading.Thread(target=lambda: elsewhere.append(scheduler.lock.held()))
        thread.start()
        thread.join()
        with pytest.raises(RuntimeError, match="without the scheduler's lock"):
            scheduler.answer(executor, request)
        with scheduler.lock:  # reentrant; a wait gives every level up and takes them back
            assert not scheduler.lock.wait(0.001) and scheduler.lock.held()
        assert scheduler.lock.held()
    assert elsewhere == [False] and not scheduler.lock.held()  # held by this thread only


class Endpoint:
    """What an executor of another kind is registered under (a model behind a server, say)."""


class Echo(Executor):
    """An executor that is no KV-slot batch: it answers each request with its chunk, every waiting request
    in one pass; a chunk of [13] fails its pass."""

    def __init__(self, scheduler):
        super().__init__(scheduler, "echo", "echo:0")
        self.passes: list[int] = []

    def run_pass(self, batch):
        self.passes.append(len(batch))
        for request in batch:
            if request.chunk == [13]:
                raise ValueError("unlucky")
            request.logits, request.rows = torch.tensor([request.chunk], dtype=torch.float32), len(batch)


def test_the_scheduler_drives_any_executor():
    """The scheduler's rule over an executor of another kind: requests gathered while the device is held go
    as one pass; a pass that raises is run row by row, so only the failing request gets the error."""
    scheduler, server = Scheduler(), Endpoint()
    echo = scheduler.executor(server, lambda: Echo(scheduler))
    assert scheduler.executor(server, lambda: Echo(scheduler)) is echo
    chunks = [[3], [13], [5], [7]]
    answers: list = [None] * len(chunks)

    def ask(i):
        try:
            answers[i] = scheduler.answer(echo, Request(ActiveRun(scheduler), None, 0, chunks[i], [0])).logits
        except ValueError as exc:
            answers[i] = exc

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(chunks))]
    with scheduler.device(echo.device_key):
        for thread in threads:
            thread.start()

        def waiting():
            with scheduler.lock:
                return echo.waiting()

        wait_for(lambda: waiting() == len(chunks))
    for thread in threads:
        thread.join(30)
    assert echo.passes == [4, 1, 1, 1, 1]  # the shared pass, then each row alone
    assert [a.tolist() for i, a in enumerate(answers) if i != 1] == [[[3.0]], [[5.0]], [[7.0]]]
    assert isinstance(answers[1], ValueError)
    with scheduler.lock:
        assert not echo.waiting()


def test_a_run_adopts_the_prompt_prefix_a_finished_run_left(tiny, scheduler):
    """A finished run's slot keeps its tokens' keys and values; a run whose prompt starts the same way
    feeds only the rest and gets the logits of a fresh forward; one sharing too little feeds it all."""
    executor = tiny.sessions.executor(scheduler)
    prefix = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    with tiny.sessions.open(scheduler) as first:
        first.next_token_logits(prefix + [3, 4], [12])
    second = tiny.sessions.open(scheduler)
    ids = prefix + [9, 9, 8]
    got = second.next_token_logits(ids, [3, len(ids)])  # a start inside the prefix is recomputed
    assert second.stats.reused == len(prefix)
    torch.testing.assert_close(got, full_forward(tiny, ids, [3, len(ids)]), atol=1e-4, rtol=1e-4)
    again = tiny.sessions.open(scheduler)
    torch.testing.assert_close(again.next_token_logits(ids, [len(ids)]), got[1:], atol=1e-4, rtol=1e-4)
    assert again.stats.reused == 0  # the slot holding the prefix is the open second run's: never shared
    second.close()
    again.close()
    with tiny.sessions.open(scheduler) as same:  # the very same prompt: every position but the last comes from a slot
        same.next_token_logits(ids, [len(ids)])
        assert same.stats.reused == len(ids) - 1 and same.stats.positions == 1
    with tiny.sessions.open(scheduler) as other:
        other.next_token_logits(prefix[: executor.min_shared - 1] + [3, 3, 3], [10])
        assert other.stats.reused == 0


def test_a_bad_id_fails_its_own_request_only(tiny, scheduler):
    good, bad = tiny.sessions.open(scheduler), tiny.sessions.open(scheduler)
    with pytest.raises(ValueError, match="vocabulary"):
        bad.next_token_logits([3, 10_000], [2])
    torch.testing.assert_close(
        good.next_token_logits([3, 4], [2]), full_forward(tiny, [3, 4], [2]), atol=1e-4, rtol=1e-4
    )
    good.close()
    bad.close()


# ---------------------------------------------------------------- whole runs


PROMPTS = ["the cat sat on", "a dog", "on the mat the cat sat at the"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    words = [" the", " cat", " sat", " on", " mat", " dog", " at", "the", "cat", "sat", "on", "ma", "t"]
    return [
        tiny_model(tmp_path_factory.mktemp("a"), char_tokenizer(), seed=1, arch="gemma3", sliding_window=8),
        tiny_model(tmp_path_factory.mktemp("b"), unigram_tokenizer(words), seed=2),
    ]


def texts(events):
    finished = events[-1]
    assert isinstance(finished, RunFinished)
    return finished.text, [t.ids for e in events if isinstance(e, TextCommitted) for t in e.tokens]


def test_a_finished_decode_hands_its_slots_back_and_the_next_reuses_its_prompt(pair, scheduler):
    """The run's own objects go with its finished iterator; its slots must still reach the free list,
    with their tokens, so the next run with the same prompt start feeds only the rest."""
    config = DecodeConfig(strategy="safe", max_new_tokens=6)
    first = list(decode(pair, PROMPTS[2], config, scheduler=scheduler))
    assert all(lm.sessions.executor(scheduler).free_slots() for lm in pair)
    second = list(decode(pair, PROMPTS[2], config, scheduler=scheduler))
    assert texts(second) == texts(first)
    reused = {name: stats["reused"] for name, stats in second[-1].stats["forward"].items()}
    assert all(n >= pair[0].sessions.executor(scheduler).min_shared for n in reused.values()), reused


def test_batched_runs_give_the_tokens_of_runs_alone(pair, scheduler):
    requests = [
        DecodeRequest(prompt, DecodeConfig(strategy=strategy, max_new_tokens=20))
        for strategy in ("single", "per-token", "safe")
        for prompt in PROMPTS
    ]
    requests.append(DecodeRequest(PROMPTS[0], DecodeConfig(strategy="safe", max_new_tokens=20, force=((3, " dog"),))))
    alone = [texts(list(decode(pair, r.prompt, r.config, scheduler=scheduler))) for r in requests]
    handles = start_together(scheduler, pair, requests, max_parallel=len(requests))
    for handle, expected in zip(handles, alone):
        events = handle.result(120)
        assert texts(events) == expected, handle.request
        forward = events[-1].stats["forward"][pair[0].name]
        assert forward["rows"] > forward["passes"]  # it shared passes
    assert not any(lm.sessions.executor(scheduler).open_slots() for lm in pair)  # every slot handed back


def test_seeded_sampling_is_the_same_in_a_batch(pair, scheduler):
    config = DecodeConfig(strategy="safe", max_new_tokens=16, temperature=0.9, seed=11)
    alone = texts(list(decode(pair, PROMPTS[0], config, scheduler=scheduler)))
    others = [DecodeConfig(strategy="per-token", max_new_tokens=16, temperature=0.9, seed=s) for s in (1, 2)]
    requests = [
        DecodeRequest(PROMPTS[1], others[0]),
        DecodeRequest(PROMPTS[0], config),
        DecodeRequest(PROMPTS[2], others[1]),
    ]
    handles = start_together(scheduler, pair, requests)
    assert texts(handles[1].result(120)) == alone


def test_cancelling_one_run_leaves_the_others_alone(pair, scheduler):
    config = DecodeConfig(strategy="safe", max_new_tokens=24)
    alone = [texts(list(decode(pair, prompt, config, scheduler=scheduler))) for prompt in PROMPTS]
    handles = start_together(scheduler, pair, [DecodeRequest(prompt, config) for prompt in PROMPTS])
    for event in handles[1].events():
        if isinstance(event, TextCommitted):
            handles[1].cancel()
    stopped = handles[1].result(120)[-1]
    assert stopped.stop_reason == "stopped" and stopped.stats["tokens"] < 24
    assert [texts(handles[i].result(120)) for i in (0, 2)] == [alone[0], alone[2]]
    assert not pair[0].sessions.executor(scheduler).open_slots()


def test_a_run_joins_mid_way(pair, scheduler):
    config = DecodeConfig(strategy="per-token", max_new_tokens=20)
    alone = [texts(list(decode(pair, prompt, config, scheduler=scheduler))) for prompt in PROMPTS[:2]]
    first = decode(pair, PROMPTS[0], config, scheduler=scheduler)
    events, joined = [], []
    for event in first:
        events.append(event)
        if isinstance(event, TextCommitted) and not joined:  # the second run starts while the first is going
            joined = decode_many(pair, [DecodeRequest(PROMPTS[1], config)], scheduler=scheduler)
    assert texts(events) == alone[0] and texts(joined[0].result(120)) == alone[1]


def test_a_failing_run_fails_alone(pair, scheduler):
    requests = [
        DecodeRequest(PROMPTS[0], DecodeConfig(strategy="single", max_new_tokens=12)),
        DecodeRequest("   ", DecodeConfig(strategy="single")),  # rejected before it starts
        DecodeRequest(PROMPTS[1], DecodeConfig(strategy="single", max_new_tokens=12)),
    ]
    handles = decode_many(pair, requests, scheduler=scheduler)
    with pytest.raises(ConfigError, match="empty"):
        handles[1].result(60)
    assert isinstance(handles[1].error, ConfigError)
    alone = texts(list(decode(pair, PROMPTS[0], requests[0].config, scheduler=scheduler)))
    assert texts(handles[0].result(60)) == alone
    assert handles[2].error is None and handles[2].result(60)[-1].text


def test_a_run_decoded_ahead_goes_on_while_its_consumer_holds_an_event(pair, scheduler):
    """The app's pages render between events: the run must not wait for them (its slots come back, the
    run over, before the consumer asks for a second event)."""
    config = DecodeConfig(strategy="safe", max_new_tokens=12)
    alone = texts(list(decode(pair, PROMPTS[0], config, scheduler=scheduler)))
    flag = threading.Event()
    events = decode_ahead(pair, PROMPTS[0], config, flag, scheduler)
    first = next(events)
    wait_for(lambda: not any(lm.sessions.executor(scheduler).open_slots() for lm in pair))
    assert texts([first, *events]) == alone
    assert not flag.is_set()  # a run that ran to its end was not cancelled


def test_decode_ahead_checks_input_at_once_and_closing_it_cancels_the_run(pair, scheduler):
    with pytest.raises(ConfigError, match="empty"):
        decode_ahead(pair, "   ", DecodeConfig(strategy="single"), scheduler=scheduler)
    flag = threading.Event()
    events = decode_ahead(pair, PROMPTS[1], DecodeConfig(strategy="safe", max_new_tokens=400), flag, scheduler)
    next(events)
    events.close()
    assert flag.is_set()
    executor = pair[0].sessions.executor(scheduler)
    wait_for(lambda: not executor.open_slots())  # it ended at its next step, its slots handed back


def test_a_model_error_in_a_shared_pass_fails_only_its_row(scheduler):
    """The scripted model raises for a prompt it was not written for, inside a pass it shares."""
    lm = scripted("s", ["Yes", "No"], {"": {"Yes": 1.0}, "Yes": {"No": 1.0}}, prompt="Q?")
    good, bad = lm.sessions.open(scheduler), lm.sessions.open(scheduler)
    ok_ids, wrong_ids = lm.tokenizer("Q?")["input_ids"], lm.tokenizer("Z!")["input_ids"]
    results, errors = together(
        scheduler,
        lm,
        [lambda: good.next_token_logits(ok_ids, [len(ok_ids)]), lambda: bad.next_token_logits(wrong_ids, [1])],
    )
    assert isinstance(errors[1], AssertionError) and "its own prompt" in str(errors[1])
    assert errors[0] is None and int(results[0][0].argmax()) == lm.model.token_id("Yes")
    assert good.stats.passes == 1 and bad.stats.passes == 0 and bad.slot.length == 0  # nothing was written
    good.close()
    bad.close()


class _Bypass(ScriptedLM):
    """A model whose attention does not go through the slots (transformers' interface bypassed)."""

    def forward(self, input_ids, slot_batch, logits_to_keep, **_):
        return SimpleNamespace(logits=torch.zeros(1, len(logits_to_keep), len(self.vocab)))


def test_a_model_that_bypasses_the_slots_is_refused(scheduler):
    lm = scripted("bypass", ["Yes"], {"": {"Yes": 1.0}}, prompt="Q?")
    lm.sessions = LocalSessions(replace(lm.sessions.weights, module=_Bypass(lm.tokenizer, "Q?", {})))
    with lm.sessions.open(scheduler) as session, pytest.raises(RuntimeError, match="attention interface"):
        session.next_token_logits(lm.tokenizer("Q?")["input_ids"], [1])


# ---------------------------------------------------------------- the embedded pair


@pytest.mark.real_models
def test_real_gemma_rows_past_its_sliding_window(fp32_pair, scheduler):
    """Two long rows (past Gemma's 512-token window) and a short one in shared passes, with a rollback."""
    gemma = fp32_pair[0]
    long_a = gemma.encode_prompt("Count slowly: " + " ".join(str(i) for i in range(170)))
    long_b = gemma.encode_prompt("Count quickly: " + " ".join(str(i) for i in range(160, 0, -1)))
    short = gemma.encode_prompt("The capital of Madagascar is")
    assert 520 < min(len(long_a), len(long_b)) and len(long_a) + len(long_b) + len(short) <= scheduler.max_tokens
    sessions = [gemma.sessions.open(scheduler) for _ in range(3)]
    rows = [long_a, long_b, short]
    for step in range(2):
        if step:  # drop the last 7 ids and re-feed 3 of them, in every row
            rows = [ids[:-7] + ids[-3:] for ids in rows]
        calls = [lambda s=s, x=x: s.next_token_logits(x, [len(x) - 1, len(x)]) for s, x in zip(sessions, rows)]
        results, errors = together(scheduler, gemma, calls)
        assert errors == [None] * 3
        for got, ids in zip(results, rows):
            torch.testing.assert_close(got, full_forward(gemma, ids, [len(ids) - 1, len(ids)]), atol=2e-3, rtol=1e-3)
    for session in sessions:
        assert session.stats.rows == 3 * session.stats.passes
        session.close()


@pytest.mark.real_models
def test_real_pair_batched_safe_runs_match_runs_alone(embedded_pair, scheduler):
    prompts = ["The capital of Madagascar is", "Tom has 3 apples and buys 5 more. Now he has", "Copy: Ouagadougou"]
    config = DecodeConfig(strategy="safe", max_new_tokens=12)
    alone = [texts(list(decode(embedded_pair, prompt, config, scheduler=scheduler))) for prompt in prompts]
    handles = start_together(scheduler, embedded_pair, [DecodeRequest(prompt, config) for prompt in prompts])
    assert [texts(handle.result(600)) for handle in handles] == alone


def test_runs_sharing_counts_each_run_on_the_models_once(pair, scheduler):
    """Counted on the runs' own scheduler; the process's sees none of them."""
    assert runs_sharing([lm.sessions for lm in pair], scheduler) == 0
    config = DecodeConfig(strategy="safe", max_new_tokens=24)
    runs = [decode(pair, prompt, config, scheduler=scheduler) for prompt in PROMPTS[:2]]
    for run in runs:
        next(run)  # RunStarted: the run's sessions are open
    alone = decode([pair[1]], PROMPTS[2], DecodeConfig(strategy="single", max_new_tokens=4), scheduler=scheduler)
    next(alone)
    shared = [runs_sharing([lm.sessions for lm in models], scheduler) for models in (pair, pair[:1], pair[1:])]
    assert shared == [3, 2, 3] and runs_sharing([lm.sessions for lm in pair]) == 0
    for run in [*runs, alone]:
        run.close()
    assert runs_sharing([lm.sessions for lm in pair], scheduler) == 0
