"""A remote model's session: what SAFE reads of a model, asked of an OpenAI-compatible server (vLLM's API).

The strategies ask `next_token_logits(ids, starts)` as of any model. Over HTTP, one ``/v1/completions`` call
with the token ids as the prompt answers a whole call:

- a position at the end of `ids` (the drafter drafting, a model's next token): the server generates
  `LOOKAHEAD` greedy tokens, each with its top-k log-probabilities; the positions after the first are kept,
  valid while the run's ids follow those greedy tokens, so a drafter's round costs one request;
- positions inside `ids` (a verifier scoring a draft): ``prompt_logprobs`` gives, at each prompt position,
  the log-probability of the token there and the top-k.

Every request sends the whole token sequence, so the engine's prefix cache plays the KV rollback.

The one approximation (docs/models.md, "Remote models"): a server returns the top-k (`TOP_K`) log-probabilities
at a position, plus the prompt's own token there, not the whole distribution. The row the strategies get
holds those exactly; every other token shares the rest of the probability mass evenly. Argmaxes, a draft's
probabilities, a verifier's probability of its own token and the union's top-k members are exact; a union
token outside one model's top-k gets that even share instead of its own probability.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from ..contract.sessions import ForwardStats
from ..runtime.kv_slots import common_prefix
from ..runtime.scheduler import SCHEDULER, ActiveRun, Executor, Request, Scheduler
from .http_client import JsonClient, RemoteError

TOP_K = 20
"""Log-probabilities asked per position: vLLM's default `--max-logprobs` is 20; above the ensemble's top-k (10)."""
LOOKAHEAD = 8
"""Greedy tokens generated when a model is asked for its next token (the SAFE default drafts 5 a round)."""


@dataclass(frozen=True)
class Row:
    """One position's distribution as the server gave it: log-probabilities of some tokens, the rest even."""

    logprobs: dict[int, float]

    def dense(self, vocab_size: int) -> torch.Tensor:
        """Log-probabilities over the vocabulary (the strategies take logits; a softmax gives them back)."""
        seen = {t: lp for t, lp in self.logprobs.items() if 0 <= t < vocab_size}
        rest = max(1.0 - sum(math.exp(lp) for lp in seen.values()), 1e-12)
        row = torch.full((vocab_size,), math.log(rest / max(vocab_size - len(seen), 1)), dtype=torch.float32)
        if seen:
            row[torch.tensor(list(seen))] = torch.tensor(list(seen.values()), dtype=torch.float32)
        return row


@dataclass
class Call:
    """One HTTP request's question (`prompt`, `scored` positions inside it, `generate` tokens after it) and its
    answer (`rows`: position -> Row; `generated`: the greedy tokens)."""

    prompt: list[int]
    scored: list[int]
    generate: int
    rows: dict[int, Row] = field(default_factory=dict)
    generated: list[int] = field(default_factory=list)


class HttpExecutor(Executor[Call]):
    """The scheduler's executor for one served model: a pass sends every waiting run's request at once, each on
    its own pooled connection, so several runs have requests in flight together; a failed request fails only
    its own run."""

    def __init__(self, scheduler: Scheduler, client: JsonClient, served_name: str):
        super().__init__(scheduler, served_name, f"http:{client.base_url}")
        self.client, self.served_name = client, served_name
        self._threads = ThreadPoolExecutor(max_workers=scheduler.max_rows, thread_name_prefix=f"http-{served_name}")

    def run_pass(self, batch: list[Request[Call]]) -> None:
        started = time.perf_counter()
        futures = [self._threads.submit(self._ask, request.slot) for request in batch]
        for request, future in zip(batch, futures):
            try:
                future.result()
            except Exception as exc:  # this run's request failed; the others stand
                request.error = exc
            request.rows, request.started = len(batch), started
            request.seconds = time.perf_counter() - started
        self.note_pass(time.perf_counter() - started)

    def _ask(self, call: Call) -> None:
        body = {
            "model": self.served_name,
            "prompt": call.prompt,
            "max_tokens": call.generate,
            "temperature": 0.0,
            "logprobs": TOP_K,
            "return_tokens_as_token_ids": True,
        }
        if call.scored:
            body["prompt_logprobs"] = TOP_K
        choice = _first_choice(self.client.post("/completions", body), self.client.base_url)
        if call.scored:
            prompt_rows = choice.get("prompt_logprobs") or []
            if len(prompt_rows) < len(call.prompt):
                raise RemoteError(f"{self.client.base_url} returned no prompt log-probabilities for {self.served_name}")
            for t in call.scored:
                call.rows[t] = Row({int(k): float(v["logprob"]) for k, v in prompt_rows[t].items()})
        logprobs = choice.get("logprobs") or {}
        tokens, tops = logprobs.get("tokens") or [], logprobs.get("top_logprobs") or []
        if not tokens or len(tops) != len(tokens):
            raise RemoteError(f"{self.client.base_url} returned no token log-probabilities for {self.served_name}")
        call.generated = [_token_id(t) for t in tokens]
        for i, top in enumerate(tops):
            row = {_token_id(k): float(v) for k, v in top.items()}
            row.setdefault(call.generated[i], float(logprobs["token_logprobs"][i]))
            call.rows[len(call.prompt) + i] = Row(row)


