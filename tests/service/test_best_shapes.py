"""Whole-shape answers (issue 13): ``Store.best_for_shape``, ``/v1/best`` with shape parameters
and ``fa2tune best --nq/--nk/--batch/--heads/--kv-heads``; and old clients (``n`` alone)
answered exactly as before, checked against the shipped results."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from core.fa2_config import Fa2Config
from core.problem import Problem
from core.records import GpuInfo
from core.shape import Shape, effective_causal, shape_distance
from db.queries import DEFAULT_SM_COUNT, effective_sm_count
from db.shipped import load_shipped_results
from db.store import Store
from fa2tune.cli import app as cli_app
from service.main import create_app
from service.schemas import BestOut, ValidationErrorOut
from tests.support.factories import H200, make_config, ok_result, seed_measurement

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "db" / "data" / "h200_results_families.json"
SMS = H200.sm_count

# One config per tuned shape, so an answer says which shape it came from.
SQUARE_1K = make_config(br=64, bc=64)
SQUARE_4K = make_config(br=128, bc=64)
SQUARE_4K_SLOW = make_config(br=128, bc=128)
DECODE = make_config(br=64, bc=128, warps=4, stages=2)
BIG_BATCH = make_config(br=128, bc=64, warps=8)

DECODE_SHAPE = Shape(nq=1, nk=4096, batch=8, heads=32, kv_heads=8)
BIG_BATCH_SHAPE = Shape(nq=4096, nk=4096, batch=64, heads=16, kv_heads=16)


def _problem(shape: Shape) -> Problem:
    return Problem(
        gpu=H200.name,
        d=128,
        n=shape.nq,
        nk=shape.nk,
        batch=shape.batch,
        heads=shape.heads,
        kv_heads=shape.kv_heads,
    )


def square(n: int) -> Shape:
    return Shape(n, n, 2, 16, 16)


def seed(store: Store, gpu: GpuInfo = H200) -> None:
    """D=128 fp16 full: the campaign's square 1024 and 4096 (batch 2, 16 heads), a decode-like
    GQA shape and a big-batch square one."""
    plan: list[tuple[Shape, Fa2Config, float]] = [
        (square(1024), SQUARE_1K, 0.1),
        (square(4096), SQUARE_4K_SLOW, 1.2),
        (square(4096), SQUARE_4K, 1.0),
        (DECODE_SHAPE, DECODE, 0.05),
        (BIG_BATCH_SHAPE, BIG_BATCH, 30.0),
    ]
    for shape, config, ms in plan:
        problem = _problem(shape)
        seed_measurement(
            store, gpu=gpu, problem=problem, config=config, result=ok_result(ms, problem)
        )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.from_url(f"sqlite:///{tmp_path / 'fa2tune.db'}") as s:
        seed(s)
        yield s


# ------------------------------------------------------------------------------ store


def test_store_exact_shape(store: Store) -> None:
    hit = store.best_for_shape("H200", 128, "fp16", False, square(4096))
    assert hit is not None
    assert hit.config.name == SQUARE_4K.name
    assert (hit.exact, hit.distance, hit.from_n, hit.nk, hit.batch) == (True, 0.0, 4096, 4096, 2)
    decode = store.best_for_shape("nvidia h200", 128, "fp16", False, DECODE_SHAPE, exact=True)
    assert decode is not None and decode.config.name == DECODE.name and decode.exact


def test_store_nearest_decode_shape(store: Store) -> None:
    asked = Shape(nq=1, nk=8192, batch=8, heads=32, kv_heads=8)
    near = store.best_for_shape("H200", 128, "fp16", False, asked)
    assert near is not None
    assert near.config.name == DECODE.name  # not the square shapes
    assert (near.exact, near.from_n, near.nk, near.kv_heads) == (False, 1, 4096, 8)
    assert near.distance == pytest.approx(math.log(2))
    assert near.distance == shape_distance(asked, DECODE_SHAPE, SMS)
    assert store.best_for_shape("H200", 128, "fp16", False, asked, exact=True) is None


def test_store_nearest_by_batch(store: Store) -> None:
    # A big batch at N=4096 is nearer the big-batch shape than the campaign's batch 2.
    asked = Shape(4096, 4096, 48, 16, 16)
    near = store.best_for_shape("H200", 128, "fp16", False, asked)
    assert near is not None and near.config.name == BIG_BATCH.name and near.batch == 64
    # A square shape at the campaign's batch stays with the square results.
    square_near = store.best_for_shape("H200", 128, "fp16", False, square(3000))
    assert square_near is not None and square_near.config.name == SQUARE_4K.name


def test_store_nothing_for_other_keys(store: Store) -> None:
    for args in (("H100", 128, "fp16", False), ("H200", 64, "fp16", False),
                 ("H200", 128, "bf16", False), ("H200", 128, "fp16", True)):  # fmt: skip
        assert store.best_for_shape(*args, square(4096)) is None  # type: ignore[arg-type]
    assert store.best_for_shape("H200", 128, "fp16", False, square(4096), family="fa3") is None
    fa2 = store.best_for_shape("H200", 128, "fp16", False, square(4096), family="fa2")
    assert fa2 is not None and fa2.config.name == SQUARE_4K.name


def test_store_causal_one_row_call_is_answered_by_unmasked_results(store: Store) -> None:
    """A causal call with one query row sees every key (bottom-right alignment), so the
    unmasked decode results answer it; with two rows the mask matters and they do not."""
    hit = store.best_for_shape("H200", 128, "fp16", True, DECODE_SHAPE)
    assert hit is not None and hit.config.name == DECODE.name and hit.exact
    two_rows = Shape(2, DECODE_SHAPE.nk, 8, 32, 8)
    assert store.best_for_shape("H200", 128, "fp16", True, two_rows) is None
    assert not effective_causal(True, 1) and effective_causal(True, 2)
    assert not effective_causal(False, 1) and not effective_causal(False, 5)


def test_store_unknown_sm_count_counts_as_default(tmp_path: Path) -> None:
    assert effective_sm_count([0, -1]) == DEFAULT_SM_COUNT == 132
    assert effective_sm_count([0, 108]) == 108
    no_sms = GpuInfo(**{**H200.__dict__, "sm_count": 0})
    with Store.from_url(f"sqlite:///{tmp_path / 'fa2tune.db'}") as s:
        seed(s, gpu=no_sms)
        asked = Shape(2048, 2048, 4, 16, 16)
        near = s.best_for_shape("H200", 128, "fp16", False, asked)
        assert near is not None
        tuned = Shape(near.n, near.nk, near.batch, near.heads, near.kv_heads)
        assert near.distance == shape_distance(asked, tuned, DEFAULT_SM_COUNT)


def test_best_or_nearest_reports_a_distance(store: Store) -> None:
    exact = store.best_or_nearest("H200", 128, 4096)
    assert exact is not None and exact.distance == 0.0
    near = store.best_or_nearest("H200", 128, 3000)
    assert near is not None and near.from_n == 4096 and not near.exact
    # N alone ranks N=4096's problems by throughput (the big batch wins, as before shapes);
    # the distance is from 3000 x 3000 at that batch.
    assert near.config.name == BIG_BATCH.name
    asked = Shape(3000, 3000, BIG_BATCH_SHAPE.batch, 16, 16)
    assert near.distance == shape_distance(asked, BIG_BATCH_SHAPE, SMS)


# ---------------------------------------------------------------------------- service


#: Every test that uses the client runs through the fast path and the FastAPI route (the
#: conftest's ``client`` over this module's ``store``).
BOTH_PATHS = True


BASE = {"gpu": "H200", "d": 128, "dtype": "fp16", "causal": "false"}


def get(client: TestClient, **params: Any) -> Any:
    return client.get("/v1/best", params={**BASE, **params})


@pytest.mark.parametrize(
    ("params", "asked"),
    [
        ({"nq": 1, "nk": 8192, "batch": 8, "heads": 32, "kv_heads": 8}, Shape(1, 8192, 8, 32, 8)),
        ({"n": 1, "nk": 8192, "batch": 8, "heads": 32, "kv_heads": 8}, Shape(1, 8192, 8, 32, 8)),
        ({"nq": 4096}, square(4096)),
        ({"n": 4096, "batch": 2}, square(4096)),
        ({"n": 4096, "nq": 4096, "heads": 16, "kv_heads": 16}, square(4096)),
        ({"nq": 3000, "batch": 48}, Shape(3000, 3000, 48, 16, 16)),
        ({"nq": 1, "nk": 4096, "batch": 8, "heads": 32, "kv_heads": 8}, DECODE_SHAPE),
        ({"nq": 100, "heads": 8, "kv_heads": 1}, Shape(100, 100, 2, 8, 1)),
    ],
)
def test_service_shape_answers_as_the_store(
    client: TestClient, store: Store, params: dict[str, int], asked: Shape
) -> None:
    r = get(client, **params)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    expected = store.best_for_shape("H200", 128, "fp16", False, asked)
    assert expected is not None
    body = r.json()
    assert body == BestOut.of(expected, asked.nq, asked).model_dump(mode="json")
    assert body["shape"] == {
        "nq": asked.nq, "nk": asked.nk, "batch": asked.batch, "heads": asked.heads,
        "kv_heads": asked.kv_heads,
    }  # fmt: skip
    assert body["exact"] is expected.exact
    assert body["distance"] == expected.distance


def test_service_causal_one_row_answers_as_the_store(client: TestClient, store: Store) -> None:
    """A causal decode call gets the unmasked decode winner from the index as from the store;
    the store seeds nothing causal, so two causal rows have no answer at all."""
    for nk in (4096, 8192, 100_000):
        asked = Shape(1, nk, 8, 32, 8)
        r = get(client, causal="true", nq=1, nk=nk, batch=8, heads=32, kv_heads=8)
        assert r.status_code == 200, r.text
        expected = store.best_for_shape("H200", 128, "fp16", True, asked)
        assert expected is not None and expected.config.name == DECODE.name
        assert r.json() == BestOut.of(expected, 1, asked).model_dump(mode="json")
    two = get(client, causal="true", nq=2, nk=4096, batch=8, heads=32, kv_heads=8)
    assert two.status_code == 404, two.text


def test_service_decode_picks_the_decode_shape(client: TestClient) -> None:
    body = get(client, nq=1, nk=8192, batch=8, heads=32, kv_heads=8).json()
    assert body["config"]["name"] == DECODE.name
    assert body["exact"] is False and body["from_n"] == 1
    assert body["measured_problem"] == {"n": 1, "nk": 4096, "batch": 8, "heads": 32, "kv_heads": 8}
    assert body["distance"] == pytest.approx(math.log(2))
    exact = get(client, nq=1, nk=4096, batch=8, heads=32, kv_heads=8).json()
    assert exact["exact"] is True and exact["distance"] == 0.0


def test_service_n_alone_is_unchanged(client: TestClient, store: Store) -> None:
    for n in (1, 1000, 4096, 5000, 2**31 - 1):
        body = get(client, n=n).json()
        assert "shape" not in body and "distance" not in body
        expected = store.best_or_nearest("H200", 128, n)
        assert expected is not None
        assert body["from_n"] == expected.from_n
        assert body["config"]["name"] == expected.config.name


def test_service_exact_shape_404(client: TestClient) -> None:
    r = get(client, nq=1, nk=8192, batch=8, heads=32, kv_heads=8, exact="true")
    assert r.status_code == 404
    detail = r.json()["detail"]
    assert "B=8 H=32/8kv Nq=1 Nk=8192 not tuned" in detail and "exact=true" in detail
    assert "4 tuned shapes" in detail and len(detail) < 300
    ok = get(client, nq=1, nk=4096, batch=8, heads=32, kv_heads=8, exact="true")
    assert ok.status_code == 200 and ok.json()["exact"] is True
    r = client.get("/v1/best", params={**BASE, "gpu": "RTX 9090", "nq": 5})
    assert r.status_code == 404 and "no results for GPU 'RTX 9090'" in r.json()["detail"]


@pytest.mark.parametrize(
    ("params", "field", "needle"),
    [
        ({"n": 4, "nq": 5}, "nq", "differs from n"),
        ({"nq": 4, "heads": 16, "kv_heads": 3}, "kv_heads", "multiple of kv_heads"),
        ({"nq": 4, "kv_heads": 5}, "kv_heads", "heads (16) must be a multiple"),
        ({"nq": 0}, "nq", "greater than or equal to 1"),
        ({"n": 4, "nk": 0}, "nk", "greater than or equal to 1"),
        ({"n": 4, "batch": 2**31}, "batch", "less than or equal to 2147483647"),
        ({"n": 4, "heads": -1}, "heads", "greater than or equal to 1"),
        ({"nk": 4}, "n", "required"),
        ({}, "n", "required"),
        ({"nq": "x"}, "nq", "integer"),
    ],
)
def test_service_bad_shapes_422(
    client: TestClient, params: dict[str, Any], field: str, needle: str
) -> None:
    r = get(client, **params)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/json"
    body = ValidationErrorOut.model_validate(r.json())
    assert body.detail.startswith(f"{field}: "), body.detail
    assert needle in body.detail
    assert body.errors[0].loc == ["query", field]


def test_openapi_describes_shapes(store: Store) -> None:
    with TestClient(create_app(store)) as c:
        doc = c.get("/openapi.json").json()
    params = {p["name"]: p for p in doc["paths"]["/v1/best"]["get"]["parameters"]}
    for name in ("n", "nq", "nk", "batch", "heads", "kv_heads"):
        assert params[name]["in"] == "query" and not params[name].get("required", False), name
        assert params[name]["description"], name
    assert "default: 2" in params["batch"]["description"]
    assert "default: 16" in params["heads"]["description"]
    schemas = doc["components"]["schemas"]
    best = schemas["BestOut"]["properties"]
    assert {"shape", "distance", "measured_problem"} <= set(best)
    assert set(schemas["ShapeOut"]["properties"]) == {"nq", "nk", "batch", "heads", "kv_heads"}


def test_index_follows_the_store(store: Store) -> None:
    # An ingest through another writer is seen by the refresh, as the per-N answers are.
    with TestClient(create_app(store)) as c:
        asked = {"nq": 1, "nk": 1024, "batch": 8, "heads": 32, "kv_heads": 8}
        assert get(c, **asked).json()["exact"] is False
        problem = _problem(Shape(1, 1024, 8, 32, 8))
        seed_measurement(store, problem=problem, config=SQUARE_1K, result=ok_result(0.01))
        c.app.state.index.refresh_if_changed()  # type: ignore[attr-defined]
        body = get(c, **asked).json()
        assert body["exact"] is True and body["config"]["name"] == SQUARE_1K.name


# -------------------------------------------------------------- old clients, shipped data


def _old_rule(tuned: list[int], n: int) -> int:
    """The per-N rule old clients got: the tuned N nearest on a log scale (the larger N on a
    tie), in exact arithmetic: the nearest is the one whose ratio to n, taken >= 1, is least."""
    return min(tuned, key=lambda t: (max(Fraction(t, n), Fraction(n, t)), -t))


OLD_NS = sorted({1, 2, 3, 100, 511, 512, 513, 723, 724, 725, 1000, 1024, 2047, 2048, 2049,
                 3000, 4096, 5793, 5794, 8191, 8192, 8193, 11585, 11586, 16384, 16385, 65536,
                 2**20, 2**31 - 1})  # fmt: skip


@pytest.fixture(scope="module")
def shipped_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    directory = tmp_path_factory.mktemp("shipped")
    with Store.from_url(f"sqlite:///{directory / 'fa2tune.db'}") as s:
        load_shipped_results(s, [SHIPPED])
        yield s


def _fastest_ok(path: Path, fields: tuple[str, ...]) -> dict[tuple[Any, ...], str]:
    """The fastest OK config per problem of a dump file, read from the file itself, keyed by
    the problem's ``fields`` (problems with Nq != Nk left out)."""
    fastest: dict[tuple[Any, ...], tuple[float, str]] = {}
    for m in json.loads(path.read_text())["measurements"]:
        p = m["problem"]
        if m["status"] != "OK" or m["median_ms"] is None or p["nk"] != p["n"]:
            continue
        key = tuple(p[f] for f in fields)
        candidate = (m["median_ms"], m["build"]["config_name"])
        fastest[key] = min(fastest.get(key, candidate), candidate)
    return {key: name for key, (_, name) in fastest.items()}


