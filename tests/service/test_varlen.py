"""``GET /v1/best/varlen``: packed batches answered from the store's varlen problems."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from core.fa2_config import Fa2Config
from core.problem import Problem
from db.store import Store
from service.main import create_app
from service.schemas import VarlenBestOut
from tests.support.factories import H200, make_config, make_report, ok_result
from tests.support.service_data import make_store

LENS = (100, 4000, 1822, 7)
FAST = Fa2Config(**{**make_config(swizzle=True).to_dict(), "varlen": True})
SLOW = Fa2Config(**{**make_config(br=64).to_dict(), "varlen": True})


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """Varlen rows only (the conftest's ``app`` and ``client`` serve it)."""
    store: Store = make_store(tmp_path)
    gpu = store.upsert_gpu(H200)
    for lens, config, ms in ((LENS, SLOW, 3.0), (LENS, FAST, 2.0), ((50, 60), SLOW, 0.1)):
        problem = Problem.varlen(H200.name, 128, lens, heads=32, kv_heads=8)
        pid = store.problem_id(problem, gpu)
        build = store.record_build(make_report(config))
        store.record_measurement(pid, build, ok_result(ms, problem), H200)
    yield store
    store.close()


def _get(client: TestClient, **params: object) -> object:
    base = {"gpu": "H200", "d": 128, "heads": 32, "kv_heads": 8}
    return client.get("/v1/best/varlen", params={**base, **params})


def test_exact_lengths(client: TestClient) -> None:
    r = _get(client, seqlens="100,4000,1822,7")
    assert r.status_code == 200, r.text  # type: ignore[attr-defined]
    body = VarlenBestOut.model_validate(r.json())  # type: ignore[attr-defined]
    assert body.exact and body.distance == 0.0 and body.measured_seqlens == list(LENS)
    assert body.config.name == FAST.name and body.config.name.endswith("_vl")
    problem = Problem.varlen(H200.name, 128, LENS, heads=32, kv_heads=8)
    assert body.tflops == pytest.approx(problem.tflops(2.0))


def test_nearest_lengths_say_where_they_were_measured(client: TestClient) -> None:
    body = VarlenBestOut.model_validate(_get(client, seqlens="3000,500,900").json())  # type: ignore[attr-defined]
    assert not body.exact and body.measured_seqlens == list(LENS) and body.distance > 0
    small = VarlenBestOut.model_validate(_get(client, seqlens="40,70").json())  # type: ignore[attr-defined]
    assert small.measured_seqlens == [50, 60] and small.config.name == SLOW.name


@pytest.mark.parametrize(
    ("params", "status", "where"),
    [
        ({"seqlens": "1,0"}, 422, "seqlens"),
        ({"seqlens": "a,b"}, 422, "seqlens"),
        ({"seqlens": ""}, 422, "seqlens"),
        ({"seqlens": "2147483647,1"}, 422, "seqlens"),
        ({"seqlens": "5", "heads": 12, "kv_heads": 8}, 422, "kv_heads"),
        ({"seqlens": "5", "d": 12}, 422, "d"),
        ({"seqlens": "5", "causal": True}, 404, "no varlen results"),
        ({"seqlens": "5", "gpu": "A100"}, 404, "no varlen results"),
    ],
)
def test_bad_requests(
    client: TestClient, params: dict[str, object], status: int, where: str
) -> None:
    r = _get(client, **params)
    assert r.status_code == status, r.text  # type: ignore[attr-defined]
    assert where in r.text  # type: ignore[attr-defined]


def test_dense_best_is_not_answered_by_varlen_rows(client: TestClient) -> None:
    r = client.get("/v1/best", params={"gpu": "H200", "d": 128, "n": 4000})
    assert r.status_code == 404, r.text


def test_shipped_varlen_results_answer_the_workload(tmp_path: Path) -> None:
    """The shipped H200 varlen results (db/data/h200_results_varlen*.json) answer the tuned
    workload's lengths exactly, with a ``_vl`` config that was verified and timed, and a
    nearby packed batch by distance."""
    import yaml

    from db.shipped import load_shipped_results

    root = Path(__file__).resolve().parents[2]
    store = make_store(tmp_path)
    data = root / "db" / "data"
    shipped = [data / "h200_results_varlen.json", data / "h200_results_varlen_fa3.json"]
    assert load_shipped_results(store, shipped) > 0
    (entry,) = yaml.safe_load((root / "bench/h200/varlen_workload.yaml").read_text())["shapes"]
    lens = ",".join(str(n) for n in entry["seqlens"])
    with TestClient(create_app(store)) as c:
        for dtype in ("fp16", "bf16"):
            for causal in (False, True):
                params = {"gpu": "NVIDIA H200", "d": 128, "heads": 32, "kv_heads": 8,
                          "dtype": dtype, "causal": causal}  # fmt: skip
                r = c.get("/v1/best/varlen", params={**params, "seqlens": lens})
                assert r.status_code == 200, r.text
                body = VarlenBestOut.model_validate(r.json())
                assert body.exact and body.measured_seqlens == entry["seqlens"]
                assert body.config.name.endswith("_vl") and body.config.causal == causal
                # The Hopper family's varlen kernels won every problem of the workload.
                assert body.config.name.startswith("fa3_"), body.config.name
                near = VarlenBestOut.model_validate(
                    c.get("/v1/best/varlen", params={**params, "seqlens": "2000,900,3000"}).json()
                )
                assert not near.exact and near.config.name == body.config.name
    store.close()
