"""``fa2tune best --seqlens``: packed batches answered from the local database, as
``GET /v1/best/varlen`` answers them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from typer.testing import CliRunner, Result

from core.problem import Problem
from db.store import Store
from fa2tune.cli import app as cli_app
from service.main import create_app
from service.schemas import ValidationErrorOut, VarlenBestOut
from tests.support.factories import H200, make_config, make_report, ok_result, seed_measurement

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_VARLEN = ROOT / "db" / "data" / "h200_results_varlen.json"
WORKLOAD = ROOT / "bench" / "h200" / "varlen_workload.yaml"

LENS = (100, 4000, 1822, 7)
FAST = replace(make_config(swizzle=True), varlen=True)
SLOW = replace(make_config(br=64), varlen=True)

runner = CliRunner()


def _seed_varlen(store: Store) -> None:
    """D=128 fp16 full, 32 heads / 8 KV: LENS (FAST beats SLOW) and a small batch (SLOW)."""
    gpu = store.upsert_gpu(H200)
    for lens, config, ms in ((LENS, SLOW, 3.0), (LENS, FAST, 2.0), ((50, 60), SLOW, 0.1)):
        problem = Problem.varlen(H200.name, 128, lens, heads=32, kv_heads=8)
        pid = store.problem_id(problem, gpu)
        build = store.record_build(make_report(config))
        store.record_measurement(pid, build, ok_result(ms, problem), H200)


@pytest.fixture
def no_shipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command loads no packaged results and takes no settings from earlier tests."""
    monkeypatch.setattr("core.settings._overrides", {})
    monkeypatch.setattr("db.shipped.shipped_files", lambda: [])


@pytest.fixture
def cli_db(tmp_path: Path, no_shipped: None) -> str:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    with Store.from_url(url) as s:
        _seed_varlen(s)
    return url


def _best(url: str, *args: str, heads: bool = True) -> Result:
    gqa = ["--heads", "32", "--kv-heads", "8"] if heads else []
    return runner.invoke(
        cli_app,
        ["--db", url, "best", "--gpu", "H200", "--d", "128", *gqa, *args],
        env={"COLUMNS": "250"},  # one table row a line
    )