def _shipped_winners() -> dict[tuple[str, int, str, bool], dict[int, str]]:
    """(GPU, D, dtype, causal) -> {N: the fastest OK config}, read from the file itself."""
    out: dict[tuple[str, int, str, bool], dict[int, str]] = {}
    for (gpu, d, dtype, causal, n), name in _fastest_ok(
        SHIPPED, ("gpu", "d", "dtype", "causal", "n")
    ).items():
        out.setdefault((gpu, d, dtype, causal), {})[n] = name
    return out


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "route"])
def test_old_clients_answered_as_before(shipped_store: Store, fast_path: bool) -> None:
    winners = _shipped_winners()
    assert len(winners) >= 8  # D 64/128/256, fp16/bf16, causal or not
    with TestClient(create_app(shipped_store, fast_path=fast_path)) as c:
        for (gpu, d, dtype, causal), by_n in sorted(winners.items()):
            tuned = sorted(by_n)
            for n in OLD_NS:
                params = {"gpu": gpu, "d": d, "n": n, "dtype": dtype, "causal": causal}
                r = c.get("/v1/best", params=params)
                assert r.status_code == 200, (params, r.text)
                body = r.json()
                from_n = _old_rule(tuned, n)
                assert (body["n"], body["from_n"], body["exact"]) == (n, from_n, n == from_n)
                assert body["config"]["name"] == by_n[from_n], params
                assert "shape" not in body and "distance" not in body


