"""One stop flag per browser session. gr.State values must deep-copy and a threading.Event cannot, so
the flags live here, keyed by Gradio's session hash; the engine checks the flag between forward passes."""

from __future__ import annotations

import threading


class Stops:
    def __init__(self):
        self._flags: dict[str, threading.Event] = {}

    def arm(self, session: str) -> threading.Event:
        flag = self._flags[session] = threading.Event()
        return flag

    def stop(self, session: str) -> None:
        if session in self._flags:
            self._flags[session].set()

    def disarm(self, session: str, flag: threading.Event) -> None:
        if self._flags.get(session) is flag:
            del self._flags[session]
