"""Issue 15: POST /v1/results refuses a body over the cap with 413 while streaming it, without
reading the rest, and holds one body at a time."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.types import Message, Scope

from core.settings import Settings, get_settings
from db.dump_fields import MAX_ERROR_CHARS, MAX_EXTRA_CHARS
from db.dump_format import TransferError
from service.deps import get_app_settings
from service.routers import results as results_router
from tests.support.service_data import set_token

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

CHUNK = 64 * 1024
CAP = 256 * 1024  # four chunks


def _configure(app: FastAPI, **more: Any) -> None:
    update = {"ingest_token": "t", "ingest_max_bytes": CAP, **more}
    settings = get_settings().model_copy(update=update)
    app.dependency_overrides[get_app_settings] = lambda: settings


def _post(
    app: FastAPI,
    chunks: int,
    *,
    content_length: int | None,
    then: Callable[[], Awaitable[Message]] | None = None,
) -> tuple[int, int, bytes, list[tuple[bytes, bytes]]]:
    """POST ``chunks`` chunks straight to the ASGI app, the last one ending the body, or,
    with ``then``, not ending it: what ``then`` gives comes next. Returns (status, chunks it
    read, body, response headers)."""
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
            return await then() if then is not None else {"type": "http.disconnect"}
        read[0] += 1
        more = then is not None or read[0] < chunks  # with ``then``, the body goes on
        return {"type": "http.request", "body": b" " * CHUNK, "more_body": more}

    async def send(message: Message) -> None:
        sent.append(message)

    anyio.run(app, scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], read[0], body, list(start["headers"])


def test_streamed_body_over_the_cap_is_413_without_reading_it_all(app: FastAPI) -> None:
    _configure(app)
    status, read, body, headers = _post(app, 1000, content_length=None)  # 64 MB, chunked
    assert status == 413 and b"body over" in body
    assert read == CAP // CHUNK + 1  # stopped at the first chunk past the cap
    assert (b"connection", b"close") in headers  # the rest is never read


def test_declared_length_over_the_cap_is_413_before_reading(app: FastAPI) -> None:
    _configure(app)
    status, read, _, headers = _post(app, 1000, content_length=1000 * CHUNK)
    assert status == 413 and read == 0 and (b"connection", b"close") in headers


def test_body_under_the_cap_is_read_and_parsed(app: FastAPI) -> None:
    _configure(app)
    # Four chunks of blanks: within the cap, so read whole, then rejected as not a file.
    status, read, body, _ = _post(app, CAP // CHUNK, content_length=None)
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


def test_a_body_slower_than_its_deadline_is_a_408(app: FastAPI) -> None:
    _configure(app, ingest_body_timeout_s=0.05)
    never = anyio.Event()

    async def stalls() -> Message:  # a client that sent two chunks and then nothing
        await never.wait()
        raise AssertionError("not reached")

    status, read, body, headers = _post(app, 2, content_length=None, then=stalls)
    assert status == 408 and read == 2
    assert json.loads(body)["detail"].startswith("body not received within 0.05 s")
    assert (b"connection", b"close") in headers


def test_a_client_gone_mid_body_is_one_log_line(
    app: FastAPI, caplog: pytest.LogCaptureFixture
) -> None:
    _configure(app)

    async def gone() -> Message:
        return {"type": "http.disconnect"}

    with caplog.at_level(logging.INFO):
        status, read, _, _ = _post(app, 2, content_length=CAP, then=gone)
    assert read == 2 and status == 400  # (uvicorn drops it: nobody is there to read it)
    lines = [r for r in caplog.records if "disconnected" in r.getMessage()]
    assert [r.getMessage() for r in lines] == [
        "POST /v1/results: the client disconnected after 131072 bytes; nothing written"
    ]
    assert not any(r.exc_info for r in caplog.records)  # no traceback anywhere


def _one_measurement(dump_body: bytes, **changes: Any) -> bytes:
    doc = json.loads(dump_body)
    doc["measurements"] = doc["measurements"][:1]
    doc["measurements"][0].update(changes)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"created_at": "9999-01-01T00:00:00Z"}, "measurements.0.created_at: Value error, "),
        ({"error": "x" * (MAX_ERROR_CHARS + 1)}, "error: String should have at most 16384"),
        ({"extra": {"log": "y" * MAX_EXTRA_CHARS}}, "at most 16384 characters as compact JSON"),
    ],
    ids=["year-9999", "error-too-long", "extra-too-long"],
)
def test_ingest_refuses_the_future_and_huge_texts(
    client: TestClient, app: FastAPI, dump_body: bytes, changes: dict[str, Any], message: str
) -> None:
    set_token(app, "t")
    body = _one_measurement(dump_body, **changes)
    r = client.post("/v1/results", content=body, headers={"Authorization": "Bearer t"})
    assert r.status_code == 422, r.text
    assert message in r.json()["detail"]
    if "created_at" in changes:
        assert "is in the future" in r.json()["detail"]
    assert client.get("/v1/gpus").json() == client.get("/v1/gpus").json()  # nothing written
    ok = _one_measurement(dump_body)
    r = client.post("/v1/results", content=ok, headers={"Authorization": "Bearer t"})
    assert r.status_code == 200 and r.json()["added"] == 1
