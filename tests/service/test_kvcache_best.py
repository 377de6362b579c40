"""``/v1/best`` with ``kv_page``: a KV-cache layout is answered by the cache problems of that
layout only, a dense request by dense ones only (on the fast path and the route), a bad page a
422 naming ``kv_page``, and the result listing carries the layout."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from core.problem import Problem
from core.splitkv_config import SplitKvConfig
from db.store import Store
from tests.support.factories import H200, record_ok
from tests.support.service_data import make_store

BOTH_PATHS = True
DECODE = {"nq": 1, "nk": 8192, "batch": 8, "heads": 32, "kv_heads": 8}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A dense decode winner and a paged (16) one of the same shape, a contiguous one at 4096."""
    store: Store = make_store(tmp_path)
    base = Problem(gpu=H200.name, d=128, n=1, nk=8192, batch=8, heads=32, kv_heads=8)
    config = SplitKvConfig(128, "fp16", False)
    record_ok(store, base, config, 0.030)
    paged = dataclasses.replace(config, splits=32, kvcache=True, page=16)
    record_ok(store, dataclasses.replace(base, kv_page=16), paged, 0.050)
    contiguous = dataclasses.replace(config, splits=8, kvcache=True)
    record_ok(store, dataclasses.replace(base, nk=4096, kv_page=0), contiguous, 0.020)
    yield store
    store.close()


def _best(client: TestClient, **params: object) -> Any:
    return client.get("/v1/best", params={"gpu": "H200", "d": 128, **DECODE, **params})


def test_a_dense_request_never_sees_cache_results(client: TestClient) -> None:
    body = _best(client).json()
    assert body["median_ms"] == 0.030 and "_kvc" not in body["config"]["name"]
    assert "kv_page" not in body and "kv_page" not in body["measured_problem"]


def test_a_layout_is_answered_by_its_own_results(client: TestClient) -> None:
    r = _best(client, kv_page=16)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["config"]["name"].endswith("_k32_kvc_pg16") and body["exact"]
    assert body["kv_page"] == 16 and body["measured_problem"]["kv_page"] == 16
    # The contiguous layout: its nearest tuned shape (4096 keys), never the paged result.
    near = _best(client, kv_page=0).json()
    assert near["config"]["name"].endswith("_k8_kvc") and not near["exact"]
    assert near["measured_problem"]["nk"] == 4096 and near["kv_page"] == 0
    assert _best(client, kv_page=0, exact="true").status_code == 404
    # A layout nothing was tuned for: a 404 that says how to tune it.
    missing = _best(client, kv_page=64)
    assert missing.status_code == 404 and "--kv-page 64" in missing.json()["detail"]
    # n alone with a layout is a shape answer, at the campaign's N x N (a decode step here).
    alone = client.get("/v1/best", params={"gpu": "H200", "d": 128, "n": 1, "kv_page": 16})
    assert alone.status_code == 200 and alone.json()["shape"]["batch"] == 2
    assert not alone.json()["exact"] and alone.json()["kv_page"] == 16


@pytest.mark.parametrize("page", ["3", "-1", "8192", "16.0", "x", "+16"])
def test_a_bad_page_is_a_422_naming_it(client: TestClient, page: str) -> None:
    r = _best(client, kv_page=page)
    assert r.status_code == 422, r.text
    errors = r.json()["errors"]
    assert [e["loc"] for e in errors] == [["query", "kv_page"]], errors


def test_the_listing_carries_the_layout(client: TestClient) -> None:
    items = client.get("/v1/results", params={"gpu": "H200"}).json()["items"]
    assert sorted(str(i.get("kv_page")) for i in items) == ["0", "16", "None"]
