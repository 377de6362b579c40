"""The HTTP API against a throwaway SQLite database seeded through the Store API."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from core.problem import Problem
from db import transfer
from db.store import Store
from service import main as service_main
from service.main import create_app
from service.schemas import BestOut, GpuListOut, HealthOut, ResultPageOut
from tests.support.factories import ok_result, seed_measurement
from tests.support.service_data import A100, H200_NS, Seeded, set_token

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def best(client: TestClient, **params: Any) -> Any:
    return client.get("/v1/best", params={"dtype": "fp16", "causal": False, **params})


# ------------------------------------------------------------------------------ /v1/best


def test_best_exact_hit(client: TestClient, store: Store, seeded: Seeded) -> None:
    r = best(client, gpu="NVIDIA H200", d=128, n=4096)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    body = BestOut.model_validate(r.json())
    winner = seeded.winners[("NVIDIA H200", 128, "fp16", False, 4096)]
    assert body.exact is True and body.from_n == 4096 and body.n == 4096
    assert body.config.name == winner.name
    assert body.config.br == winner.br and body.config.swizzle is winner.swizzle
    assert body.config.smem_bytes == winner.smem_bytes
    expected = store.best("H200", 128, 4096)
    assert expected is not None
    assert body.median_ms == pytest.approx(expected.median_ms)
    assert body.tflops == pytest.approx(expected.tflops)
    prov = body.provenance
    assert prov.gpu == "NVIDIA H200" and prov.arch == "sm_90"
    assert prov.driver_version == expected.driver_version
    assert prov.cuda_version == expected.cuda_version
    assert prov.nvcc_version.startswith("Cuda compilation tools")
    assert prov.source_hash == expected.source_hash
    assert prov.measured_at == expected.measured_at


def test_best_body_equals_model_rendering(client: TestClient, store: Store) -> None:
    # The pre-rendered fast path must say exactly what the response model would.
    for n in (4096, 3000, 7):
        r = best(client, gpu="H200", d=128, n=n)
        expected = store.best_or_nearest("H200", 128, n)
        assert expected is not None
        assert r.json() == BestOut.of(expected, n).model_dump(mode="json")


@pytest.mark.parametrize("gpu", ["H200", "h200", "NVIDIA H200", "nvidia  h200", " NVIDIA H200 "])
def test_best_gpu_spellings(client: TestClient, gpu: str) -> None:
    r = best(client, gpu=gpu, d=64, n=1024)
    assert r.status_code == 200, r.text
    assert r.json()["gpu"] == "NVIDIA H200"


@pytest.mark.parametrize(
    ("n", "from_n"),
    [
        (3000, 4096),  # above sqrt(1024 * 4096) = 2048
        (1500, 1024),  # below 2048
        (2048, 4096),  # the geometric midpoint itself: a tie goes to the larger N
        (10, 512),  # below every tuned N
        (10**6, 16384),  # above every tuned N
        (700, 512),  # sqrt(512 * 1024) = 724
        (730, 1024),
    ],
)
def test_best_fallback_nearest_n(client: TestClient, n: int, from_n: int) -> None:
    r = best(client, gpu="H200", d=64, n=n)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["exact"] is False
    assert body["from_n"] == from_n and body["n"] == n
    assert body["measured_problem"]["n"] == from_n


def test_best_agrees_with_store_best_or_nearest(client: TestClient, store: Store) -> None:
    ns = sorted({1, 2, 100, 511, 512, 513, 723, 724, 725, 2047, 2048, 2049, 8192, 8193, 2**20}
                | set(H200_NS))  # fmt: skip
    for d, dtype, causal in [(64, "fp16", False), (128, "fp16", True), (128, "bf16", False)]:
        for n in ns:
            expected = store.best_or_nearest("H200", d, n, dtype, causal)
            assert expected is not None
            body = best(client, gpu="H200", d=d, n=n, dtype=dtype, causal=causal).json()
            assert (body["from_n"], body["exact"]) == (expected.n, expected.exact), (d, n)
            assert body["config"]["name"] == expected.config.name


def test_best_never_returns_failed_measurements(client: TestClient, seeded: Seeded) -> None:
    # Every problem has a faster WRONG_RESULT; the answer must be the OK winner.
    for (gpu, d, dtype, causal, n), winner in seeded.winners.items():
        body = best(client, gpu=gpu, d=d, n=n, dtype=dtype, causal=causal).json()
        assert body["config"]["name"] == winner.name
        assert math.isfinite(body["max_abs_err"])


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"gpu": "RTX 9090", "d": 64, "n": 1024}, "no results for GPU 'RTX 9090'"),
        ({"gpu": "H200", "d": 32, "n": 1024}, "no results for D=32 on NVIDIA H200"),
        ({"gpu": "H200", "d": 64, "n": 1024, "causal": True}, "D=64 fp16 causal"),
        ({"gpu": "A100-SXM4-80GB", "d": 64, "n": 64, "dtype": "bf16"}, "tuned for D=64"),
    ],
)
def test_best_404(client: TestClient, params: dict[str, Any], needle: str) -> None:
    r = best(client, **params)
    assert r.status_code == 404
    assert needle in r.json()["detail"]


def test_best_404_lists_known(client: TestClient) -> None:
    detail = best(client, gpu="V100", d=64, n=1).json()["detail"]
    assert "NVIDIA H200" in detail and "NVIDIA A100-SXM4-80GB" in detail
    detail = best(client, gpu="H200", d=256, n=1).json()["detail"]
    assert "tuned head dims: 64, 128" in detail


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"gpu": "H200", "d": 64, "n": 1024, "dtype": "fp8"}, "dtype"),
        ({"gpu": "H200", "d": "abc", "n": 1024}, "d"),
        ({"gpu": "H200", "d": 64, "n": 0}, "n"),
        ({"gpu": "H200", "d": 64, "n": -5}, "n"),
        ({"gpu": "H200", "d": 64, "n": 10**12}, "n"),
        ({"gpu": "H200", "d": 64, "n": "1e3"}, "n"),
        ({"gpu": "H200", "d": 12, "n": 1024}, "d"),
        ({"gpu": "H200", "d": 264, "n": 1024}, "d"),
        ({"gpu": "H200", "d": 512, "n": 1024}, "d"),
        ({"gpu": "", "d": 64, "n": 1024}, "gpu"),
        ({"gpu": "   ", "d": 64, "n": 1024}, "gpu"),
        ({"gpu": "x" * 200, "d": 64, "n": 1024}, "gpu"),
        ({"gpu": "H200", "d": 64, "n": 1024, "causal": "maybe"}, "causal"),
        ({"d": 64, "n": 1024}, "gpu"),
        ({"gpu": "H200", "n": 1024}, "d"),
        ({"gpu": "H200", "d": 64}, "n"),
    ],
)
def test_best_422(client: TestClient, params: dict[str, Any], field: str) -> None:
    r = client.get("/v1/best", params=params)
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["detail"].startswith(f"{field}: "), body["detail"]
    assert body["errors"] and body["errors"][0]["loc"][-1] == field
    assert len(body["detail"]) < 300  # long inputs are shortened, not echoed


def test_best_422_head_dim_message(client: TestClient) -> None:
    detail = client.get("/v1/best", params={"gpu": "H200", "d": 12, "n": 1}).json()["detail"]
    assert detail == "d: must be a multiple of 8 from 8 to 256 (got 12)"


# ----------------------------------------------------------------- /v1/gpus, /healthz


def test_gpus(client: TestClient) -> None:
    r = client.get("/v1/gpus")
    assert r.status_code == 200
    items = {g.name: g for g in GpuListOut.model_validate(r.json()).items}
    assert set(items) == {"NVIDIA H200", A100.name}
    h200 = items["NVIDIA H200"]
    assert h200.compute_capability == "9.0" and h200.ok_measurements == 22
    sets = {(t.d, t.dtype, t.causal): t.ns for t in h200.tuned}
    assert sets[(64, "fp16", False)] == list(H200_NS)
    assert sets[(128, "fp16", True)] == [1024, 4096]
    assert sets[(128, "bf16", False)] == [4096]


def test_healthz(client: TestClient) -> None:
    r = client.get("/healthz")
    assert r.status_code == 200
    health = HealthOut.model_validate(r.json())
    assert health.status == "ok"
    assert health.index.gpus == 2 and health.index.tuned_problems == 12


# ---------------------------------------------------------------------- /v1/results


def test_results_pagination(client: TestClient, seeded: Seeded) -> None:
    seen: list[int] = []
    offset: int | None = 0
    pages = 0
    while offset is not None:
        r = client.get("/v1/results", params={"offset": offset, "limit": 7})
        assert r.status_code == 200, r.text
        page = ResultPageOut.model_validate(r.json())
        assert page.total == seeded.measurements and page.limit == 7
        assert len(page.items) <= 7
        seen += [item.measurement_id for item in page.items]
        offset = page.next_offset
        pages += 1
    assert len(seen) == len(set(seen)) == seeded.measurements
    assert pages == math.ceil(seeded.measurements / 7)


def test_results_filters(client: TestClient) -> None:
    r = client.get("/v1/results", params={"gpu": "h200", "d": 128, "n": 4096})
    page = r.json()
    # D=128 N=4096 on the H200: fp16 full, fp16 causal, bf16 full; four measurements each.
    assert page["total"] == 12 and page["next_offset"] is None
    assert {item["gpu"] for item in page["items"]} == {"NVIDIA H200"}
    ok = client.get("/v1/results", params={"gpu": "H200", "status": "OK"}).json()
    assert ok["total"] == 22 and {i["status"] for i in ok["items"]} == {"OK"}
    timed = [i["median_ms"] for i in page["items"] if i["median_ms"] is not None]
    assert timed, "timed rows come first within a problem"
    assert client.get("/v1/results", params={"gpu": "nope"}).json()["total"] == 0


@pytest.mark.parametrize(
    "params",
    [
        {"limit": 0},
        {"limit": 1001},
        {"offset": -1},
        {"offset": "x"},
        {"d": 12},
        {"d": 264},
        {"n": 0},
        {"status": "GREAT"},
        {"dtype": "fp32"},
        {"gpu": "y" * 200},
    ],
)
def test_results_422(client: TestClient, params: dict[str, Any]) -> None:
    r = client.get("/v1/results", params=params)
    assert r.status_code == 422, r.text
    assert isinstance(r.json()["detail"], str)


# --------------------------------------------------------------------- POST /v1/results


def test_post_writes_disabled_without_token(
    client: TestClient, app: FastAPI, dump_body: bytes
) -> None:
    set_token(app, None)
    r = client.post("/v1/results", content=dump_body, headers={"Authorization": "Bearer x"})
    assert r.status_code == 403
    assert r.json()["detail"].startswith("writes disabled")
    set_token(app, "")  # compose passes an empty variable through
    assert client.post("/v1/results", content=dump_body).status_code == 403


def test_post_missing_and_wrong_token(client: TestClient, app: FastAPI, dump_body: bytes) -> None:
    set_token(app, "s3cret")
    r = client.post("/v1/results", content=dump_body)
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    r = client.post("/v1/results", content=dump_body, headers={"Authorization": "Basic s3cret"})
    assert r.status_code == 401
    r = client.post("/v1/results", content=dump_body, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 403 and r.json()["detail"] == "invalid ingest token"
    # Authentication comes before the body is even parsed.
    r = client.post("/v1/results", content=b"{not json", headers={"Authorization": "Bearer no"})
    assert r.status_code == 403


def test_post_ingest_idempotent_and_refreshes_index(
    client: TestClient, app: FastAPI, dump_body: bytes
) -> None:
    set_token(app, "s3cret")
    auth = {"Authorization": "Bearer s3cret", "Content-Type": "application/json"}
    assert best(client, gpu="RTX 6000 Ada Generation", d=64, n=1024).status_code == 404
    r = client.post("/v1/results", content=dump_body, headers=auth)
    assert r.status_code == 200, r.text
    assert r.json() == {
        "added": 2, "skipped": 0, "gpus_added": 1, "builds_added": 1, "problems_added": 2,
    }  # fmt: skip
    r = best(client, gpu="RTX 6000 Ada Generation", d=64, n=2000)
    assert r.status_code == 200 and r.json()["from_n"] == 1024
    again = client.post("/v1/results", content=dump_body, headers=auth)
    assert again.status_code == 200
    assert again.json()["added"] == 0 and again.json()["skipped"] == 2
    assert client.get("/healthz").json()["index"]["gpus"] == 3


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"", "empty body"),
        (b"{not json", "invalid results file"),
        (b"[]", "invalid results file"),
        (b'{"format": "something-else"}', "format"),
        (
            b'{"measurements": [{"problem": {}, "build": {}}]}',
            "measurements.0",
        ),
    ],
)
def test_post_invalid_body_422(client: TestClient, app: FastAPI, body: bytes, needle: str) -> None:
    set_token(app, "s3cret")
    r = client.post("/v1/results", content=body, headers={"Authorization": "Bearer s3cret"})
    assert r.status_code == 422, r.text
    assert needle in r.json()["detail"]


# -------------------------------------------------------------------- /v1/export/header


def test_export_header_endpoint(client: TestClient, seeded: Seeded) -> None:
    r = client.get("/v1/export/header", params={"gpu": "h200", "d": "64,128"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert "fa2tune_forward(const FaParams& p, int head_dim" in text
    assert "tuned for: NVIDIA H200" in text
    for (gpu, *_), cfg in seeded.winners.items():
        if gpu == "NVIDIA H200":
            assert f"fa2::launch<fa2tune_configs::{cfg.name}>" in text
    r = client.get("/v1/export/header", params=[("gpu", "H200"), ("d", "64"), ("dtype", "fp16")])
    assert r.status_code == 200
    assert (
        "fa2_d128" not in r.text and "__nv_bfloat16, " not in r.text.split("fa2tune_configs {")[1]
    )


def test_export_header_with_kv_pages(client: TestClient) -> None:
    r = client.get("/v1/export/header", params=[("gpu", "H200"), ("d", "64"), ("kv_pages", "0"),
                                                ("kv_pages", "16")])  # fmt: skip
    assert r.status_code == 200, r.text
    assert "#define FA2TUNE_HAS_KVCACHE 1" in r.text and "kKvPages[] = {0, 16};" in r.text
    r = client.get("/v1/export/header", params={"gpu": "H200", "d": "64"})
    assert "#define FA2TUNE_HAS_KVCACHE" not in r.text  # a cached header is keyed by the pages


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"gpu": "RTX 9090"}, 404),
        ({"gpu": "H200", "kv_pages": "3"}, 422),
        ({"gpu": "H200", "kv_pages": "016"}, 422),
        ({"gpu": "H200", "kv_pages": "16,"}, 422),
        ({"gpu": "H200", "d": "12"}, 422),
        ({"gpu": "H200", "d": "64,264"}, 422),
        ({"gpu": "H200", "d": "0"}, 422),
        ({"gpu": "H200", "d": "abc"}, 422),
        ({"gpu": "H200", "dtype": "fp8"}, 422),
        ({"gpu": ""}, 422),
        ({}, 422),
    ],
)
def test_export_header_errors(client: TestClient, params: dict[str, Any], code: int) -> None:
    r = client.get("/v1/export/header", params=params)
    assert r.status_code == code, r.text
    assert isinstance(r.json()["detail"], str)


# ------------------------------------------------------------------ app and lifespan


def test_openapi_documents_every_endpoint(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert {"/v1/best", "/v1/gpus", "/v1/results", "/healthz", "/v1/export/header"} <= set(
        spec["paths"]
    )
    post = spec["paths"]["/v1/results"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/DumpFile"
    )
    assert "DumpFile" in spec["components"]["schemas"]
    assert "MeasurementRecord" in spec["components"]["schemas"]
    assert {"401", "403", "422"} <= set(post["responses"])
    assert "404" in spec["paths"]["/v1/best"]["get"]["responses"]
    assert not {p for p in spec["paths"] if p.startswith(("/docs", "/redoc"))}


@pytest.mark.parametrize(
    ("page", "assets"),
    [
        ("/docs", ("swagger-ui-bundle.js", "swagger-ui.css", "favicon.png")),
        ("/redoc", ("redoc.standalone.js", "favicon.png")),
    ],
)
def test_docs_pages_load_nothing_from_the_internet(
    client: TestClient, page: str, assets: tuple[str, ...]
) -> None:
    """Every script, stylesheet and icon the pages name is served by the service itself (an
    offline machine renders them); nothing points at a CDN or a font host."""
    html = client.get(page)
    assert html.status_code == 200 and "/openapi.json" in html.text
    urls = re.findall(r'(?:src|href)\s*=\s*["\']([^"\']+)', html.text)
    urls += re.findall(r'url:\s*["\']([^"\']+)', html.text)
    assert not [u for u in urls if "//" in u], urls
    for name in assets:
        url = f"/docs-assets/{name}"
        assert url in html.text, (page, name)
        got = client.get(url)
        assert got.status_code == 200 and len(got.content) > 1000, url
    script = client.get(f"/docs-assets/{assets[0]}")
    assert "javascript" in script.headers["content-type"]
    redirect = client.get("/docs/oauth2-redirect")
    assert redirect.status_code == 200 and "oauth2" in redirect.text.lower()


def test_lifespan_loads_shipped_results(
    store: Store, dump_body: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Store] = []

    def fake_shipped(target: Store) -> int:
        calls.append(target)
        return transfer.ingest(target, dump_body).added

    monkeypatch.setattr(service_main, "load_shipped_results", fake_shipped)
    with TestClient(create_app(store, load_shipped=True)) as c:
        assert calls == [store]
        assert best(c, gpu="RTX 6000 Ada Generation", d=64, n=4096).status_code == 200
    calls.clear()
    with TestClient(create_app(store)) as c:  # an injected store is left alone by default
        assert calls == []


def test_index_refresh_sees_other_writers(client: TestClient, app: FastAPI, store: Store) -> None:
    holder = app.state.index
    assert holder.refresh_if_changed() is False
    problem = Problem(gpu="NVIDIA H200", d=64, n=65536)
    seed_measurement(store, problem=problem, result=ok_result(9.0, problem))
    assert holder.refresh_if_changed() is True
    assert best(client, gpu="H200", d=64, n=60000).json()["from_n"] == 65536


def test_root_redirects_to_docs(client: TestClient) -> None:
    r = client.get("/", follow_redirects=False)
    assert r.status_code in (302, 307) and r.headers["location"] == "/docs"


# ------------------------------------------------------------------------- fast path

FAST_PATH_QUERIES = [
    "gpu=H200&d=128&n=4096",
    "gpu=NVIDIA+H200&d=64&n=3000&dtype=fp16&causal=false",
    "gpu=nvidia%20h200&d=128&n=1000&causal=1",
    "gpu=H200&d=128&n=77&dtype=bf16&causal=0",
    "gpu=A100-SXM4-80GB&d=64&n=1&extra=ignored",
    "gpu=%20H200%20&d=64&n=2147483647",
    "gpu=H200&d=064&n=01024",
    # Below: not plainly valid or not found, so the route answers (404/422, or 200 for
    # spellings only pydantic accepts).
    "gpu=H200&d=64&n=1024&causal=True",
    "gpu=H200&d=64&n=1024&causal=yes",
    "gpu=H200&d=+64&n=1024",
    "gpu=H200&d=64&n=1024&n=2048",
    "gpu=H200&gpu=A100-SXM4-80GB&d=64&n=1024",
    "gpu=H200%00&d=64&n=1024",
    "gpu=H200&d=64&n=1024&causal=FALSE",
    "gpu=H200&d=64&n=2147483648",
    "gpu=H200&d=64&n=99999999999999999999",
    "gpu=H200&d=48&n=1024",
    "gpu=H200&d=12&n=1024",
    "gpu=H200&d=64.0&n=1024",
    "gpu=&d=64&n=1024",
    "gpu=%20&d=64&n=1024",
    "gpu=" + "x" * 129 + "&d=64&n=1024",
    "gpu=H%C3%A9200&d=64&n=1024",
    "gpu=RTX&d=64&n=1024",
    "gpu=H200&d=32&n=1024",
    "gpu=H200&d=64&n=1024&dtype=FP16",
    "gpu=H200&d=64&n=1024&causal=",
    "d=64&n=1024",
    "",
]


def test_fast_path_matches_route(store: Store) -> None:
    """The pure-ASGI shortcut and the FastAPI route answer every query identically."""
    with (
        TestClient(create_app(store)) as fast,
        TestClient(create_app(store, fast_path=False)) as slow,
    ):
        for query in FAST_PATH_QUERIES:
            a, b = fast.get(f"/v1/best?{query}"), slow.get(f"/v1/best?{query}")
            assert (a.status_code, a.json()) == (b.status_code, b.json()), query
            assert a.headers["content-type"] == b.headers["content-type"], query


def test_fast_path_answers_only_plain_requests(app: FastAPI) -> None:
    from service.fastpath import BestFastPath

    with TestClient(app):
        fast = BestFastPath(app, app.state.index)
        answered = [q for q in FAST_PATH_QUERIES if fast.answer(q.encode()) is not None]
    assert answered == FAST_PATH_QUERIES[:7]
