"""``/v1/best``, ``/v1/best/varlen`` and ``/v1/results`` with attention variants: results
stored through the store answer their variant only, strictly parsed parameters, 422s naming
the argument, plain bodies unchanged, and the fast path leaving variants to the route."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from core.fa2_config import Fa2Config
from core.problem import Problem
from core.variant import PLAIN, Variant
from db.store import Store
from tests.support.factories import H200, make_config, make_report, ok_result
from tests.support.service_data import make_store

BOTH_PATHS = True
WINDOW = Variant(window_left=1024, window_right=0)
CAPPED = Variant(softcap=30.0, sinks=True)


def _config(variant: Variant, **kw: Any) -> Fa2Config:
    return dataclasses.replace(make_config(causal=True, **kw), **variant.needs)


def _record(store: Store, problem: Problem, config: Fa2Config, ms: float) -> None:
    gpu = store.upsert_gpu(H200)
    pid = store.problem_id(problem, gpu)
    build = store.record_build(make_report(config))
    store.record_measurement(pid, build, ok_result(ms, problem), H200)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A plain causal winner, a faster windowed one and a capped one with sinks at N=4096; a
    windowed varlen problem."""
    store: Store = make_store(tmp_path)
    base = Problem(gpu=H200.name, d=128, n=4096, causal=True)
    _record(store, base, _config(PLAIN), 2.0)
    _record(store, dataclasses.replace(base, variant=WINDOW), _config(WINDOW, br=64), 1.0)
    _record(store, dataclasses.replace(base, variant=CAPPED), _config(CAPPED, bc=32), 2.5)
    lens = (100, 4000)
    vl = Problem.varlen(H200.name, 128, lens, causal=True, variant=WINDOW)
    vl_config = Fa2Config(**{**_config(WINDOW).to_dict(), "varlen": True})
    _record(store, vl, vl_config, 0.5)
    yield store
    store.close()


def _best(client: TestClient, **params: object) -> Any:
    return client.get("/v1/best", params={"gpu": "H200", "d": 128, "causal": "true", **params})


def test_plain_requests_answer_as_before(client: TestClient) -> None:
    body = _best(client, n=4096).json()
    assert body["median_ms"] == 2.0 and not body["config"]["name"].endswith("_loc")
    assert "variant" not in body and "variant" not in body["measured_problem"]
    # A window past every key is none: the plain answer, word for word.
    assert _best(client, n=4096, window_left=8192).json() == body
    assert _best(client, n=4096, window_left=-1, sinks="false").json() == body


def test_a_window_is_answered_by_its_own_results(client: TestClient) -> None:
    r = _best(client, n=4096, window_left=1024)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["median_ms"] == 1.0 and body["config"]["name"].endswith("_loc")
    assert body["exact"] and body["shape"]["nq"] == 4096
    want = {"window_left": 1024, "window_right": 0, "chunk": 0, "softcap": 0.0, "sinks": False}
    assert body["variant"] == want and body["measured_problem"]["variant"] == want
    # Another window: the nearest tuned one answers, not exact; with exact, a 404.
    near = _best(client, n=4096, window_left=2000).json()
    assert not near["exact"] and near["measured_problem"]["variant"]["window_left"] == 1024
    assert near["variant"]["window_left"] == 2000
    assert _best(client, n=4096, window_left=2000, exact="true").status_code == 404
    # The same answer twice (the second from the cache).
    assert _best(client, n=4096, window_left=1024).json() == body


def test_softcap_and_sinks_match_by_switch(client: TestClient) -> None:
    body = _best(client, n=4096, softcap="50.5", sinks="true").json()
    assert body["config"]["name"].endswith("_cap_snk") and body["median_ms"] == 2.5
    assert body["variant"]["softcap"] == 50.5
    assert body["measured_problem"]["variant"]["softcap"] == 30.0
    missing = _best(client, n=4096, sinks="true")
    assert missing.status_code == 404 and "sinks" in missing.json()["detail"]


@pytest.mark.parametrize(
    ("params", "name"),
    [
        ({"window_left": "-2"}, "window_left"),
        ({"window_right": "4_0"}, "window_right"),
        ({"chunk": "-1"}, "chunk"),
        ({"softcap": "-1"}, "softcap"),
        ({"softcap": "inf"}, "softcap"),
        ({"softcap": "nan"}, "softcap"),
        ({"softcap": "+3"}, "softcap"),
        ({"softcap": "3_0"}, "softcap"),
        ({"softcap": "1e999"}, "softcap"),
        ({"sinks": "yes"}, "sinks"),
    ],
)
def test_bad_variant_values_are_a_422_naming_the_argument(
    client: TestClient, params: dict[str, str], name: str
) -> None:
    r = _best(client, n=4096, **params)
    assert r.status_code == 422, r.text
    assert name in r.text


def test_varlen_variant(client: TestClient) -> None:
    base = {"gpu": "H200", "d": 128, "causal": "true", "seqlens": "100,4000"}
    r = client.get("/v1/best/varlen", params={**base, "window_left": 1024})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["exact"] and body["variant"]["window_left"] == 1024
    assert body["measured_variant"]["window_left"] == 1024
    plain = client.get("/v1/best/varlen", params=base)
    assert plain.status_code == 404  # no plain varlen problem is tuned
    assert "variant" not in plain.text


def test_results_list_the_variant_of_variant_rows_only(client: TestClient) -> None:
    items = client.get("/v1/results").json()["items"]
    by_name = {i["config_name"]: i for i in items}
    plain = next(i for n, i in by_name.items() if not n.endswith(("_loc", "_cap_snk", "_vl")))
    assert "window_left" not in plain and "sinks" not in plain
    capped = next(i for n, i in by_name.items() if n.endswith("_cap_snk"))
    assert (capped["softcap"], capped["sinks"], capped["window_left"]) == (30.0, True, -1)
