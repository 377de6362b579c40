"""Connection limits of ``fa2tune serve``: how many, how long idle, how large a request head.

uvicorn alone closes an idle connection only after it has answered a request on it, so a
connection that never sends a byte stays open for ever; it caps nothing but in-flight work
(``limit_concurrency`` answers *every* request 503 past it, and still accepts connections
until the process runs out of descriptors, after which nobody gets in); and with httptools it
takes request headers of any size (40 partial 16 MB headers took a server to 943 MB). The
HTTP protocol of :func:`uvicorn_options` (uvicorn's httptools protocol, subclassed) adds:

* **Idle connections**: closed after ``service_keep_alive_s`` without a byte, counted from
  the connection's opening as well as from its last answer.
* **Request heads**: the request line and headers must arrive within
  ``service_header_timeout_s`` of their first byte (else the connection is closed) and hold
  at most ``service_max_header_bytes`` (else a JSON 431, and the connection is closed); what
  is buffered of a head is bounded by that plus one read.
* **Connections**: at most ``service_max_connections``, and 128 fewer than the process's
  descriptor limit (``ulimit -n``; the rest is for the database, the render workers, logs).
  A new connection past the cap closes the longest-idle connection (one between requests),
  else the oldest one still sending its request head, else itself: a connection whose
  request is being answered is never closed for another. So a flood of idle connections
  cannot lock out a client that sends a request.

Bodies are the app's: only ``POST /v1/results`` reads one, with its own size cap and read
deadline (:mod:`service.routers.results`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import resource
from dataclasses import dataclass
from typing import Any, ClassVar

from core.settings import Settings

log = logging.getLogger(__name__)

#: Descriptors kept free under the process's limit for everything but client connections.
RESERVED_DESCRIPTORS = 128
_ACTIVITY = itertools.count()
# Closed connections are logged at most this often (a flood must not flood the log too).
_LOG_EVERY_S = 10.0


@dataclass(frozen=True)
class ConnectionLimits:
    """The limits the server's HTTP protocol enforces (see the module docstring)."""

    max_connections: int
    idle_timeout_s: float
    header_timeout_s: float
    max_header_bytes: int

    @classmethod
    def of(cls, settings: Settings) -> ConnectionLimits:
        return cls(
            max_connections=connection_cap(settings.service_max_connections),
            idle_timeout_s=settings.service_keep_alive_s,
            header_timeout_s=settings.service_header_timeout_s,
            max_header_bytes=settings.service_max_header_bytes,
        )


def connection_cap(wanted: int) -> int:
    """``wanted``, lowered to leave :data:`RESERVED_DESCRIPTORS` of the descriptor limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - RESERVED_DESCRIPTORS))


def _too_large_response(limit: int) -> bytes:
    body = json.dumps({"detail": f"request line and headers over {limit} bytes"}).encode()
    return (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
        b"content-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n"
        b"connection: close\r\n\r\n" + body
    )


class _Closures:
    """Counts of connections closed by the limits, logged now and then."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._logged_at = -math.inf

    def note(self, why: str, loop: asyncio.AbstractEventLoop) -> None:
        self.counts[why] = self.counts.get(why, 0) + 1
        now = loop.time()
        if now - self._logged_at >= _LOG_EVERY_S:
            self._logged_at = now
            summary = ", ".join(f"{n} {reason}" for reason, n in sorted(self.counts.items()))
            log.warning("connections closed by the server's limits so far: %s", summary)


