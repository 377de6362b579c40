"""Issue 27: the connection limits of ``fa2tune serve`` (service/connections.py), on a real
uvicorn server on loopback with tiny limits: idle connections closed (also those that never
sent a byte), request heads bounded in size and time, a connection cap that makes room by
closing an idle connection, never one being answered.

No test times anything: each waits (with a generous deadline) for the server to act."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import anyio.to_thread
import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from core.settings import Settings
from service import connections
from service.connections import ConnectionLimits, connection_cap, limited_protocol
from tests.support.blocking import DEADLINE_S, wait_until

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

#: Short timeouts, for the tests of timeouts.
QUICK = ConnectionLimits(
    max_connections=50, idle_timeout_s=0.2, header_timeout_s=0.2, max_header_bytes=2048
)
#: Timeouts no test reaches, for the tests of the cap and of sizes.
PATIENT = ConnectionLimits(
    max_connections=3, idle_timeout_s=60.0, header_timeout_s=60.0, max_header_bytes=2048
)
BLOCK = b"GET /block HTTP/1.1\r\nHost: x\r\n\r\n"


class Server:
    """A uvicorn server on loopback with the limited protocol, in a thread, over an app
    whose ``GET /block`` answers only once the test releases it."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.release = threading.Event()
        self.in_flight = 0  # requests of /block waiting for the release
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            interface="asgi3",
            lifespan="off",
            log_level="warning",
            http=limited_protocol(limits),
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] == "/block":
            self.in_flight += 1
            await anyio.to_thread.run_sync(self.release.wait, DEADLINE_S)
        headers = [(b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})

    def start(self) -> Server:
        self._thread.start()
        wait_until(lambda: self._server.started)
        return self

    def stop(self) -> None:
        self.release.set()
        self._server.should_exit = True
        self._thread.join(timeout=DEADLINE_S)
        self._sock.close()

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=DEADLINE_S)


Start = Callable[[ConnectionLimits], Server]


@pytest.fixture
def start() -> Iterator[Start]:
    servers: list[Server] = []

    def started(limits: ConnectionLimits) -> Server:
        servers.append(Server(limits).start())
        return servers[-1]

    yield started
    for server in servers:
        server.stop()


def _closed_by_server(sock: socket.socket) -> bool:
    """Read until the server closes the connection (True), or the deadline passes (False)."""
    sock.settimeout(DEADLINE_S)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def _get(sock: socket.socket, path: str = "/") -> bytes:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return _answer(sock)


def _answer(sock: socket.socket) -> bytes:
    answer = b""
    sock.settimeout(DEADLINE_S)
    while not answer.endswith(b"ok"):
        chunk = sock.recv(65536)
        assert chunk, f"closed before answering: {answer!r}"
        answer += chunk
    return answer


def test_keep_alive_requests_are_served(start: Start) -> None:
    with start(PATIENT).connect() as sock:
        assert _get(sock).startswith(b"HTTP/1.1 200")
        assert _get(sock).startswith(b"HTTP/1.1 200")  # the same connection again


def test_a_connection_that_never_sends_is_closed(start: Start) -> None:
    with start(QUICK).connect() as sock:
        assert _closed_by_server(sock)


def test_an_idle_connection_is_closed_after_its_answer(start: Start) -> None:
    with start(QUICK).connect() as sock:
        _get(sock)
        assert _closed_by_server(sock)


def test_a_request_head_that_never_ends_is_closed(start: Start) -> None:
    with start(QUICK).connect() as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: a")  # and nothing more
        assert _closed_by_server(sock)


@pytest.mark.parametrize("pieces", [1, 8], ids=["one-read", "streamed"])
def test_a_large_request_head_is_a_json_431(start: Start, pieces: int) -> None:
    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 4096 + b"\r\n\r\n"
    with start(PATIENT).connect() as sock:
        if pieces == 1:
            sock.sendall(head)
        else:  # the head without its end, in pieces: refused before it is all in memory
            size = len(head) // pieces
            with contextlib.suppress(OSError):  # the server may close before the last
                for i in range(pieces - 1):
                    sock.sendall(head[i * size : (i + 1) * size])
        answer = b""
        sock.settimeout(DEADLINE_S)
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                answer += chunk
    status, _, rest = answer.partition(b"\r\n")
    assert status == b"HTTP/1.1 431 Request Header Fields Too Large", answer
    assert b"connection: close" in rest
    body = json.loads(rest.partition(b"\r\n\r\n")[2])
    assert body == {"detail": "request line and headers over 2048 bytes"}


def test_the_cap_closes_the_longest_idle_connection_for_a_new_one(start: Start) -> None:
    server = start(PATIENT)
    busy = server.connect()
    busy.sendall(BLOCK)
    wait_until(lambda: server.in_flight == 1)  # its request is being answered
    oldest_idle, idle = server.connect(), server.connect()
    _get(idle)  # answered, so more recently active than oldest_idle
    with server.connect() as new:  # the 4th: over the cap of 3
        assert _get(new).startswith(b"HTTP/1.1 200")
    assert _closed_by_server(oldest_idle)
    server.release.set()
    assert _answer(busy).startswith(b"HTTP/1.1 200")  # never closed for the others
    for sock in (busy, oldest_idle, idle):
        sock.close()


def test_when_no_connection_can_be_closed_the_new_one_is(start: Start) -> None:
    # Three requests in flight at the cap: a fourth connection has nobody to replace.
    server = start(PATIENT)
    socks = [server.connect() for _ in range(3)]
    for sock in socks:
        sock.sendall(BLOCK)
    wait_until(lambda: server.in_flight == 3)
    with server.connect() as extra:
        assert _closed_by_server(extra)
    server.release.set()
    for sock in socks:
        assert _answer(sock).startswith(b"HTTP/1.1 200")
        sock.close()


def test_the_cap_stays_under_the_descriptor_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections.resource, "getrlimit", lambda _: (1024, 4096))
    assert connection_cap(1000) == 1024 - connections.RESERVED_DESCRIPTORS
    assert connection_cap(100) == 100


def test_uvicorn_options_carry_the_settings() -> None:
    settings = Settings(
        service_max_connections=50,
        service_keep_alive_s=2.5,
        service_header_timeout_s=4.0,
        service_max_header_bytes=4096,
    )
    options: dict[str, Any] = connections.uvicorn_options(settings)
    assert ConnectionLimits(50, 2.5, 4.0, 4096) == options["http"].LIMITS
    assert options["timeout_keep_alive"] == 3  # uvicorn's own (an int); the protocol's is 2.5
    assert "limit_concurrency" not in options  # the cap makes room instead of answering 503