def test_shipped_square_shapes_answer_like_the_store(shipped_store: Store) -> None:
    with TestClient(create_app(shipped_store)) as c:
        for nq, nk in ((4096, 4096), (3000, 3000), (100, 65536), (17, 8192)):
            body = c.get("/v1/best", params={**BASE, "nq": nq, "nk": nk}).json()
            expected = shipped_store.best_for_shape(
                "H200", 128, "fp16", False, Shape(nq, nk, 2, 16, 16)
            )
            assert expected is not None
            assert (body["config"]["name"], body["from_n"]) == (expected.config.name, expected.n)
            assert body["distance"] == expected.distance
        # This store holds prefill shapes only: a decode step (Nq <= 16) is not answered by
        # them, by the store nor by the service, which says why.
        for nq in (1, 16):
            assert shipped_store.best_for_shape(
                "H200", 128, "fp16", False, Shape(nq, 8192, 2, 16, 16)
            ) is None  # fmt: skip
            r = c.get("/v1/best", params={**BASE, "nq": nq, "nk": 8192})
            assert r.status_code == 404
            assert "no decode shape" in r.json()["detail"]


# -------------------------------------------------------------------------------- CLI

runner = CliRunner()


@pytest.fixture
def cli_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr("core.settings._overrides", {})
    monkeypatch.setattr("db.shipped.shipped_files", lambda: [])
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    with Store.from_url(url) as s:
        seed(s)
    return url


