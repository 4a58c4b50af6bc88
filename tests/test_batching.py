"""Many runs sharing forward passes: every row keeps its own cache, output and failure."""

import random
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from scripted_models import ScriptedLM, scripted
from tiny_models import char_tokenizer, tiny_model, tiny_model_folder, unigram_tokenizer

from safe_engine import DecodeRequest, decode_ahead, decode_many
from safe_engine.contract.errors import ConfigError
from safe_engine.contract.events import RunFinished, TextCommitted
from safe_engine.models.loading import LoadOptions, load_model
from safe_engine.runtime.batching import ActiveRun, Request
from safe_engine.runtime.kv_slots import KVSlot, row_mask
from safe_engine.runtime.session import SCHEDULER, ModelSession
from safe_engine.strategies.decoding import DecodeConfig, decode


def full_forward(lm, ids, starts):
    with torch.inference_mode():
        logits = lm.model(torch.tensor([ids])).logits[0].float()
    return torch.stack([logits[t - 1] for t in starts])


def queued(lm) -> int:
    with SCHEDULER.changed:
        return len(SCHEDULER.executor(lm).queue)


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def together(lm, calls):
    """Run the calls in threads while the device is held, so all their requests share one pass."""
    results, errors = [None] * len(calls), [None] * len(calls)

    def work(i):
        try:
            results[i] = calls[i]()
        except Exception as exc:
            errors[i] = exc

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(calls))]
    with SCHEDULER.device(lm.device):
        for thread in threads:
            thread.start()
        wait_for(lambda: queued(lm) + sum(not t.is_alive() for t in threads) == len(calls))
    for thread in threads:
        thread.join(60)
    return results, errors


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


def test_rows_with_random_edits_match_fresh_forwards(tiny):
    """Four runs drafting, rewinding and re-tokenising on their own, every step one shared pass."""
    rng = random.Random(0)
    vocab = list(range(3, len(tiny.tokenizer)))
    sessions = [ModelSession(tiny) for _ in range(4)]
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
        results, errors = together(tiny, calls)
        assert errors == [None] * len(calls)
        for got, x, t in zip(results, ids, starts):
            torch.testing.assert_close(got, full_forward(tiny, x, t), atol=1e-4, rtol=1e-4)
    assert min(len(x) for x in ids) > 20  # past Gemma's window of 8
    for session in sessions:
        assert session.stats.rows == 4 * session.stats.passes  # every pass was shared by the four
        session.close()


def test_eager_attention_rows_match_fresh_forwards(tmp_path):
    """A model loaded with eager attention: float masks, the family's own eager function."""
    folder = tiny_model_folder(tmp_path, char_tokenizer(), arch="gemma3", sliding_window=4)
    lm = load_model(str(folder), LoadOptions(attn_implementation="eager"))
    sessions = [ModelSession(lm) for _ in range(3)]
    assert lm.model.config._attn_implementation.startswith("safe-slots-eager")
    ids = [[3 + (i * 7 + j) % 25 for j in range(4 + 5 * i)] for i in range(3)]
    for step in range(6):
        ids = [x[:-2] + [3 + (step + i) % 25] * 3 if step % 2 else x + [3 + step] for i, x in enumerate(ids)]
        calls = [lambda s=s, x=list(x): s.next_token_logits(x, [len(x) - 1, len(x)]) for s, x in zip(sessions, ids)]
        results, errors = together(lm, calls)
        assert errors == [None] * 3
        for got, x in zip(results, ids):
            torch.testing.assert_close(got, full_forward(lm, x, [len(x) - 1, len(x)]), atol=1e-4, rtol=1e-4)
    for session in sessions:
        session.close()


def test_a_row_gets_the_logits_it_gets_alone(tiny):
    prompt = list(range(3, 20))
    with ModelSession(tiny) as alone:
        expected = alone.next_token_logits(prompt, [len(prompt) - 2, len(prompt)])
    others = [ModelSession(tiny) for _ in range(3)]
    me = ModelSession(tiny)
    calls = [
        lambda s=s, n=n: s.next_token_logits([3 + i % 20 for i in range(n)], [n]) for s, n in zip(others, (5, 30, 11))
    ]
    results, errors = together(tiny, [*calls, lambda: me.next_token_logits(prompt, [len(prompt) - 2, len(prompt)])])
    assert errors == [None] * 4
    torch.testing.assert_close(results[-1], expected, atol=1e-5, rtol=1e-5)
    for session in [*others, me]:
        session.close()


