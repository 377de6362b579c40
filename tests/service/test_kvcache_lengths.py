"""``/v1/best`` with ``kv_lengths``: without it a cache call is answered as the op and the
exported header run it (the nearest problem of either pattern in the call's phase, a tie going
to the mixed one), with it only by that pattern; the answer says which pattern
answered; ``kv_lengths`` without ``kv_page`` or of an unknown value is a 422 naming it; the
result listing carries each cache row's pattern."""

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
#: The decode shape asked for; paged winners of both patterns were timed at it.
DECODE = {"nq": 1, "nk": 8192, "batch": 8, "heads": 32, "kv_heads": 8}
#: One long sequence (no mix at batch 1): a paged winner timed full only.
SINGLE = {**DECODE, "nk": 131072, "batch": 1}
PREFILL = {**DECODE, "nq": 256}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """Paged (16): full and mixed decode winners at DECODE, a full one at SINGLE and a full
    prefill one; contiguous: a full decode winner only; and a dense decode winner."""
    store: Store = make_store(tmp_path)
    base = Problem(gpu=H200.name, d=128, n=1, nk=8192, batch=8, heads=32, kv_heads=8)
    config = SplitKvConfig(128, "fp16", False)
    record_ok(store, base, config, 0.030)
    paged = dataclasses.replace(base, kv_page=16)
    record_ok(store, paged, dataclasses.replace(config, splits=32, kvcache=True, page=16), 0.050)
    mixed = dataclasses.replace(paged, kv_lengths="mixed")
    record_ok(store, mixed, dataclasses.replace(config, splits=8, kvcache=True, page=16), 0.080)
    single = dataclasses.replace(paged, nk=131072, batch=1)
    record_ok(store, single, dataclasses.replace(config, splits=64, kvcache=True, page=16), 0.1)
    prefill = dataclasses.replace(paged, n=256)
    record_ok(store, prefill, dataclasses.replace(config, splits=2, kvcache=True, page=16), 0.2)
    contiguous = dataclasses.replace(base, kv_page=0)
    record_ok(store, contiguous, dataclasses.replace(config, splits=4, kvcache=True), 0.020)
    yield store
    store.close()


def _best(client: TestClient, shape: dict[str, int] | None = None, **params: object) -> Any:
    return client.get("/v1/best", params={"gpu": "H200", "d": 128, **(shape or DECODE), **params})


def _answered(r: Any) -> tuple[str, str, str, bool]:
    """(config name's tail, kv_lengths, measured kv_lengths, exact) of a 200."""
    assert r.status_code == 200, r.text
    body = r.json()
    tail = body["config"]["name"].split("_k", 1)[1]
    return tail, body["kv_lengths"], body["measured_problem"]["kv_lengths"], body["exact"]


def test_without_a_pattern_the_nearest_answers_and_a_tie_goes_to_mixed(
    client: TestClient,
) -> None:
    # Asked for full first: the page cache must not give the omitted request its body.
    assert _answered(_best(client, kv_page=16, kv_lengths="full")) == (
        "32_kvc_pg16", "full", "full", True,
    )  # fmt: skip
    # Both tuned at the shape: the mixed winner, as the op would run it, though slower on
    # the full batch.
    assert _answered(_best(client, kv_page=16)) == ("8_kvc_pg16", "mixed", "mixed", True)
    # Tuned full only at batch 1: that exact answer, not the mixed one of batch 8.
    assert _answered(_best(client, SINGLE, kv_page=16)) == ("64_kvc_pg16", "full", "full", True)
    # Tuned neither way: the nearer of the two (batch 8 over 4k keys is nearer DECODE).
    near = _best(client, {**DECODE, "nk": 4096}, kv_page=16)
    assert _answered(near) == ("8_kvc_pg16", "mixed", "mixed", False)
    assert near.json()["measured_problem"]["nk"] == 8192


def test_a_phase_without_mixed_problems_is_answered_full(client: TestClient) -> None:
    # The mixed problems are decode steps: a prefill call gets the full prefill winner.
    assert _answered(_best(client, PREFILL, kv_page=16)) == ("2_kvc_pg16", "full", "full", True)
    missing = _best(client, PREFILL, kv_page=16, kv_lengths="mixed")
    assert missing.status_code == 404, missing.text
    # A layout with no mixed problem: the full ones, without a word about it.
    assert _answered(_best(client, kv_page=0)) == ("4_kvc", "full", "full", True)


def test_an_explicit_pattern_nothing_was_tuned_on_is_a_404(client: TestClient) -> None:
    r = _best(client, kv_page=0, kv_lengths="mixed")
    assert r.status_code == 404
    detail = r.json()["detail"]
    assert "lengths mixed over" in detail and "--kv-page 0 --kv-lengths mixed" in detail


def test_exact_takes_either_pattern_at_the_shape(client: TestClient) -> None:
    assert _answered(_best(client, kv_page=16, exact="true")) == (
        "8_kvc_pg16", "mixed", "mixed", True,
    )  # fmt: skip
    assert _answered(_best(client, SINGLE, kv_page=16, exact="true"))[:2] == ("64_kvc_pg16", "full")
    r = _best(client, {**DECODE, "nk": 4096}, kv_page=16, exact="true")
    assert r.status_code == 404, r.text
    assert "exact=true: no nearest fallback" in r.json()["detail"]


def test_a_dense_answer_has_no_pattern(client: TestClient) -> None:
    body = _best(client).json()
    assert "kv_lengths" not in body and "kv_lengths" not in body["measured_problem"]


@pytest.mark.parametrize("value", ["mixed", "full"])
def test_a_pattern_without_a_layout_is_a_422(client: TestClient, value: str) -> None:
    r = _best(client, kv_lengths=value)
    assert r.status_code == 422, r.text
    body = r.json()
    assert [e["loc"] for e in body["errors"]] == [["query", "kv_lengths"]]
    assert body["detail"].startswith("kv_lengths: ") and "give kv_page too" in body["detail"]


@pytest.mark.parametrize("value", ["Mixed", "", "partial", "full,mixed"])
def test_an_unknown_pattern_is_a_422(client: TestClient, value: str) -> None:
    r = _best(client, kv_page=16, kv_lengths=value)
    assert r.status_code == 422, r.text
    assert [e["loc"] for e in r.json()["errors"]] == [["query", "kv_lengths"]]


def test_the_pattern_is_documented(client: TestClient) -> None:
    params = client.get("/openapi.json").json()["paths"]["/v1/best"]["get"]["parameters"]
    param = next(p for p in params if p["name"] == "kv_lengths")
    assert not param.get("required", False)
    enums = [s.get("enum") for s in param["schema"]["anyOf"] if "enum" in s]
    assert enums == [["full", "mixed"]]
    assert "Without kv_page: a 422" in param["description"]


def test_the_listing_carries_each_cache_rows_pattern(client: TestClient) -> None:
    items = client.get("/v1/results", params={"gpu": "H200"}).json()["items"]
    seen = sorted((str(i.get("kv_page")), str(i.get("kv_lengths"))) for i in items)
    assert seen == [("0", "full"), ("16", "full"), ("16", "full"), ("16", "full"),
                    ("16", "mixed"), ("None", "None")]  # fmt: skip
