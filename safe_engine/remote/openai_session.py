"""A remote model's session: what SAFE reads of a model, asked of an OpenAI-compatible server (vLLM's API).

The strategies ask `next_token_logits(ids, starts)` as of any model. Over HTTP, one ``/v1/completions`` call
with the token ids as the prompt answers a whole call:

- a position at the end of `ids` (the drafter drafting, a model's next token): the server generates
  `LOOKAHEAD` greedy tokens, each with its top-k log-probabilities; the positions after the first are kept,
  valid while the run's ids follow those greedy tokens, so a drafter's round costs one request;
- positions inside `ids` (a verifier scoring a draft): at each, the log-probability of the token there and
  the top-k, asked in one of two request shapes chosen per call by measured cost (`request_shapes`): one
  request with ``prompt_logprobs`` (a full prefill every round), or one generation request per position sent
  together (over the server's prefix cache); the session's `stats` count the calls of each.

Every request sends the token sequence up to where it asks, so the engine's prefix cache plays the KV rollback.

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
from .request_shapes import PER_POSITION, PROMPT_LOGPROBS, ShapeCosts

TOP_K = 20
"""Log-probabilities asked per position: vLLM's default `--max-logprobs` is 20; above the ensemble's top-k (10)."""
LOOKAHEAD = 8
"""Greedy tokens generated when a model is asked for its next token (the SAFE default drafts 5 a round)."""
IN_FLIGHT = 64
"""Requests to one server at once: a pass's runs times a call's requests (a verifier's round is one per position)."""


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
    """One call's question (`prompt`, `scored` positions inside it, `generate` tokens after it, `next_id`: the
    run's token after the prompt when it has one, and the `shape` of the requests that ask the scored
    positions, chosen when it is sent) and its answer (`rows`: position -> Row; `generated`: the greedy
    tokens, or `next_id`)."""

    prompt: list[int]
    scored: list[int]
    generate: int
    next_id: int | None = None
    shape: str | None = None
    rows: dict[int, Row] = field(default_factory=dict)
    generated: list[int] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return 1 + len(self.scored) if self.shape == PER_POSITION else 1

    def bodies(self) -> list[dict]:
        """The requests that answer it, the one after the whole prompt first. A token the run has there is
        forced (``allowed_token_ids``), so its own log-probability comes back beside the top-k."""
        after = _body(self.prompt, self.generate, self.next_id)
        if self.shape == PROMPT_LOGPROBS:
            return [after | {"prompt_logprobs": TOP_K}]
        return [after] + [_body(self.prompt[:t], 1, self.prompt[t]) for t in self.scored]

    def read(self, answers: list[dict], url: str) -> None:
        """Take the rows and greedy tokens from the answers to `bodies()`, in their order."""
        choices = [_first_choice(answer, url) for answer in answers]
        self.generated = _read_generated(choices[0], len(self.prompt), self.next_id, self.rows, url)
        if self.shape == PROMPT_LOGPROBS:
            prompt_rows = choices[0].get("prompt_logprobs") or []
            if len(prompt_rows) < len(self.prompt):
                raise RemoteError(f"{url} returned no prompt log-probabilities")
            for t in self.scored:
                self.rows[t] = Row({int(k): float(v["logprob"]) for k, v in prompt_rows[t].items()})
            return
        for t, choice in zip(self.scored, choices[1:]):
            _read_generated(choice, t, self.prompt[t], self.rows, url)


def _body(prompt: list[int], generate: int, forced: int | None) -> dict:
    body = {
        "prompt": prompt,
        "max_tokens": generate,
        "temperature": 0.0,
        "logprobs": TOP_K,
        "return_tokens_as_token_ids": True,
    }
    return body if forced is None else body | {"allowed_token_ids": [forced]}


def _read_generated(choice: dict, start: int, forced: int | None, rows: dict[int, Row], url: str) -> list[int]:
    """The generated tokens of an answer (`forced`, if a token was); the row of each, from position `start`
    on, goes into `rows`."""
    logprobs = choice.get("logprobs") or {}
    tokens, tops = logprobs.get("tokens") or [], logprobs.get("top_logprobs") or []
    if not tokens or len(tops) != len(tokens):
        raise RemoteError(f"{url} returned no token log-probabilities")
    generated = [_token_id(t) for t in tokens]
    if forced is not None and generated != [forced]:
        raise RemoteError(f"{url} did not keep to allowed_token_ids, so it cannot score a given token")
    for i, top in enumerate(tops):
        row = {_token_id(k): float(v) for k, v in top.items()}
        row.setdefault(generated[i], float(logprobs["token_logprobs"][i]))
        rows[start + i] = Row(row)
    return generated


class HttpExecutor(Executor[Call]):
    """The scheduler's executor for one served model: a pass sends every request of every waiting run at once,
    each on its own pooled connection, so the server batches them; a failed request fails only its own run.
    A scoring call's shape is chosen here, from the seconds each shape's calls took (`ShapeCosts`)."""

    def __init__(self, scheduler: Scheduler, client: JsonClient, served_name: str):
        super().__init__(scheduler, served_name, f"http:{client.base_url}")
        self.client, self.served_name = client, served_name
        self.costs = ShapeCosts()
        self._threads = ThreadPoolExecutor(max_workers=IN_FLIGHT, thread_name_prefix=f"http-{served_name}")

    def run_pass(self, batch: list[Request[Call]]) -> None:
        started = time.perf_counter()
        sent = []
        for call in (request.slot for request in batch):
            call.shape = self.costs.choose(len(call.prompt)) if call.scored else None
            sent.append([self._threads.submit(self._ask, body) for body in call.bodies()])
        for request, futures in zip(batch, sent):
            call = request.slot
            try:
                answers = [future.result() for future in futures]
                call.read([answer for answer, _ in answers], self.client.base_url)
            except Exception as exc:  # this run's request failed; the others stand
                request.error = exc
            else:
                if call.shape:
                    self.costs.note(call.shape, len(call.prompt), max(end for _, end in answers) - started)
            request.rows, request.started = len(batch), started
            request.seconds = time.perf_counter() - started
        self.note_pass(time.perf_counter() - started)

    def _ask(self, body: dict) -> tuple[dict, float]:
        """One request's answer, and when it came."""
        answer = self.client.post("/completions", {"model": self.served_name} | body)
        return answer, time.perf_counter()


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


@dataclass
class ServedStats(ForwardStats):
    """A served session's calls (`passes`), plus the HTTP `requests` they took and how many scoring calls
    took each request shape (`shapes`: shape -> calls)."""

    requests: int = 0
    shapes: dict[str, int] = field(default_factory=dict)


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
        self.name, self.scheduler, self.stats = served.name, scheduler, ServedStats()
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
            if end == len(ids):  # the next token: greedy tokens past it serve the next calls while the run follows
                self._ask(Call(ids, inside, 1 if inside else LOOKAHEAD))
            else:
                self._ask(Call(ids[:end], inside, 1, ids[end]))
        return torch.stack([self._rows[t].dense(self._vocab_size) for t in starts])

    def _ask(self, call: Call) -> None:
        request = Request(self._run, call, 0, [], [])
        self.scheduler.answer(self.executor, request)
        self.stats.passes += 1
        self.stats.positions += len(call.prompt) + call.generate
        self.stats.seconds += request.seconds
        self.stats.rows += request.rows
        self.stats.wait_seconds += request.started - request.submitted
        self.stats.requests += call.requests
        if call.shape:
            self.stats.shapes[call.shape] = self.stats.shapes.get(call.shape, 0) + 1
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
