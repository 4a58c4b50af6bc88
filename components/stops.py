"""One stop flag per browser session. gr.State values must deep-copy and a threading.Event cannot, so
the flags live here, keyed by Gradio's session hash; the engine checks the flag between forward passes.
A session's runs that overlap (a Live run and a Compare at once) share its flag: Stop ends all of them,
and no other session's."""

from __future__ import annotations

import threading


class Stops:
    def __init__(self):
        self._flags: dict[str, threading.Event] = {}
        self._holders: dict[str, int] = {}  # runs of the session holding its current flag
        self._lock = threading.Lock()

    def arm(self, session: str) -> threading.Event:
        """The flag of a run about to start: the session's running flag, or a fresh one after a Stop."""
        with self._lock:
            flag = self._flags.get(session)
            if flag is None or flag.is_set():
                flag = self._flags[session] = threading.Event()
                self._holders[session] = 0
            self._holders[session] += 1
            return flag

    def stop(self, session: str) -> None:
        with self._lock:
            if session in self._flags:
                self._flags[session].set()

    def disarm(self, session: str, flag: threading.Event) -> None:
        with self._lock:
            if self._flags.get(session) is not flag:
                return  # a Stop ended it and a later run armed a fresh flag
            self._holders[session] -= 1
            if not self._holders[session]:
                del self._flags[session], self._holders[session]