def _flat(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


def _json(url: str, *args: str) -> dict[str, Any]:
    result = _best(url, *args, "--json")
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_exact_lengths(cli_db: str) -> None:
    result = _best(cli_db, "--seqlens", "100,4000,1822,7")
    assert result.exit_code == 0, result.output
    flat = _flat(result.stdout)
    assert f"config {FAST.name}" in flat and "family fa2" in flat
    assert "measured at the lengths asked" in flat and "distance" not in flat
    assert "100,4000,1822,7 (4 sequences, 5929 tokens, longest 4000; 32 heads, 8 kv)" in flat
    problem = Problem.varlen(H200.name, 128, LENS, heads=32, kv_heads=8)
    assert f"TFLOP/s {problem.tflops(2.0):.1f}" in flat and "median 2.0000 ms" in flat

    data = _json(cli_db, "--seqlens", "100,4000,1822,7")
    assert data["config_name"] == FAST.name and data["config"]["family"] == "fa2"
    assert data["exact"] is True and data["distance"] == 0.0
    assert data["seqlens"] == list(LENS) and data["measured_seqlens"] == list(LENS)
    assert data["median_ms"] == 2.0 and data["tflops"] == pytest.approx(problem.tflops(2.0))
    assert (data["heads"], data["kv_heads"]) == (32, 8)


def test_nearest_lengths_say_where_they_were_measured(cli_db: str) -> None:
    result = _best(cli_db, "--seqlens", "3000,500,900")
    assert result.exit_code == 0, result.output
    flat = _flat(result.stdout)
    assert FAST.name in flat
    assert "measured at 100,4000,1822,7 (nearest tuned varlen batch, distance " in flat
    assert "4 sequences, 5929 tokens, longest 4000)" in flat
    data = _json(cli_db, "--seqlens", "3000,500,900")
    assert data["exact"] is False and data["distance"] > 0
    assert data["seqlens"] == [3000, 500, 900] and data["measured_seqlens"] == list(LENS)
    small = _json(cli_db, "--seqlens", "40,70")
    assert small["measured_seqlens"] == [50, 60] and small["config_name"] == SLOW.name
    # --exact refuses the nearest batch, with the usual not-found line.
    exact = _best(cli_db, "--seqlens", "3000,500,900", "--exact")
    assert exact.exit_code == 1 and "on exactly these lengths and heads" in exact.stderr


@pytest.mark.parametrize("lens", ["100,4000,1822,7", "3000,500,900", "40,70", "9"])
def test_answers_as_the_endpoint(cli_db: str, lens: str) -> None:
    """The CLI's JSON and /v1/best/varlen's body agree on every field they share."""
    data = _json(cli_db, "--seqlens", lens)
    with Store.from_url(cli_db) as store, TestClient(create_app(store)) as client:
        params = {"gpu": "H200", "d": 128, "heads": 32, "kv_heads": 8, "seqlens": lens}
        r = client.get("/v1/best/varlen", params=params)
    assert r.status_code == 200, r.text
    body = VarlenBestOut.model_validate(r.json())
    assert data["config_name"] == body.config.name
    assert data["config"]["family"] == body.config.family
    assert (data["exact"], data["distance"]) == (body.exact, body.distance)
    assert (data["seqlens"], data["measured_seqlens"]) == (body.seqlens, body.measured_seqlens)
    assert (data["median_ms"], data["tflops"]) == (body.median_ms, body.tflops)
    assert (data["heads"], data["kv_heads"]) == (body.heads, body.kv_heads)


def test_default_heads_as_the_endpoint(cli_db: str) -> None:
    """Without --heads, 16 query heads (and as many KV heads) are asked: nothing exact."""
    data = json.loads(_best(cli_db, "--seqlens", "100,4000,1822,7", "--json", heads=False).stdout)
    assert data["exact"] is False and data["measured_seqlens"] == list(LENS)


def test_shipped_varlen_results_answer_the_workload(tmp_path: Path, no_shipped: None) -> None:
    """db/data/h200_results_varlen.json answers bench/h200/varlen_workload.yaml's lengths
    exactly, for both dtypes and masks, with a verified ``_vl`` config."""
    (entry,) = yaml.safe_load(WORKLOAD.read_text())["shapes"]
    lens = ",".join(str(n) for n in entry["seqlens"])
    url = f"sqlite:///{tmp_path / 'shipped.db'}"
    with Store.from_url(url) as store:
        from db.shipped import load_shipped_results

        assert load_shipped_results(store, [SHIPPED_VARLEN]) > 0
    for dtype in ("fp16", "bf16"):
        for mask in ("--no-causal", "--causal"):
            args = ["--gpu", "NVIDIA H200", "--dtype", dtype, mask, "--seqlens", lens]
            data = _json(url, *args)
            assert data["exact"] is True and data["measured_seqlens"] == entry["seqlens"]
            assert data["config_name"].endswith("_vl")
            assert data["config"]["causal"] is (mask == "--causal")
            assert data["tflops"] > 0 and data["max_abs_err"] is not None
            table = _best(url, *args)
            assert table.exit_code == 0, table.output
            assert f"config {data['config_name']}" in _flat(table.stdout)


@pytest.mark.parametrize(
    ("args", "option", "needle"),
    [
        (["--seqlens", "1,0"], "--seqlens", "must be positive integers separated by commas"),
        (["--seqlens", "a,b"], "--seqlens", "must be positive integers separated by commas"),
        (["--seqlens", ""], "--seqlens", "must be positive integers separated by commas"),
        (["--seqlens", "100, 200"], "--seqlens", "must be positive integers separated by commas"),
        (["--seqlens", "2147483648"], "--seqlens", "each length must be between 1 and 2147483647"),
        (["--seqlens", "2147483647,1"], "--seqlens", "add up to 2147483648"),
        (["--seqlens", "5", "--kv-heads", "3"], "--kv-heads", "heads (32) must be a multiple"),
        (["--seqlens", "5", "--n", "5"], "--seqlens", "cannot be combined with --n"),
        (["--seqlens", "5", "--nq", "5"], "--seqlens", "cannot be combined with --nq"),
        (["--seqlens", "5", "--nk", "5"], "--seqlens", "cannot be combined with --nk"),
        (["--seqlens", "5", "--batch", "2"], "--seqlens", "cannot be combined with --batch"),
    ],
)
def test_bad_input_exits_2(cli_db: str, args: list[str], option: str, needle: str) -> None:
    result = _best(cli_db, *args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert option in lines[0] and needle in lines[0], lines[0]


@pytest.mark.parametrize(
    ("seqlens", "heads"),
    [("1,0", 32), ("", 32), ("7,a", 32), ("2147483648", 32), ("2147483647,1", 32), ("5", 12)],
)
def test_bad_input_worded_as_the_endpoint(cli_db: str, seqlens: str, heads: int) -> None:
    """The CLI's error line carries the 422's message for the same parameter."""
    gqa = ["--heads", str(heads), "--kv-heads", "8"]
    result = _best(cli_db, "--seqlens", seqlens, *gqa, heads=False)
    assert result.exit_code == 2, result.output
    with Store.from_url(cli_db) as store, TestClient(create_app(store)) as client:
        params = {"gpu": "H200", "d": 128, "seqlens": seqlens, "heads": heads, "kv_heads": 8}
        r = client.get("/v1/best/varlen", params=params)
    assert r.status_code == 422, r.text
    (error,) = ValidationErrorOut.model_validate(r.json()).errors
    option = "--" + str(error.loc[-1]).replace("_", "-")
    assert f"Invalid value for {option}: {error.msg} " in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (["--causal"], "'H200', D=128, fp16, causal"),
        (["--dtype", "bf16"], "'H200', D=128, bf16, full"),
        (["--d", "64"], "'H200', D=64, fp16, full"),
    ],
)
def test_no_varlen_results(cli_db: str, args: list[str], where: str) -> None:
    result = _best(cli_db, "--seqlens", "5", *args)
    assert result.exit_code == 1, result.output
    assert result.stdout == "" and "Traceback" not in result.output
    assert f"no varlen results for {where}; tune it first" in result.stderr


def test_dense_results_do_not_answer_varlen(tmp_path: Path, no_shipped: None) -> None:
    """A database with dense results only says there are no varlen results, as the 404 does."""
    url = f"sqlite:///{tmp_path / 'dense.db'}"
    with Store.from_url(url) as store:
        seed_measurement(store)
    result = _best(url, "--seqlens", "128,128")
    assert result.exit_code == 1, result.output
    assert "no varlen results for 'H200', D=128, fp16, full" in result.stderr
    with Store.from_url(url) as store, TestClient(create_app(store)) as client:
        r = client.get("/v1/best/varlen", params={"gpu": "H200", "d": 128, "seqlens": "128,128"})
    assert r.status_code == 404 and r.json()["detail"] in result.stderr


def test_long_length_lists_are_shortened_in_the_table(cli_db: str) -> None:
    """The table lists the first 24 lengths and a count; the JSON keeps every one."""
    lens = ",".join(["300"] * 30)
    flat = _flat(_best(cli_db, "--seqlens", lens).stdout)
    assert ",".join(["300"] * 24) + ",... (6 more) (30 sequences, 9000 tokens" in flat
    assert _json(cli_db, "--seqlens", lens)["seqlens"] == [300] * 30
