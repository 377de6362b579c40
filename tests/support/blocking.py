"""A stand-in for slow work that blocks until the test releases it, so that tests of
concurrency hold a request in flight for as long as they need without timing anything."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

#: Longest a test waits for something that must happen (a hang fails rather than blocks).
DEADLINE_S = 30.0


class Blocker:
    """A stand-in for slow work: each call records itself and blocks until released."""

    def __init__(self, result: Callable[..., Any]) -> None:
        self.result = result
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls: list[tuple[Any, ...]] = []
        self.active = self.peak = 0
        self._lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.calls.append(args)
            self.active += 1
            self.peak = max(self.peak, self.active)
        self.entered.set()
        try:
            assert self.release.wait(DEADLINE_S), "never released"
            return self.result(*args, **kwargs)
        finally:
            with self._lock:
                self.active -= 1


def wait_until(condition: Callable[[], bool]) -> None:
    """Wait for ``condition`` (another thread's progress); fail after :data:`DEADLINE_S`."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, "condition never met"
        time.sleep(0.005)
