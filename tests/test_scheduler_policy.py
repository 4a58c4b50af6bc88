"""The scheduler's policy on hand-made views of executors' queues: no threads, no models, no clock."""

from dataclasses import replace

import pytest

from safe_engine.runtime.policy import Queue, is_due, next_on_device, seconds_until_due

MAX_WAIT = 0.02
ARRIVED = 100.0  # when the oldest request was submitted
WAITING = Queue(waiting=1, oldest=ARRIVED, freed=0.0, recent_pass_s=None, holder_computes=True)


def test_a_run_alone_never_waits():
    alone = replace(WAITING, holder_computes=False, recent_pass_s=1.0)
    assert is_due(alone, ARRIVED, MAX_WAIT)  # the moment it arrives


@pytest.mark.parametrize(
    ("recent_pass_s", "wait"),
    [(None, MAX_WAIT), (0.01, 0.005), (0.04, MAX_WAIT), (1.0, MAX_WAIT)],
)
def test_a_request_waits_max_wait_or_half_the_recent_pass_from_its_arrival(recent_pass_s, wait):
    queue = replace(WAITING, recent_pass_s=recent_pass_s)
    assert seconds_until_due(queue, ARRIVED, MAX_WAIT) == pytest.approx(wait)
    assert not is_due(queue, ARRIVED + wait - 1e-6, MAX_WAIT)
    assert is_due(queue, ARRIVED + wait, MAX_WAIT)


def test_the_wait_runs_from_the_end_of_the_pass_it_arrived_behind():
    behind = replace(WAITING, freed=ARRIVED + 1.0)  # the device freed a second after the request came
    assert seconds_until_due(behind, ARRIVED + 1.0, MAX_WAIT) == pytest.approx(MAX_WAIT)
    assert not is_due(behind, ARRIVED + 1.0 + MAX_WAIT / 2, MAX_WAIT)
    assert is_due(behind, ARRIVED + 1.0 + MAX_WAIT, MAX_WAIT)
    earlier = replace(WAITING, freed=ARRIVED - 1.0)  # a pass that ended before it came counts for nothing
    assert seconds_until_due(earlier, ARRIVED, MAX_WAIT) == pytest.approx(MAX_WAIT)


def test_the_device_goes_to_the_most_rows_waiting_then_the_oldest_then_the_first_listed():
    few_old, many_new = replace(WAITING, waiting=1), replace(WAITING, waiting=3, oldest=ARRIVED + 1)
    assert next_on_device([few_old, many_new], patience=4) == 1
    assert next_on_device([many_new, few_old], patience=4) == 0
    newer = replace(few_old, oldest=ARRIVED + 1)
    assert next_on_device([newer, few_old], patience=4) == 1
    assert next_on_device([few_old, few_old], patience=4) == 0
    assert next_on_device([many_new], patience=4) == 0


def test_a_queue_passed_over_patience_times_goes_first():
    many = replace(WAITING, waiting=5)
    for passed_over in range(4):
        assert next_on_device([replace(WAITING, passed_over=passed_over), many], patience=4) == 1
    patient = replace(WAITING, passed_over=4, oldest=ARRIVED + 1)
    assert next_on_device([many, patient], patience=4) == 1
    both = replace(many, passed_over=6)  # both passed over that often: rows decide again
    assert next_on_device([patient, both], patience=4) == 1
