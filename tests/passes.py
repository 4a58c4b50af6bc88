"""Helpers for tests that put several runs' requests into shared forward passes, and check the logits."""

import threading
import time

import torch

from safe_engine import decode_many


def full_forward(lm, ids, starts):
    with torch.inference_mode():
        logits = lm.model(torch.tensor([ids])).logits[0].float()
    return torch.stack([logits[t - 1] for t in starts])


def queued(scheduler, lm) -> int:
    executor = lm.sessions.executor(scheduler)
    with scheduler.lock:
        return executor.waiting()


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def together(scheduler, lm, calls):
    """Run the calls in threads while the device is held, so all their requests share one pass."""
    results, errors = [None] * len(calls), [None] * len(calls)

    def work(i):
        try:
            results[i] = calls[i]()
        except Exception as exc:
            errors[i] = exc

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(calls))]
    with scheduler.device(lm.device):
        for thread in threads:
            thread.start()
        wait_for(lambda: queued(scheduler, lm) + sum(not t.is_alive() for t in threads) == len(calls))
    for thread in threads:
        thread.join(60)
    return results, errors


def start_together(scheduler, models, requests, **kwargs):
    """decode_many with the first passes of every run gathered into one (on the first model's device)."""
    with scheduler.device(models[0].device):
        handles = decode_many(models, requests, scheduler=scheduler, **kwargs)
        wait_for(lambda: queued(scheduler, models[0]) == min(len(requests), kwargs.get("max_parallel", 8)))
    return handles
