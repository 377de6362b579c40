"""Tests of the replay module itself, over the synthetic table of :mod:`tests.support.replay`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.build_report import BuildStatus
from core.fa2_config import Fa2Config
from core.problem import Problem
from core.records import MeasureResult, MeasureStatus
from tests.support.replay import (
    GPU,
    open_store,
    optuna_url,
    problems_for,
    small_space,
    synthetic_table,
)
from tuner.campaign import CampaignOptions
from tuner.replay import ReplayMeasure, run_replay_campaign
from tuner.replay_table import (
    ReplayTable,
    export_replay_table,
    load_replay_table,
    save_replay_table,
)


def test_synthetic_best_is_ok_and_unique() -> None:
    (p,) = problems_for([1024])
    table = synthetic_table([p])
    best = table.best(p.study_name)
    assert best is not None
    name, _ = best
    assert name == "fa2_d64_fp16_full_br128_bc64_w8_s2_swz"
    statuses = {e.status for e in table.studies[p.study_name].values()}
    assert {"OK", "SPILLS", "WRONG_RESULT", "COMPILE_FAILED"} <= statuses


def test_table_round_trips_through_json(tmp_path: Path) -> None:
    table = synthetic_table(problems_for([512, 1024]))
    path = tmp_path / "t.json"
    save_replay_table(table, path)
    again = load_replay_table(path)
    assert again.studies == table.studies
    assert again.problems == table.problems
    assert again.gpu == table.gpu


def test_bare_table_form_is_accepted(tmp_path: Path) -> None:
    (p,) = problems_for([512])
    path = tmp_path / "bare.json"
    name = small_space()[0].name
    path.write_text(json.dumps({p.study_name: {name: {"status": "OK", "median_ms": 0.5}}}))
    table = load_replay_table(path)
    assert table.studies[p.study_name][name].median_ms == 0.5
    assert table.gpu is None


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[1, 2]",
        '{"x": {"not_a_config": {"status": "OK"}}}',
        '{"x": {"fa2_d64_fp16_full_br128_bc64_w8_s2_swz": {"status": "FAST"}}}',
        '{"format": "something-else/9", "problems": {}}',
    ],
)
def test_bad_tables_are_rejected(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError):
        load_replay_table(path)


def test_replay_measure_answers_from_the_table() -> None:
    (p,) = problems_for([2048])
    table = synthetic_table([p])
    replay = ReplayMeasure(table)
    configs = replay.space(p)
    reports = {r.config.name: r for r in replay.build(configs)}
    for c in configs:
        entry = table.studies[p.study_name][c.name]
        report = reports[c.name]
        assert str(report.status) == (entry.build_status or "OK")
        if entry.status == "OK":
            assert report.usable
            result = replay(report, p)
            assert result.status == MeasureStatus.OK
            assert result.median_ms == entry.median_ms
            assert result.tflops is not None and result.tflops > 0
    assert reports[configs[0].name].status in set(BuildStatus)
    missing = Fa2Config(64, "fp16", False, 256, 256, 8, 4, pad=16)
    assert replay.measure(missing, p).status == MeasureStatus.SKIPPED
    with pytest.raises(KeyError, match="no problem"):
        replay.space(Problem(gpu=GPU.name, d=128, n=1))


@pytest.mark.slow
def test_export_replay_table_from_a_store(tmp_path: Path) -> None:
    problems = problems_for([512, 1024])
    table = synthetic_table(problems)
    with open_store(tmp_path) as store:
        run_replay_campaign(
            table,
            CampaignOptions(sampler="grid"),
            store=store,
            storage_url=optuna_url(tmp_path),
            problems=problems,
            seeds_fn=lambda p: [],
        )
        # A second, slower OK measurement of the best must not replace the faster one.
        exported = export_replay_table(store, "test gpu")
        with pytest.raises(ValueError, match="no GPU"):
            export_replay_table(store, "H100")
    again = ReplayTable.from_dict(exported)
    assert set(again.studies) == {p.study_name for p in problems}
    for p in problems:
        assert again.best(p.study_name) == table.best(p.study_name)
        for name, entry in table.studies[p.study_name].items():
            got = again.studies[p.study_name][name]
            assert got.status == entry.status
            assert got.median_ms == entry.median_ms
        assert again.problems[p.study_name] == p
    assert again.gpu is not None and again.gpu.name == GPU.name


def test_replay_measure_tflops_match_problem_flops() -> None:
    (p,) = problems_for([4096])
    table = synthetic_table([p])
    name, ms = table.best(p.study_name)  # type: ignore[misc]
    result: MeasureResult = ReplayMeasure(table).measure(Fa2Config.from_name(name), p)
    assert result.tflops == pytest.approx(p.tflops(ms))
