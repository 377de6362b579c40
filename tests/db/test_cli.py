"""The ``best``, ``dump`` and ``ingest`` sub-commands, through the real CLI against temp DBs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from core.problem import Problem
from core.records import MeasureStatus
from db.dump_format import load_dump
from db.models import Measurement
from db.store import Store
from db.transfer import dump
from fa2tune.cli import app
from tests.support.factories import H200, failed_result, make_config, ok_result, seed_measurement

runner = CliRunner()
WINNER = make_config(br=128, bc=64, warps=8, stages=2)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    # --db is a process-wide override; never let one test's URL leak into another, and keep
    # the package's shipped results (if any) out of these databases unless a test opts in.
    monkeypatch.setattr("core.settings._overrides", {})
    monkeypatch.setattr("db.shipped.shipped_files", lambda: [])


def _seed(url: str) -> None:
    with Store.from_url(url) as store:
        problem = Problem(gpu="H200", d=128, n=4096)
        seed_measurement(store, problem=problem, config=make_config(br=64))
        seed_measurement(store, problem=problem, config=WINNER, result=ok_result(0.75, problem))
        seed_measurement(
            store,
            problem=problem,
            config=make_config(br=64, bc=32),
            result=failed_result(MeasureStatus.WRONG_RESULT, 0.1),
        )


def _measurements(url: str) -> int:
    with Store.from_url(url) as store, store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(Measurement)).scalar_one())


def test_best_prints_a_table(sqlite_url: str) -> None:
    _seed(sqlite_url)
    result = runner.invoke(app, ["--db", sqlite_url, "best", "--gpu", "h200", "--d", "128",
                                 "--n", "4096"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert WINNER.name in result.stdout
    assert "0.7500 ms" in result.stdout
    assert "NVIDIA H200" in result.stdout
    assert "nearest" not in result.stdout


def test_best_json(sqlite_url: str) -> None:
    _seed(sqlite_url)
    result = runner.invoke(
        app,
        ["--db", sqlite_url, "best", "--gpu", "NVIDIA H200", "--d", "128", "--n", "4096",
         "--dtype", "fp16", "--no-causal", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["config_name"] == WINNER.name
    assert data["config"]["stages"] == 2
    assert data["median_ms"] == pytest.approx(0.75)
    assert (data["exact"], data["from_n"]) == (True, 4096)


def test_best_nearest_and_exact(sqlite_url: str) -> None:
    _seed(sqlite_url)
    args = ["--db", sqlite_url, "best", "--gpu", "H200", "--d", "128", "--n", "3000"]
    near = runner.invoke(app, [*args, "--json"])
    assert near.exit_code == 0, near.output
    assert (json.loads(near.stdout)["exact"], json.loads(near.stdout)["from_n"]) == (False, 4096)
    assert "nearest tuned N" in runner.invoke(app, args).stdout

    exact = runner.invoke(app, [*args, "--exact"])
    assert exact.exit_code == 1
    assert "no successful measurement" in exact.stderr


def test_best_not_found_exits_1(sqlite_url: str) -> None:
    _seed(sqlite_url)
    for extra in (["--causal"], ["--dtype", "bf16"], ["--gpu", "H100"]):
        args = ["--db", sqlite_url, "best", "--gpu", "H200", "--d", "128", "--n", "4096", *extra]
        result = runner.invoke(app, args)
        assert result.exit_code == 1, (extra, result.output)
        assert "no successful measurement" in result.stderr
        assert result.stdout == ""


def test_best_rejects_a_bad_dtype(sqlite_url: str) -> None:
    args = ["--db", sqlite_url, "best", "--gpu", "H200", "--d", "128", "--n", "1", "--dtype", "fp8"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert "fp16" in result.stderr


def test_best_answers_from_shipped_results_on_a_fresh_database(
    tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = tmp_path / "h200_results.json"
    source = f"sqlite:///{tmp_path / 'tuned.db'}"
    _seed(source)
    with Store.from_url(source) as store:
        dump(store, shipped, gpu="H200")
    monkeypatch.setattr("db.shipped.shipped_files", lambda: [shipped])

    args = ["--db", sqlite_url, "best", "--gpu", "H200", "--d", "128", "--n", "4096", "--json"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["config_name"] == WINNER.name
    assert runner.invoke(app, args).exit_code == 0
    assert _measurements(sqlite_url) == 3  # loaded once, not twice


def test_dump_to_file_and_stdout(sqlite_url: str, tmp_path: Path) -> None:
    _seed(sqlite_url)
    out = tmp_path / "dumps" / "all.json"
    result = runner.invoke(app, ["--db", sqlite_url, "dump", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "dumped 3 measurements" in result.stderr
    data = load_dump(out)
    assert len(data.measurements) == 3
    assert {m.status for m in data.measurements} == {MeasureStatus.OK, MeasureStatus.WRONG_RESULT}

    to_stdout = runner.invoke(app, ["--db", sqlite_url, "dump", "--gpu", "nvidia h200"])
    assert to_stdout.exit_code == 0, to_stdout.output
    assert len(json.loads(to_stdout.stdout)["measurements"]) == 3
    assert len(json.loads(runner.invoke(app, ["--db", sqlite_url, "dump", "--gpu", "H100"])
                          .stdout)["measurements"]) == 0  # fmt: skip


def test_ingest_adds_then_skips(sqlite_url: str, tmp_path: Path) -> None:
    _seed(sqlite_url)
    out = tmp_path / "all.json"
    assert runner.invoke(app, ["--db", sqlite_url, "dump", "-o", str(out)]).exit_code == 0
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"

    first = runner.invoke(app, ["--db", fresh, "ingest", str(out)])
    assert first.exit_code == 0, first.output
    assert "added 3 measurements, skipped 0" in first.stdout
    second = runner.invoke(app, ["--db", fresh, "ingest", str(out)])
    assert second.exit_code == 0, second.output
    assert "added 0 measurements, skipped 3" in second.stdout
    assert _measurements(fresh) == 3

    best = runner.invoke(app, ["--db", fresh, "best", "--gpu", "H200", "--d", "128", "--n",
                               "4096", "--json"])  # fmt: skip
    assert json.loads(best.stdout)["config_name"] == WINNER.name


def test_ingest_rejects_an_invalid_file_and_writes_nothing(sqlite_url: str, tmp_path: Path) -> None:
    _seed(sqlite_url)
    out = tmp_path / "all.json"
    assert runner.invoke(app, ["--db", sqlite_url, "dump", "-o", str(out)]).exit_code == 0
    data = json.loads(out.read_text())
    data["measurements"][-1]["median_ms"] = -3  # one bad record among good ones
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"

    result = runner.invoke(app, ["--db", fresh, "ingest", str(bad)])
    assert result.exit_code == 2
    assert "measurements.2.median_ms" in result.stderr
    assert "nothing was ingested" in result.stderr
    assert _measurements(fresh) == 0

    garbage = tmp_path / "garbage.json"
    garbage.write_text("not json at all")
    result = runner.invoke(app, ["--db", fresh, "ingest", str(garbage)])
    assert result.exit_code == 2
    assert "invalid results file" in result.stderr

    missing = runner.invoke(app, ["--db", fresh, "ingest", str(tmp_path / "nope.json")])
    assert missing.exit_code == 2
    assert _measurements(fresh) == 0


def test_commands_use_the_settings_url_without_db_flag(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _seed(sqlite_url)
    monkeypatch.setattr("core.settings._overrides", {"db_url": sqlite_url})
    result = runner.invoke(app, ["best", "--gpu", "H200", "--d", "128", "--n", "4096", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["config_name"] == WINNER.name
    assert H200.name in result.stdout