def limited_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's httptools HTTP protocol with ``limits`` (see the module docstring).

    Raises:
        ImportError: httptools is not installed (``uvicorn[standard]`` installs it).
    """
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class LimitedHttpToolsProtocol(HttpToolsProtocol):
        LIMITS: ClassVar[ConnectionLimits] = limits
        CLOSED: ClassVar[_Closures] = _Closures()

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # uvicorn arms its keep-alive timer with this after each answer.
            self.timeout_keep_alive = self.LIMITS.idle_timeout_s  # type: ignore[assignment]
            # When it last opened, was answered or began a head, as a sequence number: loop
            # time has a millisecond's resolution (uvloop), too coarse to order a burst.
            self._since = 0
            self._head_done = False  # the current request's head is complete
            self._head_bytes = 0  # bytes of the current head in earlier reads
            self._read = 0  # bytes of the read being parsed
            self._too_large = False
            self._head_timer: asyncio.TimerHandle | None = None

        # -- connection lifetime

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._since = next(_ACTIVITY)
            # Idle from the start, not only after a first answer.
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )
            if len(self.connections) > self.LIMITS.max_connections:
                self._make_room()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_timer()
            super().connection_lost(exc)

        def timeout_keep_alive_handler(self) -> None:
            if not self.transport.is_closing():
                self.CLOSED.note("idle", self.loop)
            super().timeout_keep_alive_handler()

        def _busy(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def _reading_head(self) -> bool:
            return not self._head_done and self._head_bytes > 0

        def _make_room(self) -> None:
            """Close one connection for this new one: the longest idle, else the oldest still
            sending a head, else this one."""
            idle: list[LimitedHttpToolsProtocol] = []
            heads: list[LimitedHttpToolsProtocol] = []
            for other in self.connections:
                if other is self or not isinstance(other, LimitedHttpToolsProtocol):
                    continue
                if other.transport.is_closing() or other._busy():
                    continue
                (heads if other._reading_head() else idle).append(other)
            candidates = idle or heads
            if not candidates:
                self.CLOSED.note("refused at the connection cap", self.loop)
                self.transport.close()
                return
            victim = min(candidates, key=lambda p: p._since)
            self.CLOSED.note(
                "idle, for a new connection" if idle else "sending a head, for a new connection",
                self.loop,
            )
            victim.transport.close()

        # -- the request head

        def data_received(self, data: bytes) -> None:
            if self._too_large:
                return
            self._read = len(data)
            super().data_received(data)
            if not self._head_done and not self._too_large:
                self._head_bytes += len(data)
                self._too_large = self._head_bytes > self.LIMITS.max_header_bytes
                if self._head_timer is None and not self._too_large:
                    # Only a head that did not come in one read needs a deadline (a timer
                    # per request would cost the fast path).
                    self._head_timer = self.loop.call_later(
                        self.LIMITS.header_timeout_s, self._head_timed_out
                    )
            if self._too_large and not self.transport.is_closing():
                self.CLOSED.note("request head too large", self.loop)
                self._cancel_head_timer()
                self.transport.write(_too_large_response(self.LIMITS.max_header_bytes))
                self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_done = False
            self._head_bytes = 0
            self._since = next(_ACTIVITY)
            self._cancel_head_timer()

        def on_headers_complete(self) -> None:
            self._head_done = True
            self._cancel_head_timer()
            # Measured only when this read and the head's earlier ones could hold too much.
            if self._head_bytes + self._read > self.LIMITS.max_header_bytes:
                size = len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
                if size > self.LIMITS.max_header_bytes:  # a large head that came in one read
                    self._too_large = True
                    return
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self._too_large:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if not self._too_large:
                super().on_message_complete()

        def on_response_complete(self) -> None:
            self._since = next(_ACTIVITY)
            super().on_response_complete()

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if not self._head_done and not self.transport.is_closing():
                self.CLOSED.note("request head too slow", self.loop)
                self.transport.close()

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

    return LimitedHttpToolsProtocol


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments of :func:`uvicorn.run` (or :class:`uvicorn.Config`) that enforce the
    connection limits of ``settings``."""
    limits = ConnectionLimits.of(settings)
    keep_alive = max(1, math.ceil(limits.idle_timeout_s))
    try:
        protocol = limited_protocol(limits)
    except ImportError:
        # Without httptools, uvicorn's h11 protocol bounds the head itself; idle connections
        # are then closed only after an answer, and the cap answers 503 instead of making room.
        log.warning("httptools is not installed: h11 serves, with weaker connection limits")
        return {
            "http": "h11",
            "timeout_keep_alive": keep_alive,
            "h11_max_incomplete_event_size": limits.max_header_bytes,
            "limit_concurrency": limits.max_connections,
        }
    log.info(
        "connection limits: %d connections, idle %g s, request head %g s and %d bytes",
        limits.max_connections,
        limits.idle_timeout_s,
        limits.header_timeout_s,
        limits.max_header_bytes,
    )
    return {"http": protocol, "timeout_keep_alive": keep_alive}
