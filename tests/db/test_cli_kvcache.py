"""``fa2tune best --kv-page`` through the real CLI: a layout answered by its own results only,
a dense call by dense ones only, bad pages one clear line (exit status 2)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from core.problem import Problem
from core.splitkv_config import SplitKvConfig
from db.store import Store
from fa2tune.cli import app
from tests.support.factories import ok_result, seed_measurement

runner = CliRunner()
DENSE = SplitKvConfig(128, "fp16", False)
PAGED = dataclasses.replace(DENSE, splits=32, kvcache=True, page=16)
SHAPE = ["--nq", "1", "--nk", "8192", "--batch", "8", "--heads", "32", "--kv-heads", "8"]


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("core.settings._overrides", {})
    monkeypatch.setattr("db.shipped.shipped_files", lambda: [])


def _seed(url: str) -> None:
    with Store.from_url(url) as store:
        dense = Problem(gpu="H200", d=128, n=1, nk=8192, batch=8, heads=32, kv_heads=8)
        seed_measurement(store, problem=dense, config=DENSE,
                         result=ok_result(0.03, dense))  # fmt: skip
        paged = dataclasses.replace(dense, kv_page=16)
        seed_measurement(store, problem=paged, config=PAGED,
                         result=ok_result(0.05, paged))  # fmt: skip


def _best(url: str, *extra: str) -> tuple[int, str]:
    args = ["--db", url, "best", "--gpu", "H200", "--d", "128", *SHAPE]
    result = runner.invoke(app, [*args, *extra])
    return result.exit_code, result.output


def test_best_answers_a_layout_from_its_own_results(sqlite_url: str) -> None:
    _seed(sqlite_url)
    code, out = _best(sqlite_url, "--kv-page", "16", "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["config_name"] == PAGED.name and data["kv_page"] == 16
    assert data["asked_kv_page"] == 16 and data["exact"]
    code, out = _best(sqlite_url, "--json")
    assert code == 0 and json.loads(out)["config_name"] == DENSE.name
    assert "kv_page" not in json.loads(out)
    code, out = _best(sqlite_url, "--kv-page", "16")
    assert code == 0 and "KV cache" in out and "16-token pages" in out


def test_best_nothing_for_another_layout(sqlite_url: str) -> None:
    _seed(sqlite_url)
    code, out = _best(sqlite_url, "--kv-page", "0")
    assert code == 1 and "contiguous KV cache" in out


@pytest.mark.parametrize(("extra", "hint"), [
    (["--kv-page", "3"], "--kv-page"),
    (["--kv-page", "-16"], "--kv-page"),
    (["--kv-page", "8192"], "--kv-page"),
    (["--kv-page", "x"], "--kv-page"),
])  # fmt: skip
def test_bad_pages_are_one_clear_line(sqlite_url: str, extra: list[str], hint: str) -> None:
    code, out = _best(sqlite_url, *extra)
    assert code == 2 and hint in out and "Traceback" not in out


def test_a_cache_call_takes_no_seqlens(sqlite_url: str) -> None:
    args = ["--db", sqlite_url, "best", "--gpu", "H200", "--d", "128", "--seqlens", "10,20",
            "--kv-page", "16"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "--seqlens" in result.output