def test_slots_are_reused_and_the_free_ones_bounded(tiny):
    executor = SCHEDULER.executor(tiny)
    with ModelSession(tiny) as first:
        first.next_token_logits(list(range(3, 13)), [10])
        slot = first._slot
    with ModelSession(tiny) as second:
        torch.testing.assert_close(
            second.next_token_logits([5, 6, 7], [3]), full_forward(tiny, [5, 6, 7], [3]), atol=1e-4, rtol=1e-4
        )
        assert second._slot is slot and slot.length == 3
    many = [ModelSession(tiny) for _ in range(SCHEDULER.keep_free + 3)]
    for session in many:
        session.next_token_logits([5], [1])  # a session takes its slot at its first feed
    for session in many:
        session.close()
    assert len(executor.free) == SCHEDULER.keep_free and not executor.live
    with pytest.raises(RuntimeError, match="closed"):
        many[0].next_token_logits([5], [1])


def test_the_fire_rule(tiny):
    """Due at once when no run holding the model computes (a run alone never waits); else after the
    wait, counted from the end of the pass the request arrived behind."""
    executor, device = SCHEDULER.executor(tiny), str(tiny.device)
    holder = ActiveRun(SCHEDULER)
    with holder.opening():
        session = ModelSession(tiny)
    now = time.perf_counter()
    request = Request(ActiveRun(SCHEDULER), KVSlot(), 0, [3], [0], submitted=now - 1.0)
    with SCHEDULER.changed:
        executor.queue.append(request)
        try:
            SCHEDULER.freed[device] = now
            assert executor._due()  # the holder is not computing
            SCHEDULER.set_busy(holder, True)
            assert not executor._due()  # it is, and the pass this request waited behind just ended
            SCHEDULER.freed[device] = now - 1.0
            assert executor._due()  # it has waited long enough
        finally:
            SCHEDULER.set_busy(holder, False)
            executor.queue.clear()
    session.close()


def test_the_device_goes_to_the_model_with_most_rows_waiting_unless_another_was_passed_over(pair):
    """Two models due on one device: the one with more rows waiting goes first, so runs waiting on the
    verifier gather while others still draft; one passed over `patience` times goes first; none while the
    device is held."""
    drafter, verifier = (SCHEDULER.executor(lm) for lm in pair)
    now = time.perf_counter()

    def requests(count, age):
        return [Request(ActiveRun(SCHEDULER), KVSlot(), 0, [3], [0], submitted=now - age) for _ in range(count)]

    with SCHEDULER.changed:
        drafter.queue += requests(1, age=2.0)  # older, but alone
        verifier.queue += requests(3, age=1.0)
        try:
            assert drafter._due() and verifier._due()
            assert SCHEDULER._turn(verifier) and not SCHEDULER._turn(drafter)
            SCHEDULER._take_device(verifier)
            assert drafter.passed_over == 1 and not SCHEDULER._turn(drafter)  # the device is in use
            SCHEDULER._release(str(verifier.device))
            drafter.passed_over = SCHEDULER.patience
            assert SCHEDULER._turn(drafter) and not SCHEDULER._turn(verifier)
            drafter.queue.clear()
            assert SCHEDULER._turn(verifier)  # no rival left
        finally:
            drafter.queue.clear()
            verifier.queue.clear()
            drafter.passed_over = verifier.passed_over = 0
    with SCHEDULER.device(drafter.device), SCHEDULER.changed:
        verifier.queue += requests(1, age=1.0)
        try:
            assert verifier._due() and not SCHEDULER._turn(verifier)
        finally:
            verifier.queue.clear()


