"""Issues 15 and 27: the slow endpoints run off the event loop, a bounded number at a time, and
cache what they render until the store changes (CPU only; nothing here depends on the
machine's speed: a slow render is a fake that blocks until the test releases it)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from db.store import Store
from service import render
from service.deps import ByteLRU
from service.header import export_header
from tests.support.blocking import DEADLINE_S, Blocker
from tests.support.service_data import set_token

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

BEST = {"gpu": "H200", "d": 128, "n": 4096}


def test_slow_export_does_not_block_best(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = Blocker(
        lambda store, gpu, ds=None, *, dtypes=None, kv_pages=(): f"// header for {gpu}\n"
    )
    monkeypatch.setattr(render, "export_header", slow)
    results: dict[int, Any] = {}

    def fetch(i: int, gpu: str) -> None:
        results[i] = client.get("/v1/export/header", params={"gpu": gpu})

    threads = [
        threading.Thread(target=fetch, args=(i, gpu))
        for i, gpu in enumerate(("H200", "A100-SXM4-80GB", "nvidia h200 "))
    ]
    for t in threads:
        t.start()
    assert slow.entered.wait(DEADLINE_S)
    # An export is rendering (and cannot finish before release): /v1/best answers meanwhile,
    # through the fast path and through the FastAPI route ("False").
    for params in (BEST, {**BEST, "causal": "False"}):
        r = client.get("/v1/best", params=params)
        assert r.status_code == 200, r.text
    assert slow.active == 1 and not slow.release.is_set()
    slow.release.set()
    for t in threads:
        t.join(timeout=DEADLINE_S)
    assert [results[i].status_code for i in range(3)] == [200, 200, 200]
    # service_threads (default 1): one export at a time; the others waited.
    assert slow.peak == 1
    # "H200" and "nvidia h200 " are two spellings of one header but were both rendered
    # (the header quotes the spelling); the same request again comes from the cache.
    rendered = len(slow.calls)
    r = client.get("/v1/export/header", params={"gpu": "H200"})
    assert r.status_code == 200 and r.text == "// header for H200\n"
    assert len(slow.calls) == rendered


def test_header_cache_follows_the_store(
    client: TestClient, app: FastAPI, dump_body: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = client.get("/v1/export/header", params={"gpu": "H200", "d": "128"})
    assert first.status_code == 200
    calls: list[int] = []

    def counting(*args: Any, **kwargs: Any) -> str:
        calls.append(1)
        return export_header(*args, **kwargs)

    monkeypatch.setattr(render, "export_header", counting)
    again = client.get("/v1/export/header", params={"gpu": "H200", "d": "128"})
    assert again.text == first.text and calls == []
    assert again.headers["content-type"] == "text/plain; charset=utf-8"
    # Other parameters: another entry.
    assert client.get("/v1/export/header", params={"gpu": "H200", "d": "64"}).status_code == 200
    assert len(calls) == 1
    # An ingest changes the store: the next request renders again.
    set_token(app, "t")
    r = client.post("/v1/results", content=dump_body, headers={"Authorization": "Bearer t"})
    assert r.status_code == 200 and r.json()["added"] > 0
    client.get("/v1/export/header", params={"gpu": "H200", "d": "128"})
    assert len(calls) == 2


def test_results_pages_cached_until_the_store_changes(
    client: TestClient, app: FastAPI, dump_body: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    store: Store = app.state.store
    calls: list[dict[str, Any]] = []
    real = store.results

    def counting(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("limit") == 5:  # not the index rebuild's reads
            calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "results", counting)
    page = client.get("/v1/results", params={"limit": 5, "offset": 2})
    assert page.status_code == 200 and page.headers["content-type"] == "application/json"
    assert client.get("/v1/results", params={"limit": 5, "offset": 2}).json() == page.json()
    assert len(calls) == 1
    client.get("/v1/results", params={"limit": 5, "offset": 3})
    assert len(calls) == 2
    total = page.json()["total"]
    set_token(app, "t")
    r = client.post("/v1/results", content=dump_body, headers={"Authorization": "Bearer t"})
    assert r.status_code == 200
    after = client.get("/v1/results", params={"limit": 5, "offset": 2}).json()
    assert len(calls) == 3 and after["total"] == total + r.json()["added"]


def test_results_page_renders_off_the_event_loop(
    client: TestClient, app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    store: Store = app.state.store
    slow = Blocker(store.results)
    monkeypatch.setattr(store, "results", slow)
    done = threading.Event()

    def fetch() -> None:
        assert client.get("/v1/results", params={"limit": 1000}).status_code == 200
        done.set()

    thread = threading.Thread(target=fetch)
    thread.start()
    assert slow.entered.wait(DEADLINE_S)
    assert client.get("/v1/best", params={**BEST, "exact": "1"}).status_code == 200
    assert not done.is_set()  # answered while the page was still being read
    slow.release.set()
    thread.join(timeout=DEADLINE_S)
    assert done.is_set()


def test_byte_lru_bounds_its_size() -> None:
    cache = ByteLRU(10)
    cache.put("a", b"1234")
    cache.put("b", b"1234")
    assert cache.get("a") == b"1234"  # now the most recent
    cache.put("c", b"1234")  # evicts b
    assert cache.get("b") is None and cache.get("a") and cache.get("c")
    cache.put("big", b"x" * 11)  # larger than the whole cache: not kept
    assert cache.get("big") is None and len(cache) == 2
