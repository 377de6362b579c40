"""Issue 27: every slow endpoint group serves a few requests at a time, queues a bounded number
and refuses the rest at once (429), or after waiting too long (503), with ``Retry-After`` and
a JSON body. No test depends on the machine's speed: the slow work blocks until released."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from core.settings import Settings
from db.store import Store
from service.admission import LOOKUP_SLOTS_PER_SLOT, Admission, Admissions
from service.main import create_app
from tests.support.blocking import DEADLINE_S, Blocker, wait_until

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


# ------------------------------------------------------------------------- Admission


def test_queue_full_is_refused_at_once_and_slots_pass_in_order() -> None:
    async def go() -> None:
        gate = Admission("pages", slots=1, queue=1, wait_s=60)
        assert await gate.enter() is None  # a: served
        admitted = anyio.Event()

        async def b() -> None:
            assert await gate.enter() is None
            admitted.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(b)
            await anyio.wait_all_tasks_blocked()
            assert gate.waiting == 1
            refusal = await gate.enter()  # c: the queue is full
            assert refusal is not None and refusal.status == 429
            assert refusal.retry_after_s == 1 and "1 served and 1 waiting" in refusal.detail
            gate.leave()  # a leaves: its slot passes to b
        assert admitted.is_set() and gate.active == 1 and gate.waiting == 0
        gate.leave()
        assert gate.active == 0 and gate.refused == 1

    anyio.run(go)


def test_waiting_too_long_is_refused_with_503() -> None:
    async def go() -> None:
        gate = Admission("headers", slots=1, queue=4, wait_s=0.01)
        assert await gate.enter() is None
        refusal = await gate.enter()  # nobody leaves: the wait runs out
        assert refusal is not None and refusal.status == 503
        assert refusal.retry_after_s == 1 and "not served within 0.01 s" in refusal.detail
        assert gate.waiting == 0 and gate.active == 1
        response = refusal.response()
        assert response.headers["retry-after"] == "1"
        assert response.headers["content-type"] == "application/json"

    anyio.run(go)


def test_a_cancelled_waiter_leaves_the_queue() -> None:
    async def go() -> None:
        gate = Admission("ingests", slots=1, queue=1, wait_s=60)
        assert await gate.enter() is None
        with anyio.move_on_after(0.01):
            await gate.enter()
        assert gate.waiting == 0
        gate.leave()
        assert gate.active == 0

    anyio.run(go)


def test_admission_limits_are_checked() -> None:
    with pytest.raises(ValueError):
        Admission("x", slots=0, queue=1, wait_s=1)
    with pytest.raises(ValueError):
        Admission("x", slots=1, queue=-1, wait_s=1)


# ------------------------------------------------------------------------- over HTTP


def _app(store: Store, settings: Settings, **limits: Any) -> FastAPI:
    return create_app(store, settings=settings.model_copy(update=limits))


def _blocked_pages(app: FastAPI, monkeypatch: pytest.MonkeyPatch) -> Blocker:
    store: Store = app.state.store
    slow = Blocker(store.results)
    monkeypatch.setattr(store, "results", slow)
    return slow


def test_results_queue_full_is_a_json_429_and_other_groups_still_answer(
    store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = _app(store, settings, service_threads=1, service_queue=1, service_queue_wait_s=60.0)
    with TestClient(app) as client:
        slow = _blocked_pages(app, monkeypatch)
        answers: list[int] = []

        def page(offset: int) -> None:
            answers.append(client.get("/v1/results", params={"offset": offset}).status_code)

        threads = [threading.Thread(target=page, args=(i,)) for i in (0, 1)]
        threads[0].start()
        assert slow.entered.wait(DEADLINE_S)  # the first page is being read
        threads[1].start()
        admission = app.state.slow.admissions.results
        wait_until(lambda: admission.waiting == 1)  # the second waits at the door
        r = client.get("/v1/results", params={"offset": 2})
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] == "1"
        assert r.headers["content-type"] == "application/json"
        assert "too many requests for result pages" in r.json()["detail"]
        # Other endpoints and the other groups are not held up by the full queue.
        assert client.get("/v1/gpus").status_code == 200
        assert client.post("/v1/results", content=b"{}").status_code == 403  # no token set
        slow.release.set()
        for t in threads:
            t.join(timeout=DEADLINE_S)
    assert answers == [200, 200] and slow.peak == 1


def test_results_wait_past_the_limit_is_a_json_503(
    store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = _app(store, settings, service_threads=1, service_queue=4, service_queue_wait_s=0.05)
    with TestClient(app) as client:
        slow = _blocked_pages(app, monkeypatch)
        first = threading.Thread(target=lambda: client.get("/v1/results"))
        first.start()
        assert slow.entered.wait(DEADLINE_S)
        r = client.get("/v1/results", params={"offset": 1})  # waits 0.05 s, then refused
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] == "1"
        assert "result pages busy" in r.json()["detail"]
        slow.release.set()
        first.join(timeout=DEADLINE_S)
    assert len(slow.calls) == 1  # the refused request read nothing


def test_queue_zero_refuses_whatever_finds_the_slots_taken(
    store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = _app(store, settings, service_threads=1, service_queue=0)
    with TestClient(app) as client:
        slow = _blocked_pages(app, monkeypatch)
        first = threading.Thread(target=lambda: client.get("/v1/results"))
        first.start()
        assert slow.entered.wait(DEADLINE_S)
        assert client.get("/v1/results", params={"offset": 1}).status_code == 429
        slow.release.set()
        first.join(timeout=DEADLINE_S)


def test_the_refusals_are_documented(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path, method in (
        ("/v1/results", "get"),
        ("/v1/results", "post"),
        ("/v1/export/header", "get"),
    ):
        responses = paths[path][method]["responses"]
        assert {"429", "503"} <= responses.keys(), (path, method)
        assert "application/json" in responses["429"]["content"]


@pytest.mark.parametrize(
    ("method", "path", "query", "group"),
    [
        ("GET", "/v1/best", b"gpu=H200&d=128&n=4096", None),  # the index answers: no gate
        ("GET", "/v1/best", b"gpu=H200&d=128&nq=1&nk=8192&batch=8", None),
        ("GET", "/v1/best", b"gpu=H200&d=128&n=4096&window_left=128", "lookups"),
        ("GET", "/v1/best", b"gpu=H200&d=128&n=4096&window%5Fright=0", "lookups"),  # unquoted
        ("GET", "/v1/best", b"sinks&gpu=H200", "lookups"),
        ("GET", "/v1/best/varlen", b"gpu=H200&d=128&seqlens=100,200", "lookups"),
        ("GET", "/v1/results", b"", "results"),
        ("POST", "/v1/results", b"", "ingest"),
        ("GET", "/v1/export/header", b"gpu=H200", "export"),
        ("GET", "/v1/gpus", b"", None),
    ],
)
def test_which_requests_are_admitted_by_a_group(
    method: str, path: str, query: bytes, group: str | None
) -> None:
    admissions = Admissions(slots=1, queue=2, wait_s=1.0)
    found = admissions.of(method, path, query)
    assert found is (getattr(admissions, group) if group is not None else None)
    assert admissions.lookups.slots == LOOKUP_SLOTS_PER_SLOT


def test_store_lookups_are_bounded_and_leave_indexed_answers_alone(
    store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Packed-batch questions read the store; with every lookup slot taken and no queue, one
    more is refused at once, while /v1/best of plain attention (the index) still answers."""
    app = _app(store, settings, service_threads=1, service_queue=0)
    with TestClient(app) as client:
        slow = Blocker(store.best_varlen)
        monkeypatch.setattr(store, "best_varlen", slow)
        ask = {"gpu": "H200", "d": 128, "seqlens": "100,2000"}
        answers: list[int] = []

        def varlen() -> None:
            answers.append(client.get("/v1/best/varlen", params=ask).status_code)

        threads = [threading.Thread(target=varlen) for _ in range(LOOKUP_SLOTS_PER_SLOT)]
        for t in threads:
            t.start()
        wait_until(lambda: slow.active == LOOKUP_SLOTS_PER_SLOT)
        refused = client.get("/v1/best/varlen", params=ask)
        assert refused.status_code == 429 and "store lookups" in refused.json()["detail"]
        windowed = client.get("/v1/best", params={"gpu": "H200", "d": 128, "n": 4096,
                                                  "window_left": 64})  # fmt: skip
        assert windowed.status_code == 429
        assert client.get("/v1/best", params={"gpu": "H200", "d": 128, "n": 4096}).status_code in (
            200, 404)  # fmt: skip
        slow.release.set()
        for t in threads:
            t.join(timeout=DEADLINE_S)
    assert len(answers) == LOOKUP_SLOTS_PER_SLOT and 429 not in answers
    assert slow.peak == LOOKUP_SLOTS_PER_SLOT