def _best(url: str, *args: str) -> Any:
    return runner.invoke(
        cli_app,
        ["--db", url, "best", "--gpu", "H200", "--d", "128", *args],
        env={"COLUMNS": "200"},  # one table row a line
    )


def test_cli_shape_nearest(cli_db: str) -> None:
    args = ["--nq", "1", "--nk", "8192", "--batch", "8", "--heads", "32", "--kv-heads", "8"]
    result = _best(cli_db, *args)
    assert result.exit_code == 0, result.output
    flat = " ".join(result.stdout.split())
    assert DECODE.name in flat
    assert "B=8 H=32/8kv Nq=1 Nk=4096 (nearest tuned shape, distance 0.693" in flat
    assert "asked B=8 H=32/8kv Nq=1 Nk=8192" in flat
    data = json.loads(_best(cli_db, *args, "--json").stdout)
    assert data["config_name"] == DECODE.name
    assert (data["exact"], data["from_n"], data["nk"]) == (False, 1, 4096)
    assert data["distance"] == pytest.approx(math.log(2))
    assert data["shape"] == {"nq": 1, "nk": 8192, "batch": 8, "heads": 32, "kv_heads": 8}
    exact = _best(cli_db, *args, "--exact")
    assert exact.exit_code == 1 and "B=8 H=32/8kv Nq=1 Nk=8192" in exact.stderr


