"""JSON over HTTP to one server: one pooled set of keep-alive connections, a timeout on every call, retries
with backoff for transient faults, and errors that say which server failed and how.

Transient: the connection refused or dropped, 429 and 502–504 (a server restarting, a proxy in front of it).
A call that times out is not retried: a stalled server would otherwise hold the run for several timeouts.
A server that stays away fails the call with `RemoteError`; the run that made it fails with that message.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import urllib3

from ..contract.errors import SafeEngineError

TRANSIENT_STATUS = frozenset({429, 502, 503, 504})


class RemoteError(SafeEngineError):
    """A server did not answer as asked: unreachable, timed out, or refused the request."""


@dataclass(frozen=True)
class HttpSettings:
    """Per call: `timeout_s` for the answer (connecting gets at most 10 s of it), `retries` after a transient
    fault, waiting `backoff_s`, then twice that, and so on. `from_env` reads SAFE_OPENAI_TIMEOUT_S and
    SAFE_OPENAI_RETRIES."""

    timeout_s: float = 120.0
    retries: int = 3
    backoff_s: float = 0.5

    @classmethod
    def from_env(cls) -> HttpSettings:
        try:
            timeout = float(os.environ.get("SAFE_OPENAI_TIMEOUT_S", cls.timeout_s))
            retries = int(os.environ.get("SAFE_OPENAI_RETRIES", cls.retries))
        except ValueError:
            raise RemoteError("SAFE_OPENAI_TIMEOUT_S and SAFE_OPENAI_RETRIES must be numbers") from None
        if timeout <= 0 or retries < 0:
            raise RemoteError("SAFE_OPENAI_TIMEOUT_S must be positive and SAFE_OPENAI_RETRIES at least 0")
        return cls(timeout, retries)


class JsonClient:
    """Calls to one base URL from many threads at once (urllib3's pool is thread-safe), `maxsize` connections."""

    def __init__(self, base_url: str, api_key: str | None, settings: HttpSettings, maxsize: int = 64):
        self.base_url, self.settings = base_url, settings
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._pool = urllib3.PoolManager(maxsize=maxsize, block=False, retries=False)

    def get(self, path: str) -> dict:
        return self._call("GET", path, None)

    def post(self, path: str, body: dict) -> dict:
        return self._call("POST", path, json.dumps(body).encode())

    def _call(self, method: str, path: str, body: bytes | None) -> dict:
        url = self.base_url + path
        timeout = urllib3.Timeout(connect=min(10.0, self.settings.timeout_s), read=self.settings.timeout_s)
        for attempt in range(self.settings.retries + 1):
            last = attempt == self.settings.retries
            try:
                response = self._pool.request(method, url, body=body, headers=self._headers, timeout=timeout)
            except urllib3.exceptions.NewConnectionError as exc:  # refused, no such host: maybe restarting
                if last:
                    raise RemoteError(
                        f"{url} is unreachable after {attempt + 1} tries ({_reason(exc)}): is the server running?"
                    ) from None
            except (urllib3.exceptions.ReadTimeoutError, urllib3.exceptions.ConnectTimeoutError):
                raise RemoteError(f"{url} did not answer within {self.settings.timeout_s:g} s") from None
            except urllib3.exceptions.HTTPError as exc:  # the connection dropped mid-answer
                if last:
                    raise RemoteError(f"{url} dropped the connection {attempt + 1} times ({_reason(exc)})") from None
            else:
                if response.status < 300:
                    try:
                        return json.loads(response.data)
                    except ValueError:
                        raise RemoteError(f"{url} answered something that is not JSON") from None
                if response.status not in TRANSIENT_STATUS or last:
                    raise RemoteError(f"{url} answered {response.status}: {_message(response.data)}")
            time.sleep(self.settings.backoff_s * 2**attempt)
        raise AssertionError("unreachable: the last try returns or raises")

    def close(self) -> None:
        self._pool.clear()


def _reason(exc: Exception) -> str:
    reason = getattr(exc, "reason", None) or exc
    return str(reason).split(": ")[-1][:200]


def _message(data: bytes) -> str:
    """The server's own error message (OpenAI's {"error": {"message": ...}} or FastAPI's {"detail": ...})."""
    try:
        body = json.loads(data)
    except ValueError:
        return data[:200].decode(errors="replace")
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message", error))[:300]
    return str(error or (body.get("detail") if isinstance(body, dict) else body))[:300]