def test_a_run_adopts_the_prompt_prefix_a_finished_run_left(tiny):
    """A finished run's slot keeps its tokens' keys and values; a run whose prompt starts the same way
    feeds only the rest and gets the logits of a fresh forward; one sharing too little feeds it all."""
    executor = SCHEDULER.executor(tiny)
    executor.free.clear()
    prefix = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    with ModelSession(tiny) as first:
        first.next_token_logits(prefix + [3, 4], [12])
    second = ModelSession(tiny)
    ids = prefix + [9, 9, 8]
    got = second.next_token_logits(ids, [3, len(ids)])  # a start inside the prefix is recomputed
    assert second.stats.reused == len(prefix)
    torch.testing.assert_close(got, full_forward(tiny, ids, [3, len(ids)]), atol=1e-4, rtol=1e-4)
    again = ModelSession(tiny)
    torch.testing.assert_close(again.next_token_logits(ids, [len(ids)]), got[1:], atol=1e-4, rtol=1e-4)
    assert again.stats.reused == 0  # the slot holding the prefix is the open second run's: never shared
    second.close()
    again.close()
    with ModelSession(tiny) as same:  # the very same prompt: every position but the last comes from a slot
        same.next_token_logits(ids, [len(ids)])
        assert same.stats.reused == len(ids) - 1 and same.stats.positions == 1
    with ModelSession(tiny) as other:
        other.next_token_logits(prefix[: SCHEDULER.min_shared - 1] + [3, 3, 3], [10])
        assert other.stats.reused == 0


def test_a_bad_id_fails_its_own_request_only(tiny):
    good, bad = ModelSession(tiny), ModelSession(tiny)
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


def start_together(pair, requests, **kwargs):
    """decode_many with the first passes of every run gathered into one."""
    with SCHEDULER.device(pair[0].device):
        handles = decode_many(pair, requests, **kwargs)
        wait_for(lambda: queued(pair[0]) == min(len(requests), kwargs.get("max_parallel", 8)))
    return handles


def test_a_finished_decode_hands_its_slots_back_and_the_next_reuses_its_prompt(pair):
    """The run's own objects go with its finished iterator; its slots must still reach the free list,
    with their tokens, so the next run with the same prompt start feeds only the rest."""
    config = DecodeConfig(strategy="safe", max_new_tokens=6)
    for lm in pair:
        SCHEDULER.executor(lm).free.clear()
    first = list(decode(pair, PROMPTS[2], config))
    assert all(SCHEDULER.executor(lm).free for lm in pair)
    second = list(decode(pair, PROMPTS[2], config))
    assert texts(second) == texts(first)
    reused = {name: stats["reused"] for name, stats in second[-1].stats["forward"].items()}
    assert all(n >= SCHEDULER.min_shared for n in reused.values()), reused


def test_batched_runs_give_the_tokens_of_runs_alone(pair):
    requests = [
        DecodeRequest(prompt, DecodeConfig(strategy=strategy, max_new_tokens=20))
        for strategy in ("single", "per-token", "safe")
        for prompt in PROMPTS
    ]
    requests.append(DecodeRequest(PROMPTS[0], DecodeConfig(strategy="safe", max_new_tokens=20, force=((3, " dog"),))))
    alone = [texts(list(decode(pair, r.prompt, r.config))) for r in requests]
    handles = start_together(pair, requests, max_parallel=len(requests))
    for handle, expected in zip(handles, alone):
        events = handle.result(120)
        assert texts(events) == expected, handle.request
        forward = events[-1].stats["forward"][pair[0].name]
        assert forward["rows"] > forward["passes"]  # it shared passes
    assert not SCHEDULER.executor(pair[0]).live and not SCHEDULER.executor(pair[1]).live  # every slot handed back


def test_seeded_sampling_is_the_same_in_a_batch(pair):
    config = DecodeConfig(strategy="safe", max_new_tokens=16, temperature=0.9, seed=11)
    alone = texts(list(decode(pair, PROMPTS[0], config)))
    others = [DecodeConfig(strategy="per-token", max_new_tokens=16, temperature=0.9, seed=s) for s in (1, 2)]
    requests = [
        DecodeRequest(PROMPTS[1], others[0]),
        DecodeRequest(PROMPTS[0], config),
        DecodeRequest(PROMPTS[2], others[1]),
    ]
    handles = start_together(pair, requests)
    assert texts(handles[1].result(120)) == alone