def test_cli_decode_is_not_answered_by_prefill_shapes(cli_db: str) -> None:
    # D=128 bf16 holds one prefill shape (N=4096): it answers a prefill ask from afar, but a
    # decode step is not answered, and the message says it looked at decode shapes only.
    problem = dataclasses.replace(_problem(square(4096)), dtype="bf16")
    with Store.from_url(cli_db) as s:
        seed_measurement(s, gpu=H200, problem=problem, config=make_config(128, "bf16", False),
                         result=ok_result(1.0, problem))  # fmt: skip
    prefill = _best(cli_db, "--nq", "2000", "--nk", "8192", "--dtype", "bf16")
    assert prefill.exit_code == 0, prefill.output
    result = _best(cli_db, "--nq", "1", "--nk", "8192", "--dtype", "bf16")
    assert result.exit_code == 1
    assert "at any decode shape (Nq <= 16 is decode)" in result.stderr


def test_cli_shape_exact(cli_db: str) -> None:
    result = _best(cli_db, "--n", "4096", "--batch", "2")
    assert result.exit_code == 0, result.output
    flat = " ".join(result.stdout.split())
    assert SQUARE_4K.name in flat and "B=2 H=16 Nq=4096 Nk=4096 (the shape asked)" in flat
    assert "distance" not in flat