def _first_choice(answer: dict, url: str) -> dict:
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not choices:
        raise RemoteError(f"{url} answered without choices")
    return choices[0]


def _token_id(key: str) -> int:
    """vLLM spells a token `token_id:123` under `return_tokens_as_token_ids`."""
    if not key.startswith("token_id:"):
        raise RemoteError(f"the server spelled a token as {key[:40]!r}, not token_id:N (is it vLLM?)")
    return int(key[len("token_id:") :])


class OpenAISession:
    """A session (`contract.sessions.Session`) on a model behind a server (see the module's docstring). Rows are
    remembered per position while the run's ids keep the prefix they were computed on, like a local session's
    logits. `served`: the model's `ServedSessions` (its client, served name, name and vocabulary size)."""

    def __init__(self, served, scheduler: Scheduler | None = None):
        run = ActiveRun.current()
        if scheduler is None:
            scheduler = SCHEDULER if run is None else run.scheduler
        if run is None or run.scheduler is not scheduler:
            run = ActiveRun(scheduler)
        self.name, self.scheduler, self.stats = served.name, scheduler, ForwardStats()
        self.executor = scheduler.executor(
            served.client, lambda: HttpExecutor(scheduler, served.client, served.served_name)
        )
        self.cached_ids: list[int] = []  # the ids the remembered rows were computed on
        self._rows: dict[int, Row] = {}
        self._vocab_size = served.vocab_size
        self._closed = False
        self._run = run
        run.attach(self)

    def next_token_logits(self, ids: Sequence[int], starts: Sequence[int]) -> torch.Tensor:
        """Logits of the distribution of ids[t] given ids[:t], for each t in `starts` (1 ≤ t ≤ len(ids))."""
        if self._closed:
            raise RuntimeError(f"the session on {self.name} is closed")
        ids = [int(i) for i in ids]
        if not all(1 <= t <= len(ids) for t in starts):
            raise ValueError(f"positions {min(starts)}..{max(starts)} are outside the {len(ids)} ids given")
        keep = common_prefix(self.cached_ids, ids)
        self._rows = {t: row for t, row in self._rows.items() if t <= keep}
        self.cached_ids = ids
        missing = sorted({t for t in starts if t not in self._rows})
        if missing:
            end = missing[-1]
            inside = [t for t in missing if t < end]
            generate = LOOKAHEAD if end == len(ids) and not inside else 1
            self._ask(Call(ids[:end], inside, generate))
        return torch.stack([self._rows[t].dense(self._vocab_size) for t in starts])

    def _ask(self, call: Call) -> None:
        request = Request(self._run, call, 0, [], [])
        self.scheduler.answer(self.executor, request)
        self.stats.passes += 1
        self.stats.positions += len(call.prompt) + call.generate
        self.stats.seconds += request.seconds
        self.stats.rows += request.rows
        self.stats.wait_seconds += request.started - request.submitted
        self._rows.update(call.rows)
        if len(call.prompt) == len(self.cached_ids):  # greedy tokens past the end: valid while the run follows them
            self.cached_ids = self.cached_ids + call.generated[:-1]

    def forget_before(self, start: int) -> None:
        self._rows = {t: row for t, row in self._rows.items() if t >= start}

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._run.detach(self)

    def __enter__(self) -> OpenAISession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
