"""Admission to the slow endpoints: a few served at a time, a bounded queue, quick refusals.

``GET /v1/export/header``, ``GET /v1/results`` and ``POST /v1/results`` each belong to a
group (:meth:`Admissions.of`) with ``slots`` requests inside the app at a time, from routing
to the last byte sent, and at most ``queue`` more waiting at the door (:class:`SlowGate`,
outside every other layer, so a waiting request costs nothing but its connection). A request
that finds the queue full is refused with 429, after a pause of :data:`REFUSAL_PAUSE_S` (so
that a client asking again at once cannot keep the event loop busy with refusals); one that
waits longer than ``wait_s`` is refused with 503. Both carry ``Retry-After`` and a JSON
``detail`` like every other error. So however many clients ask, a request is answered or
refused within about ``wait_s``, and ``/v1/best`` keeps the event loop.

The queue is first come, first served. This module never reads the environment: the limits
come from :class:`core.settings.Settings` through :func:`service.main.create_app`.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import dataclass
from urllib.parse import unquote_plus

import anyio
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger(__name__)

# Refusals are logged at most this often per group (a flood must not flood the log too).
_LOG_EVERY_S = 10.0
#: How long a 429 waits before it is sent.
REFUSAL_PAUSE_S = 0.1


@dataclass(frozen=True)
class Refusal:
    """Why a request was not admitted: its status (429 or 503), message and retry delay."""

    status: int
    detail: str
    retry_after_s: int

    def response(self) -> JSONResponse:
        return JSONResponse(
            {"detail": self.detail},
            status_code=self.status,
            headers={"Retry-After": str(self.retry_after_s)},
        )


class Admission:
    """``slots`` requests of one group at a time, at most ``queue`` waiting, ``wait_s`` each.

    Not thread-safe: used only from the event loop. Waiters are events created when they
    wait, so one admission serves any number of successive event loops (as the tests do).

    Args:
        name: the group's name, for messages (``"result pages"``).
        slots: requests served at a time (>= 1).
        queue: requests that may wait (>= 0).
        wait_s: longest wait before a 503.
    """

    def __init__(self, name: str, slots: int, queue: int, wait_s: float) -> None:
        if slots < 1 or queue < 0 or wait_s <= 0:
            raise ValueError(f"bad admission limits: {slots} slots, queue {queue}, {wait_s} s")
        self.name = name
        self.slots = slots
        self.queue = queue
        self.wait_s = wait_s
        self.active = 0
        self.refused = 0
        self._waiters: deque[anyio.Event] = deque()
        self._logged_at = -math.inf

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def enter(self) -> Refusal | None:
        """Take a slot, waiting in the queue if need be; None when admitted (then call
        :meth:`leave` exactly once), else the refusal to answer with."""
        if self.active < self.slots and not self._waiters:
            self.active += 1
            return None
        if len(self._waiters) >= self.queue:
            return self._refuse(
                429,
                f"too many requests for {self.name}: {self.active} served and "
                f"{len(self._waiters)} waiting; retry later",
                1,
            )
        event = anyio.Event()
        self._waiters.append(event)
        try:
            with anyio.move_on_after(self.wait_s):
                await event.wait()
        except BaseException:
            # Cancelled while waiting (shutdown): give back a slot handed over meanwhile.
            if event.is_set():
                self.leave()
            else:
                self._waiters.remove(event)
            raise
        if event.is_set():  # leave() handed its slot to this request
            return None
        self._waiters.remove(event)
        return self._refuse(
            503,
            f"{self.name} busy: not served within {self.wait_s:g} s; retry later",
            max(1, math.ceil(self.wait_s)),
        )

    def leave(self) -> None:
        """Give the slot back: to the first waiter, else free it."""
        if self._waiters:
            self._waiters.popleft().set()  # the slot passes on; active stays
            return
        self.active -= 1

    def _refuse(self, status: int, detail: str, retry_after_s: int) -> Refusal:
        self.refused += 1
        now = time.monotonic()
        if now - self._logged_at >= _LOG_EVERY_S:
            self._logged_at = now
            log.warning("%s: %d (%d refused so far)", detail, status, self.refused)
        return Refusal(status, detail, retry_after_s)


class Admissions:
    """The admission of each slow endpoint group."""

    def __init__(self, *, slots: int, queue: int, wait_s: float) -> None:
        self.export = Admission("header exports", slots, queue, wait_s)
        self.results = Admission("result pages", slots, queue, wait_s)
        # One body in memory at a time (a parsed body takes about 7x its size).
        self.ingest = Admission("ingests", 1, queue, wait_s)
        # The /v1/best questions the in-memory index does not answer (packed batches, attention
        # variants) read the store in a worker thread, a few ms each: more of them at a time,
        # but bounded, so varying them cannot take the interpreter from the indexed answers.
        self.lookups = Admission("store lookups", LOOKUP_SLOTS_PER_SLOT * slots, queue, wait_s)

    def of(self, method: str, path: str, query: bytes = b"") -> Admission | None:
        """The admission of a request, None for the cheap endpoints (``/v1/best`` answered
        from the index: plain attention, any shape)."""
        if path == "/v1/export/header":
            return self.export
        if path == "/v1/results":
            return self.ingest if method == "POST" else self.results
        if path == "/v1/best/varlen" or (path == "/v1/best" and _asks_variant(query)):
            return self.lookups
        return None


#: Store lookups admitted at a time per slot of the other groups (``FA2TUNE_SERVICE_THREADS``).
LOOKUP_SLOTS_PER_SLOT = 4
_VARIANT_KEYS = frozenset({"window_left", "window_right", "chunk", "softcap", "sinks"})


def _asks_variant(query: bytes) -> bool:
    """Whether a /v1/best query names an attention-variant parameter (the raw query string:
    the gate runs before parsing; keys are unquoted as the parser will unquote them)."""
    return any(
        unquote_plus(part.split(b"=", 1)[0].decode("latin-1")) in _VARIANT_KEYS
        for part in query.split(b"&")
    )


class SlowGate:
    """The ASGI layer that admits slow requests (:class:`Admissions`) and passes the rest.

    A request for a slow endpoint enters the app only with a slot of its group and keeps it
    until its response is sent; the others wait here or are refused here, before routing,
    validation or any other middleware.
    """

    def __init__(self, app: ASGIApp, admissions: Admissions) -> None:
        self.app = app
        self.admissions = admissions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        admission = (
            self.admissions.of(scope["method"], scope["path"], scope.get("query_string", b""))
            if scope["type"] == "http"
            else None
        )
        if admission is None:
            await self.app(scope, receive, send)
            return
        refusal = await admission.enter()
        if refusal is not None:
            if refusal.status == 429:
                # A client that asks again at once, whatever Retry-After says, would otherwise
                # keep the event loop busy with refusals; a pause costs a sleeping task.
                await anyio.sleep(REFUSAL_PAUSE_S)
            await refusal.response()(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            admission.leave()