def test_cancelling_one_run_leaves_the_others_alone(pair):
    config = DecodeConfig(strategy="safe", max_new_tokens=24)
    alone = [texts(list(decode(pair, prompt, config))) for prompt in PROMPTS]
    handles = start_together(pair, [DecodeRequest(prompt, config) for prompt in PROMPTS])
    for event in handles[1].events():
        if isinstance(event, TextCommitted):
            handles[1].cancel()
    stopped = handles[1].result(120)[-1]
    assert stopped.stop_reason == "stopped" and stopped.stats["tokens"] < 24
    assert [texts(handles[i].result(120)) for i in (0, 2)] == [alone[0], alone[2]]
    assert not SCHEDULER.executor(pair[0]).live


def test_a_run_joins_mid_way(pair):
    config = DecodeConfig(strategy="per-token", max_new_tokens=20)
    alone = [texts(list(decode(pair, prompt, config))) for prompt in PROMPTS[:2]]
    first = decode(pair, PROMPTS[0], config)
    events, joined = [], []
    for event in first:
        events.append(event)
        if isinstance(event, TextCommitted) and not joined:  # the second run starts while the first is going
            joined = decode_many(pair, [DecodeRequest(PROMPTS[1], config)])
    assert texts(events) == alone[0] and texts(joined[0].result(120)) == alone[1]


def test_a_failing_run_fails_alone(pair):
    requests = [
        DecodeRequest(PROMPTS[0], DecodeConfig(strategy="single", max_new_tokens=12)),
        DecodeRequest("   ", DecodeConfig(strategy="single")),  # rejected before it starts
        DecodeRequest(PROMPTS[1], DecodeConfig(strategy="single", max_new_tokens=12)),
    ]
    handles = decode_many(pair, requests)
    with pytest.raises(ConfigError, match="empty"):
        handles[1].result(60)
    assert isinstance(handles[1].error, ConfigError)
    assert texts(handles[0].result(60)) == texts(list(decode(pair, PROMPTS[0], requests[0].config)))
    assert handles[2].error is None and handles[2].result(60)[-1].text


def test_a_run_decoded_ahead_goes_on_while_its_consumer_holds_an_event(pair):
    """The app's pages render between events: the run must not wait for them (its slots come back, the
    run over, before the consumer asks for a second event)."""
    config = DecodeConfig(strategy="safe", max_new_tokens=12)
    alone = texts(list(decode(pair, PROMPTS[0], config)))
    flag = threading.Event()
    events = decode_ahead(pair, PROMPTS[0], config, flag)
    first = next(events)
    wait_for(lambda: not SCHEDULER.executor(pair[0]).live and not SCHEDULER.executor(pair[1]).live)
    assert texts([first, *events]) == alone
    assert not flag.is_set()  # a run that ran to its end was not cancelled


def test_decode_ahead_checks_input_at_once_and_closing_it_cancels_the_run(pair):
    with pytest.raises(ConfigError, match="empty"):
        decode_ahead(pair, "   ", DecodeConfig(strategy="single"))
    flag = threading.Event()
    events = decode_ahead(pair, PROMPTS[1], DecodeConfig(strategy="safe", max_new_tokens=400), flag)
    next(events)
    events.close()
    assert flag.is_set()
    wait_for(lambda: not SCHEDULER.executor(pair[0]).live)  # it ended at its next step, its slots handed back


def test_a_model_error_in_a_shared_pass_fails_only_its_row():
    """The scripted model raises for a prompt it was not written for, inside a pass it shares."""
    lm = scripted("s", ["Yes", "No"], {"": {"Yes": 1.0}, "Yes": {"No": 1.0}}, prompt="Q?")
    good, bad = ModelSession(lm), ModelSession(lm)
    ok_ids, wrong_ids = lm.tokenizer("Q?")["input_ids"], lm.tokenizer("Z!")["input_ids"]
    results, errors = together(
        lm, [lambda: good.next_token_logits(ok_ids, [len(ok_ids)]), lambda: bad.next_token_logits(wrong_ids, [1])]
    )
    assert isinstance(errors[1], AssertionError) and "its own prompt" in str(errors[1])
    assert errors[0] is None and int(results[0][0].argmax()) == lm.model.token_id("Yes")
    assert good.stats.passes == 1 and bad.stats.passes == 0 and bad._slot.length == 0  # nothing was written
    good.close()
    bad.close()


