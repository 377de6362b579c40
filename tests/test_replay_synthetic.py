"""A synthetic but structured replay table (shared by the search and campaign tests), and
tests of the replay module itself.

Time is a smooth product of per-parameter factors, so there is one best config and the
parameters carry signal a model-based sampler can learn; some configs fail at build time
(spills, compile failures) or verification (wrong results).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from codegen.families.fa2.space import enumerate_space
from core.build_report import BuildStatus
from core.fa2_config import Fa2Config
from core.problem import Problem
from core.records import GpuInfo, MeasureResult, MeasureStatus
from db.store import Store
from tuner.campaign import CampaignOptions
from tuner.replay import ReplayMeasure, run_replay_campaign
from tuner.replay_table import (
    ReplayEntry,
    ReplayTable,
    export_replay_table,
    load_replay_table,
    save_replay_table,
)
from tuner.search import params_of

GPU = GpuInfo(
    name="Test GPU",
    compute_capability="9.0",
    sm_count=132,
    driver_version="560.0",
    cuda_version="12.6",
    memory_bytes=141 * 2**30,
    smem_optin_bytes=227 * 1024,
)

LAYOUT_FACTOR = {"swz": 0.97, "pad8": 1.0, "pad16": 1.03, "pad0": 1.25}


def _layout(config: Fa2Config) -> object:
    return params_of(config)["layout"]


def small_space(d: int = 64, causal: bool = False) -> list[Fa2Config]:
    """A slice of the real space: ~two dozen configs."""
    return [
        c
        for c in enumerate_space(d, "fp16", causal)
        if c.br in (64, 128) and c.bc in (64, 128) and c.stages in (1, 2)
        and _layout(c) in ("pad8", "swz", "pad0")
    ]  # fmt: skip


def tiny_space(d: int = 64, causal: bool = False) -> list[Fa2Config]:
    """Two stages only: ~two dozen configs with every kind of failure, for quick campaigns."""
    return [c for c in small_space(d, causal) if c.stages == 2]


def medium_space(d: int = 64, causal: bool = False) -> list[Fa2Config]:
    """A larger slice, ~100 configs, for sampler comparisons."""
    return [c for c in enumerate_space(d, "fp16", causal) if c.stages <= 2 and c.br <= 128]


def synthetic_time(config: Fa2Config, n: int) -> float:
    """Milliseconds: a smooth function of the parameters, best at 128x64/16rpw/2st/swz."""
    t = (n / 1024) ** 2 * 0.05
    t *= 1 + 0.18 * abs(math.log2(config.br / 128))
    t *= 1 + 0.11 * abs(math.log2(config.bc / 64))
    t *= 1.0 if config.rows_per_warp == 16 else 1.09
    t *= 1.0 if config.stages == 2 else 1.06
    t *= LAYOUT_FACTOR[_layout(config)]
    return t


def synthetic_entry(config: Fa2Config, n: int) -> ReplayEntry:
    """Failures on structured corners, never on the best config."""
    if config.bc >= 128 and config.rows_per_warp == 32:
        # A heavy spill, over the default limit: recorded untimed.
        return ReplayEntry(status="SPILLS", build_status="SPILLS", spill_bytes=512)
    if config.br == 64 and config.bc == 128 and _layout(config) == "pad0":
        return ReplayEntry(status="COMPILE_FAILED", build_status="COMPILE_FAILED")
    if _layout(config) == "pad0" and config.stages == 2:
        return ReplayEntry(status="WRONG_RESULT", build_status="OK")
    return ReplayEntry(status="OK", median_ms=synthetic_time(config, n), build_status="OK")


def problems_for(ns: Iterable[int], d: int = 64, causal: bool = False) -> list[Problem]:
    return [Problem(gpu=GPU.name, d=d, n=n, causal=causal) for n in ns]


def synthetic_table(
    problems: Iterable[Problem],
    space: list[Fa2Config] | Callable[[int, bool], list[Fa2Config]] = small_space,
) -> ReplayTable:
    """The synthetic table of ``problems`` over ``space`` (a list, or a function of D and
    causal)."""
    studies = {}
    by_study = {}
    for p in problems:
        configs = space(p.d, p.causal) if callable(space) else space
        studies[p.study_name] = {c.name: synthetic_entry(c, p.n) for c in configs}
        by_study[p.study_name] = p
    return ReplayTable(studies=studies, problems=by_study, gpu=GPU, arch="sm_90")


def open_store(tmp_path: Path) -> Store:
    return Store.from_url(f"sqlite:///{tmp_path / 'results.db'}")


def optuna_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'studies.db'}"


# ------------------------------------------------------------------------------------------


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
