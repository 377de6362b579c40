"""``fa2tune replay-table``: a database's measurements as a table ``tune --replay`` answers.

Through the real ``fa2tune`` application (CPU): the shipped variants' results ingested into a
scratch database, written as a table, then a replay campaign over one of its variant problems
finds the shipped winner again; a GPU the database does not have is a usage error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fa2tune.cli import app

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ROOT / "db" / "data" / "h200_results_variants.json"
WINDOWED_DECODE = "nvidia-h200_d128_n1_nk32768_b8_h32_kv8_bf16_full_wl4096_wr-1"


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'results.db'}"
    result = CliRunner().invoke(app, ["--db", url, "ingest", str(VARIANTS)])
    assert result.exit_code == 0, result.output
    return url


def test_table_of_a_database_replays_its_variant_problem(db: str, tmp_path: Path) -> None:
    table = tmp_path / "table.json"
    runner = CliRunner()
    result = runner.invoke(app, ["--db", db, "replay-table", "--gpu", "H200", "--no-shipped",
                                 "-o", str(table)])  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(table.read_text())
    assert len(data["problems"]) == 52  # the file's problems, variants kept apart
    entry = data["problems"][WINDOWED_DECODE]
    assert entry["problem"]["window_left"] == 4096
    fastest = min((e["median_ms"], name) for name, e in entry["configs"].items()
                  if e["status"] == "OK")  # fmt: skip
    summary = tmp_path / "summary.json"
    args = ["tune", "--replay", str(table), "--d", "128", "--nq", "1", "--nk", "32768",
            "--batch", "8", "--heads", "32", "--kv-heads", "8", "--dtype", "bf16", "--causal",
            "no", "--window", "4096,-1", "--family", "splitkv", "--sampler", "grid",
            "--summary-json", str(summary)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    (row,) = json.loads(summary.read_text())["problems"]
    assert (row["best_config"], row["best_ms"]) == (fastest[1], fastest[0])


def test_unknown_gpu_is_a_usage_error(db: str) -> None:
    result = CliRunner().invoke(app, ["--db", db, "replay-table", "--gpu", "B200", "--no-shipped"])
    assert result.exit_code == 2
    assert "no GPU named 'B200'" in result.output
