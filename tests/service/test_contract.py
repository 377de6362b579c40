"""Issue 15: /v1/best?exact=true, the header's error responses as documented, and the Allow
header of a 405."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from db.store import Store
from service.main import create_app
from service.schemas import BestOut, ValidationErrorOut
from tests.support.service_data import H200_NS

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.mark.parametrize("fast_path", [True, False])
def test_best_exact(store: Store, fast_path: bool) -> None:
    with TestClient(create_app(store, fast_path=fast_path)) as c:
        base = {"gpu": "H200", "d": 128, "dtype": "fp16", "causal": "false"}
        for spelling in ("true", "1", "True"):
            r = c.get("/v1/best", params={**base, "n": H200_NS[1], "exact": spelling})
            assert r.status_code == 200, r.text
            body = BestOut.model_validate(r.json())
            assert body.exact and body.n == body.from_n == H200_NS[1]
        untuned = H200_NS[1] + 1
        r = c.get("/v1/best", params={**base, "n": untuned, "exact": "true"})
        assert r.status_code == 404
        detail = r.json()["detail"]
        assert f"N={untuned} not tuned" in detail and "exact=true" in detail
        assert ", ".join(map(str, H200_NS)) in detail
        # Without exact (or exact=false): the nearest tuned N, as before.
        for extra in ({}, {"exact": "false"}, {"exact": "0"}):
            r = c.get("/v1/best", params={**base, "n": untuned, **extra})
            assert r.status_code == 200 and r.json()["from_n"] == H200_NS[1]
        r = c.get("/v1/best", params={**base, "n": untuned, "exact": "maybe"})
        assert r.status_code == 422 and "exact" in r.json()["detail"]


def test_best_exact_documented(client: TestClient) -> None:
    params = client.get("/openapi.json").json()["paths"]["/v1/best"]["get"]["parameters"]
    exact = next(p for p in params if p["name"] == "exact")
    assert exact["in"] == "query" and exact["schema"]["type"] == "boolean"
    assert not exact.get("required", False)


def _resolve(schema: dict[str, Any], ref: str) -> dict[str, Any]:
    node: Any = schema
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    assert isinstance(node, dict)
    return node


def test_header_errors_documented_as_sent(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    responses = doc["paths"]["/v1/export/header"]["get"]["responses"]
    assert list(responses["200"]["content"]) == ["text/plain"]
    for code in ("404", "422", "503"):
        content = responses[code]["content"]
        assert list(content) == ["application/json"], code
        _resolve(doc, content["application/json"]["schema"]["$ref"])  # the ref exists
    # What the server sends for a 422 matches the documented media type and schema,
    # whether FastAPI or the route's own head-dim parsing rejects the request.
    for params in ({"gpu": ""}, {"gpu": "H200", "d": "12"}, {"gpu": "H200", "d": "x"}):
        r = client.get("/v1/export/header", params=params)
        assert r.status_code == 422, params
        assert r.headers["content-type"] == "application/json"
        ValidationErrorOut.model_validate(r.json())
    r = client.get("/v1/export/header", params={"gpu": "H200", "d": "12"})
    assert r.json()["errors"][0]["loc"] == ["query", "d"]
    r = client.get("/v1/export/header", params={"gpu": "RTX 9090"})
    assert r.status_code == 404 and r.headers["content-type"] == "application/json"


@pytest.mark.parametrize("method", ["OPTIONS", "PUT", "DELETE", "PATCH"])
def test_405_allow_lists_every_method_of_the_path(client: TestClient, method: str) -> None:
    r = client.request(method, "/v1/results")
    assert r.status_code == 405
    allowed = {m.strip() for m in r.headers["allow"].split(",")}
    documented = {m.upper() for m in client.get("/openapi.json").json()["paths"]["/v1/results"]}
    assert documented == {"GET", "POST"} == allowed
    assert r.json() == {"detail": "Method Not Allowed"}


def test_405_on_single_method_path(client: TestClient) -> None:
    r = client.request("OPTIONS", "/v1/best")
    assert r.status_code == 405 and r.headers["allow"] == "GET"


def test_404_is_unchanged(app: FastAPI) -> None:
    with TestClient(app) as c:
        r = c.get("/v1/nothing")
        assert r.status_code == 404 and r.json() == {"detail": "Not Found"}
