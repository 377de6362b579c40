"""Issue 15: POST /v1/results refuses a body over the cap with 413 while streaming it, without
reading the rest, and holds one body at a time."""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.types import Message, Scope

from core.settings import Settings, get_settings
from db.dump_format import TransferError
from service.deps import get_app_settings
from service.routers import results as results_router

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

CHUNK = 64 * 1024
CAP = 256 * 1024  # four chunks


def _configure(app: FastAPI) -> None:
    settings = get_settings().model_copy(update={"ingest_token": "t", "ingest_max_bytes": CAP})
    app.dependency_overrides[get_app_settings] = lambda: settings


def _post(app: FastAPI, chunks: int, *, content_length: int | None) -> tuple[int, int, bytes]:
    """POST ``chunks`` chunks straight to the ASGI app; (status, chunks it read, body)."""
    read = [0]
    sent: list[Message] = []
    headers = [(b"authorization", b"Bearer t"), (b"content-type", b"application/json")]
    if content_length is not None:
        headers.append((b"content-length", str(content_length).encode()))
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/results",
        "raw_path": b"/v1/results",
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
        "state": {},
    }

    async def receive() -> Message:
        if read[0] >= chunks:
            return {"type": "http.disconnect"}
        read[0] += 1
        return {"type": "http.request", "body": b" " * CHUNK, "more_body": read[0] < chunks}

    async def send(message: Message) -> None:
        sent.append(message)

    anyio.run(app, scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], read[0], body


def test_streamed_body_over_the_cap_is_413_without_reading_it_all(app: FastAPI) -> None:
    _configure(app)
    status, read, body = _post(app, 1000, content_length=None)  # 64 MB, chunked
    assert status == 413 and b"body over" in body
    assert read == CAP // CHUNK + 1  # stopped at the first chunk past the cap


def test_declared_length_over_the_cap_is_413_before_reading(app: FastAPI) -> None:
    _configure(app)
    status, read, _ = _post(app, 1000, content_length=1000 * CHUNK)
    assert status == 413 and read == 0


def test_body_under_the_cap_is_read_and_parsed(app: FastAPI) -> None:
    _configure(app)
    # Four chunks of blanks: within the cap, so read whole, then rejected as not a file.
    status, read, body = _post(app, CAP // CHUNK, content_length=None)
    assert status == 422 and read == CAP // CHUNK, body


def test_ingest_cap_setting_bounds() -> None:
    assert Settings().ingest_max_bytes == 8 * 1024 * 1024
    with pytest.raises(ValueError):
        Settings(ingest_max_bytes=2**40)


def test_one_ingest_at_a_time(app: FastAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    _configure(app)
    active, peak = [0], [0]
    lock = threading.Lock()

    def slow_parse(body: bytes) -> Any:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.3)
        with lock:
            active[0] -= 1
        raise TransferError("not a results file")

    monkeypatch.setattr(results_router, "parse_dump", slow_parse)
    with TestClient(app) as client:
        codes: list[int] = []

        def post() -> None:
            r = client.post("/v1/results", content=b"{}", headers={"Authorization": "Bearer t"})
            codes.append(r.status_code)

        threads = [threading.Thread(target=post) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    assert codes == [422, 422, 422] and peak[0] == 1
