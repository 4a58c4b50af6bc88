"""Models held by Ray actors (a ``ray:`` spec): the strategies run them through the same session API.

The actor (`ModelHost`) loads the model and keeps one session per run, made by its model's own
`open_session` (so a batched runtime behind it serves many runs at once). The driver gets a LoadedModel
with the real tokenizer, byte table, end ids and context length here (alignment, chat templates and stop
rules need them), whose session factory (`ActorSessions`) opens `RemoteSession` proxies. A proxy's
`forget_before` and its stats ride along with the next logits call, so a step costs one round trip.

Faults: every call waits at most the spec's timeout (RemoteTimeout). An actor that dies is restarted by
Ray (up to the spec's restarts; it reloads its model), and the runs that had sessions in it fail with
ActorLost: their KV caches are gone, and rebuilding them could differ in the last bits of the logits,
so a run is never continued silently. A new run uses the restarted actor.
"""

from __future__ import annotations

import functools
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ..contract.sessions import ForwardStats
from ..models.loading import LoadedModel, LoadOptions, load_model
from ..models.specs import resolve_spec
from .ray_cluster import (
    LOAD_TIMEOUT_S,
    ActorLost,
    Replica,
    await_available,
    await_result,
    check_feasible,
    connect,
    require_ray,
)
from .ray_spec import RayPlacement, parse_ray_spec

MAX_RUNS_AT_ONCE = 16
"""Calls an actor serves concurrently (one per run at a time; a run's own calls come one by one)."""


@dataclass(frozen=True)
class HostedModel:
    """What the driver needs of a model that lives in an actor."""

    name: str
    tokenizer: object
    context_length: int | None
    eos_ids: frozenset[int]
    device: str
    dtype: object
    int8: bool
    cpu_linear: str | None
    computes: dict  # how the actor's model computes (its session factory's description: the runtime path)


class ModelHost(Replica):
    """The actor's side: one loaded model and the sessions of the runs that use it (Ray sets its torch
    threads to its CPUs)."""

    def load(self, spec: str, options: LoadOptions) -> None:
        self._sessions: dict[str, object] = {}
        self._lm = load_model(spec, options)

    def describe(self) -> HostedModel:
        self.ready()
        lm = self._lm
        return HostedModel(
            lm.name,
            lm.tokenizer,
            lm.context_length,
            lm.eos_ids,
            lm.device,
            lm.dtype,
            lm.int8,
            lm.cpu_linear,
            lm.sessions.describe(),
        )

    def next_token_logits(self, session_id: str, ids: list[int], starts: list[int], forget: int | None, first: bool):
        """A session's logits (its stats after the call ride along); `first` opens it."""
        self.ready()
        lm, session = self._lm, self._sessions.get(session_id)
        if session is None:
            if not first:
                raise ActorLost(f"the Ray actor holding {lm.name} was restarted during this run; start it again")
            session = self._sessions[session_id] = lm.open_session()
        if forget is not None:
            session.forget_before(forget)
        return session.next_token_logits(ids, starts), asdict(session.stats)

    def close(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if hasattr(session, "close"):
            session.close()

    def open_sessions(self) -> int:
        return len(self._sessions)


@dataclass(frozen=True)
class ActorSessions:
    """The session factory of a model held by a Ray actor: its sessions are proxies of sessions in the actor."""

    actor: object
    placement: RayPlacement
    name: str
    computes: dict  # the actor's own description of how its model computes

    @property
    def key(self) -> object:
        return self.actor

    def open(self) -> RemoteSession:
        return RemoteSession(self)

    def describe(self) -> dict:
        return self.computes | {"placement": "ray"}

    def pid(self) -> int:
        """The actor's process now (it changes when Ray restarts the actor)."""
        return await_available(self.actor.ready.remote, self.placement.timeout_s, self.what)

    def close(self) -> None:
        """End the actor (and every session in it)."""
        require_ray().kill(self.actor)

    @property
    def what(self) -> str:
        return f"the Ray actor holding {self.name}"


class RemoteSession:
    """A session (`contract.sessions.Session`) that lives in a model's actor, asked over Ray."""

    def __init__(self, host: ActorSessions):
        self.host = host
        self.stats = ForwardStats()
        self._id = uuid.uuid4().hex
        self._forget: int | None = None
        self._opened = False
        self._finalizer = weakref.finalize(self, _close_quietly, host.actor, self._id)
        self._finalizer.atexit = False  # Ray may be gone by then, and the actor with it

    def next_token_logits(self, ids: Sequence[int], starts: Sequence[int]):
        ids, starts = list(ids), list(starts)

        def submit():
            return self.host.actor.next_token_logits.remote(self._id, ids, starts, self._forget, not self._opened)

        if self._opened:  # its state is in the actor: if the actor is lost, so is this run
            logits, stats = await_result(submit(), self.host.placement.timeout_s, self.host.what)
        else:  # nothing of it is there yet: wait for an actor that Ray is restarting
            logits, stats = await_available(submit, self.host.placement.timeout_s, self.host.what)
        self._opened, self._forget = True, None
        self.stats = ForwardStats(**stats)
        return logits

    def forget_before(self, start: int) -> None:
        self._forget = start if self._forget is None else max(self._forget, start)

    def close(self) -> None:
        self._finalizer()


def _close_quietly(actor, session_id: str) -> None:
    try:
        actor.close.remote(session_id)
    except Exception:  # the actor or Ray itself already ended: nothing is left to free
        pass


@functools.cache
def _host_class():
    return require_ray().remote(ModelHost)


def load_ray_model(spec: str, options: LoadOptions = LoadOptions(), progress=None) -> LoadedModel:
    """Start an actor that loads the inner spec, and wait (bounded) until it holds the model."""
    placement, inner = parse_ray_spec(spec)
    resolved = resolve_spec(spec)
    ray = connect()
    what = f"the Ray actor for {resolved.short_name}"
    check_feasible(placement.cpus, placement.gpus, what)
    if progress:
        progress(f"starting {what} ({placement.describe()})")
    actor = (
        _host_class()
        .options(
            num_cpus=placement.cpus,
            num_gpus=placement.gpus,
            max_restarts=placement.restarts,
            max_task_retries=0,
            max_concurrency=MAX_RUNS_AT_ONCE,
        )
        .remote(inner, options)
    )
    try:
        hosted = await_result(actor.describe.remote(), LOAD_TIMEOUT_S, f"loading {inner} in {what}")
    except BaseException:
        ray.kill(actor)
        raise
    return LoadedModel(
        spec=resolved,
        name=hosted.name,
        tokenizer=hosted.tokenizer,
        sessions=ActorSessions(actor, placement, hosted.name, hosted.computes),
        use_chat_template=options.chat_template,
        eos_ids=hosted.eos_ids,
        context_length=hosted.context_length,
        device=hosted.device,
        dtype=hosted.dtype,
        int8=hosted.int8,
        cpu_linear=hosted.cpu_linear,
    )