def test_cli_n_alone_unchanged(cli_db: str) -> None:
    # --batch/--heads are no longer filters; without them, --n alone answers per N.
    result = _best(cli_db, "--n", "3000", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    # Ranked across N=4096's problems by throughput, as before: the big batch.
    assert (data["exact"], data["from_n"], data["config_name"]) == (False, 4096, BIG_BATCH.name)
    assert "shape" not in data
    assert "nearest tuned N" in _best(cli_db, "--n", "3000").stdout


@pytest.mark.parametrize(
    ("args", "option", "needle"),
    [
        (["--n", "4", "--nq", "5"], "--nq", "differs from n"),
        (["--nq", "4", "--kv-heads", "3"], "--kv-heads", "must be a multiple of kv_heads"),
        (["--nk", "4"], "--n", "give n, or nq"),
        ([], "--n", "give n, or nq"),
        (["--nq", "0"], "--nq", "greater than or equal to 1"),
        (["--n", "4", "--kv-heads", str(2**31)], "--kv-heads", "less than or equal"),
    ],
)
def test_cli_bad_shapes_exit_2(cli_db: str, args: list[str], option: str, needle: str) -> None:
    result = _best(cli_db, *args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    flat = " ".join(result.stderr.replace("│", " ").split())
    assert option in flat and needle in flat, flat


SHIPPED_PREFILL = ROOT / "db" / "data" / "h200_results_prefill_gqa.json"
PREFILL_WORKLOAD = ROOT / "bench" / "h200" / "prefill_gqa_workload.yaml"


def test_shipped_gqa_prefill_answers_its_workload(tmp_path: Path) -> None:
    """db/data/h200_results_prefill_gqa.json answers every shape of the workload it was tuned
    on exactly, over HTTP, with the file's fastest OK measurement of that shape."""
    from tuner.workload import load_workload

    fastest = _fastest_ok(SHIPPED_PREFILL, ("dtype", "causal", "batch", "n"))
    targets = load_workload(PREFILL_WORKLOAD).targets
    assert len(fastest) == len(targets) == 24
    with Store.from_url(f"sqlite:///{tmp_path / 'prefill.db'}") as s:
        load_shipped_results(s, [SHIPPED_PREFILL])
        with TestClient(create_app(s)) as c:
            for t in targets:
                sh = t.shape
                params = {"gpu": "NVIDIA H200", "d": t.d, "dtype": t.dtype, "causal": t.causal,
                          "batch": sh.batch, "heads": sh.heads, "kv_heads": sh.kv_heads,
                          "nq": sh.nq, "nk": sh.nk}  # fmt: skip
                body = c.get("/v1/best", params=params).json()
                assert body["exact"] is True, params
                name = fastest[(t.dtype, t.causal, sh.batch, sh.nq)]
                assert body["config"]["name"] == name, params