class _Bypass(ScriptedLM):
    """A model whose attention does not go through the slots (transformers' interface bypassed)."""

    def forward(self, input_ids, slot_batch, logits_to_keep, **_):
        return SimpleNamespace(logits=torch.zeros(1, len(logits_to_keep), len(self.vocab)))


def test_a_model_that_bypasses_the_slots_is_refused():
    lm = scripted("bypass", ["Yes"], {"": {"Yes": 1.0}}, prompt="Q?")
    lm.model = _Bypass(lm.tokenizer, "Q?", {})
    with ModelSession(lm) as session, pytest.raises(RuntimeError, match="attention interface"):
        session.next_token_logits(lm.tokenizer("Q?")["input_ids"], [1])


# ---------------------------------------------------------------- the embedded pair


@pytest.mark.real_models
def test_real_gemma_rows_past_its_sliding_window(fp32_pair):
    """Two long rows (past Gemma's 512-token window) and a short one in shared passes, with a rollback."""
    gemma = fp32_pair[0]
    long_a = gemma.encode_prompt("Count slowly: " + " ".join(str(i) for i in range(170)))
    long_b = gemma.encode_prompt("Count quickly: " + " ".join(str(i) for i in range(160, 0, -1)))
    short = gemma.encode_prompt("The capital of Madagascar is")
    assert 520 < min(len(long_a), len(long_b)) and len(long_a) + len(long_b) + len(short) <= SCHEDULER.max_tokens
    sessions = [ModelSession(gemma) for _ in range(3)]
    rows = [long_a, long_b, short]
    for step in range(2):
        if step:  # drop the last 7 ids and re-feed 3 of them, in every row
            rows = [ids[:-7] + ids[-3:] for ids in rows]
        calls = [lambda s=s, x=x: s.next_token_logits(x, [len(x) - 1, len(x)]) for s, x in zip(sessions, rows)]
        results, errors = together(gemma, calls)
        assert errors == [None] * 3
        for got, ids in zip(results, rows):
            torch.testing.assert_close(got, full_forward(gemma, ids, [len(ids) - 1, len(ids)]), atol=2e-3, rtol=1e-3)
    for session in sessions:
        assert session.stats.rows == 3 * session.stats.passes
        session.close()


@pytest.mark.real_models
def test_real_pair_batched_safe_runs_match_runs_alone(embedded_pair):
    prompts = ["The capital of Madagascar is", "Tom has 3 apples and buys 5 more. Now he has", "Copy: Ouagadougou"]
    config = DecodeConfig(strategy="safe", max_new_tokens=12)
    alone = [texts(list(decode(embedded_pair, prompt, config))) for prompt in prompts]
    handles = start_together(embedded_pair, [DecodeRequest(prompt, config) for prompt in prompts])
    assert [texts(handle.result(600)) for handle in handles] == alone


def test_runs_sharing_counts_each_run_on_the_models_once(pair):
    from safe_engine.runtime.session import runs_sharing

    assert runs_sharing(pair) == 0
    config = DecodeConfig(strategy="safe", max_new_tokens=24)
    runs = [decode(pair, prompt, config) for prompt in PROMPTS[:2]]
    for run in runs:
        next(run)  # RunStarted: the run's sessions are open
    alone = decode([pair[1]], PROMPTS[2], DecodeConfig(strategy="single", max_new_tokens=4))
    next(alone)
    assert runs_sharing(pair) == 3 and runs_sharing(pair[:1]) == 2 and runs_sharing(pair[1:]) == 3
    for run in [*runs, alone]:
        run.close()
    assert runs_sharing(pair) == 0
