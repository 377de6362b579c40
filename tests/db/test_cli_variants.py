"""``fa2tune best`` with attention-variant options, through the real CLI."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from core.problem import Problem
from core.variant import Variant
from db.store import Store
from fa2tune.cli import app
from tests.support.factories import make_config, ok_result, seed_measurement

runner = CliRunner()
WINDOW = Variant(window_left=4096, window_right=0)
LOCAL = dataclasses.replace(make_config(causal=True, br=64), local=True)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("core.settings._overrides", {})
    monkeypatch.setattr("db.shipped.shipped_files", lambda: [])


def _seed(url: str) -> None:
    with Store.from_url(url) as store:
        plain = Problem(gpu="H200", d=128, n=16384, causal=True)
        seed_measurement(store, problem=plain, config=make_config(causal=True))
        windowed = dataclasses.replace(plain, variant=WINDOW)
        seed_measurement(store, problem=windowed, config=LOCAL,
                         result=ok_result(0.5, windowed))  # fmt: skip


def _best(url: str, *extra: str) -> tuple[int, str]:
    args = ["--db", url, "best", "--gpu", "H200", "--d", "128", "--n", "16384", "--causal"]
    result = runner.invoke(app, [*args, *extra])
    return result.exit_code, result.output


@pytest.mark.parametrize("spelling", [["--window", "4096,0"], ["--window-left", "4096"]])
def test_best_answers_a_window_from_its_own_results(sqlite_url: str, spelling: list[str]) -> None:
    _seed(sqlite_url)
    code, out = _best(sqlite_url, *spelling, "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["config_name"] == LOCAL.name and data["window_left"] == 4096
    assert data["asked_variant"]["window_left"] == 4096
    code, out = _best(sqlite_url, "--json")
    assert code == 0 and json.loads(out)["config_name"] != LOCAL.name
    assert "window_left" not in json.loads(out)
    code, out = _best(sqlite_url, "--window", "4096,0")
    assert code == 0 and "variant" in out and "window (4096, 0)" in out


def test_best_nothing_for_other_switches(sqlite_url: str) -> None:
    _seed(sqlite_url)
    code, out = _best(sqlite_url, "--sinks")
    assert code == 1 and "sinks" in out


@pytest.mark.parametrize(
    ("extra", "hint"),
    [
        (["--window", "4096"], "--window"),
        (["--window", "a,b"], "--window"),
        (["--window", "4096,0", "--window-left", "5"], "--window"),
        (["--window-left", "-2"], "--window-left"),
        (["--chunk", "-1"], "--chunk"),
        (["--softcap", "-1"], "--softcap"),
        (["--softcap", "inf"], "--softcap"),
    ],
)
def test_bad_variant_options_are_one_clear_line(
    sqlite_url: str, extra: list[str], hint: str
) -> None:
    code, out = _best(sqlite_url, *extra)
    assert code == 2 and hint in out
    assert "Traceback" not in out
