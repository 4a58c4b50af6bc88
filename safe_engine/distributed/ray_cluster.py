"""Joining a Ray cluster, the actors' common base (`Replica`), and waiting on remote calls, with Ray's
failures turned into the engine's errors.

Nothing here waits without a limit: `await_result` takes a timeout, and an actor's death, a call past
its time and an exception raised remotely each become a `SafeEngineError` whose message says which.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from ..contract.errors import ModelLoadError, SafeEngineError, first_line

LOAD_TIMEOUT_S = 1800.0
"""Loading a model in an actor: a first conversion of an embedded model or a hub download takes minutes."""
RETRY_S = 0.2  # how often a call is sent again to an actor that Ray is restarting


class DistributedError(SafeEngineError):
    """A remote model or replica failed; the message says which one and what became of the run."""


class RemoteTimeout(DistributedError):
    """A remote call gave no answer within its time (the actor may still be busy with it)."""


class ActorLost(DistributedError):
    """The actor a run was using died or was restarted since: the run's state there is gone.
    `restarting`: Ray is restarting it now (it refuses calls meanwhile, then takes new ones)."""

    def __init__(self, message: str, restarting: bool = False):
        super().__init__(message)
        self.restarting = restarting


class Replica:
    """An actor's state: the subclass's `load(*args)` (every subclass defines it) runs in the constructor; its
    error is raised by every later call."""

    def __init__(self, *args):
        self._error = None
        try:
            self.load(*args)
        except Exception as exc:  # kept, so the driver gets the load error itself
            self._error = exc

    def ready(self) -> int:
        """This replica's process id, once it has loaded."""
        if self._error is not None:
            raise self._error
        return os.getpid()


def require_ray():
    try:
        import ray
    except ImportError:
        raise ModelLoadError(
            "models and sweeps on Ray need Ray: pip install 'safe-ensemble-studio[ray]' (from a checkout: "
            "pip install -r requirements-ray.txt)"
        ) from None
    return ray


def connect(address: str | None = None):
    """Ray, initialised once per process: the cluster at `address` (or $RAY_ADDRESS), else a local one.

    A process that already joined a cluster (a test's, an embedding application's) keeps it. A remote
    cluster gets this package's code with the job, so its workers need only the Python dependencies.
    """
    ray = require_ray()
    if not ray.is_initialized():
        code = {"py_modules": [str(Path(__file__).resolve().parents[1])]} if address else None
        ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING, runtime_env=code)
    return ray


def check_feasible(cpus: float, gpus: float, what: str) -> None:
    """Refuse at once an actor the cluster can never place (Ray would otherwise wait for it forever)."""
    have = require_ray().cluster_resources()
    for name, wanted in (("CPU", cpus), ("GPU", gpus)):
        if wanted > have.get(name, 0.0):
            raise ModelLoadError(f"{what} asks for {wanted:g} {name}, and the Ray cluster has {have.get(name, 0):g}")


def remote_error(exc: Exception, what: str) -> SafeEngineError:
    """The engine error for a failed remote call: an engine error raised remotely comes back as it was."""
    ray = require_ray()
    if isinstance(exc, ray.exceptions.RayActorError):
        message = f"{what} died mid-call ({first_line(exc)}); Ray restarts it, the runs using it cannot go on"
        return ActorLost(message, restarting=isinstance(exc, ray.exceptions.ActorUnavailableError))
    cause = getattr(exc, "cause", None)
    if isinstance(cause, SafeEngineError):
        return cause
    cause = cause or exc
    return DistributedError(f"{what} failed: {type(cause).__name__}: {first_line(cause)}")


def await_result(ref, timeout_s: float, what: str):
    """The value of one remote call, or the engine error saying why there is none."""
    ray = require_ray()
    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise RemoteTimeout(f"{what} gave no answer within {timeout_s:g} s") from None
    except ray.exceptions.RayError as exc:
        raise remote_error(exc, what) from None


def await_available(submit: Callable[[], object], timeout_s: float, what: str):
    """`await_result` of a call that may be sent again: while Ray restarts the actor (it refuses calls
    meanwhile), it is sent again until the actor is back or `timeout_s` is over."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await_result(submit(), max(deadline - time.monotonic(), 1e-3), what)
        except ActorLost as exc:
            if not exc.restarting:
                raise
            if time.monotonic() + RETRY_S > deadline:
                raise RemoteTimeout(f"{what} was not back from a restart within {timeout_s:g} s") from None
            time.sleep(RETRY_S)
