"""bench/compare_samplers.py on synthetic tables: exhaustive ones are compared, the others
are skipped (never crash), and a config missing from a table is a clear error."""

from __future__ import annotations

import importlib.util
import logging
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from codegen.families.fa2.space import enumerate_space
from core.fa2_config import Fa2Config
from core.problem import Problem
from tests.support.replay import (
    GPU,
    open_store,
    optuna_url,
    problems_for,
    synthetic_table,
)
from tuner.campaign import CampaignOptions, _defaults
from tuner.replay import ReplayMeasure, ReplayMissingError, run_replay_campaign
from tuner.replay_table import ReplayEntry, ReplayTable, save_replay_table

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "compare_samplers.py"

# A GPU with little shared memory has a small valid space (30 configs for D=64 fp16), so a
# table can cover it whole and a replay of it stays quick.
SMEM = 24 * 1024
SMALL_GPU = replace(GPU, smem_optin_bytes=SMEM)


def _load() -> object:
    spec = importlib.util.spec_from_file_location("compare_samplers", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["compare_samplers"] = module  # so worker processes can unpickle run_one
    spec.loader.exec_module(module)
    return module


def full_space(d: int = 64, causal: bool = False) -> list[Fa2Config]:
    """Every valid config on SMALL_GPU: what ``fa2tune tune`` would search there."""
    return enumerate_space(d, "fp16", causal, SMEM)


def exhaustive_table(problems: list[Problem]) -> ReplayTable:
    """A grid campaign's export: every valid config of every problem has an outcome."""
    table = synthetic_table(problems, full_space)
    table.gpu = SMALL_GPU
    return table


def tpe_like_table(exhaustive: list[Problem], partial: list[Problem]) -> ReplayTable:
    """``exhaustive`` covered whole; ``partial`` with a third of the space recorded, as a TPE
    campaign leaves it (the real H200 database holds 20-60 of ~300 configs per problem)."""
    table = exhaustive_table([*exhaustive, *partial])
    for p in partial:
        entries = sorted(table.studies[p.study_name].items())
        table.studies[p.study_name] = dict(entries[::3])
    return table


def test_valid_space_is_the_campaigns_default_space() -> None:
    cmp = _load()
    for p in [*problems_for([512]), *problems_for([512], d=128, causal=True)]:
        for gpu in (GPU, SMALL_GPU):
            default_space = _defaults("sm_90", gpu, None, None, None)[0]
            fa2 = [c for c in default_space(p) if c.family == "fa2"]
            assert cmp.valid_space(p, gpu, "sm_90") == fa2  # type: ignore[attr-defined]


def test_table_missing_lists_configs_without_an_outcome() -> None:
    (p,) = problems_for([512])
    table = exhaustive_table([p])
    space = full_space()
    assert table.missing(p.study_name, space) == []
    entries = table.studies[p.study_name]
    dropped, skipped, spills = space[0], space[1], space[2]
    del entries[dropped.name]
    entries[skipped.name] = ReplayEntry(status="SKIPPED")  # says nothing about the config
    entries[spills.name] = ReplayEntry(status="SPILLS", build_status="SPILLS")  # an outcome
    assert table.missing(p.study_name, space) == [dropped, skipped]
    assert table.missing("no such study", space[:2]) == space[:2]


@pytest.mark.slow
def test_compare_samplers_prints_trials_to_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cmp = _load()
    problems = problems_for([512])
    path = tmp_path / "table.json"
    save_replay_table(exhaustive_table(problems), path)
    code = cmp.main(  # type: ignore[attr-defined]
        [str(path), "--seeds", "2", "--max-trials", "12", "--jobs", "2"]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert problems[0].study_name[:20] in out
    assert "tpe" in out and "random" in out and "/2)" in out
    assert "Skipped" not in out


@pytest.mark.slow
def test_run_one_counts_gpu_trials(tmp_path: Path) -> None:
    cmp = _load()
    problems = problems_for([512])
    table = exhaustive_table(problems)
    path = tmp_path / "table.json"
    save_replay_table(table, path)
    gpu_configs = sum(
        e.status not in ("SPILLS", "COMPILE_FAILED")
        for e in table.studies[problems[0].study_name].values()
    )
    # A budget of every GPU config: the target is always reached, the best always found.
    result = cmp.run_one(  # type: ignore[attr-defined]
        str(path), problems[0].study_name, "random", 0, gpu_configs, 0.02, True
    )
    assert result.to_target is not None and 1 <= result.to_target <= gpu_configs
    assert result.gpu_trials == gpu_configs
    assert result.best_gap == 0.0


@pytest.mark.slow
def test_non_exhaustive_problems_are_skipped_not_crashed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # The bug: over a problem whose table held a third of its space (a TPE campaign's), the
    # replay searched that handful, ran out of unseen configs and died in a worker with
    # "RuntimeError: generator raised StopIteration". Such a problem is now skipped.
    cmp = _load()
    whole, partial = problems_for([512, 1024])
    path = tmp_path / "table.json"
    save_replay_table(tpe_like_table([whole], [partial]), path)
    with caplog.at_level(logging.WARNING, logger="compare_samplers"):
        code = cmp.main(  # type: ignore[attr-defined]
            [str(path), "--seeds", "2", "--max-trials", "8", "--jobs", "2"]
        )
    assert code == 0
    out = capsys.readouterr().out
    compared, _, skipped = out.partition("Skipped")
    assert whole.study_name in compared and "/2)" in compared
    assert partial.study_name not in compared
    assert partial.study_name in skipped and "not exhaustive" in skipped
    notes = [r.getMessage() for r in caplog.records if r.name == "compare_samplers"]
    assert any(
        partial.study_name in n and "not exhaustive: 20 of 30 valid configs" in n for n in notes
    ), notes


def test_only_non_exhaustive_problems_is_a_clean_exit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cmp = _load()
    whole, partial = problems_for([512, 1024])
    path = tmp_path / "table.json"
    save_replay_table(tpe_like_table([whole], [partial]), path)
    code = cmp.main([str(path), "--problems", "n1024", "--jobs", "1"])  # type: ignore[attr-defined]
    assert code == 1
    out = capsys.readouterr().out
    assert partial.study_name in out and "nothing to compare" in out


def test_run_one_refuses_a_non_exhaustive_problem(tmp_path: Path) -> None:
    cmp = _load()
    whole, partial = problems_for([512, 1024])
    path = tmp_path / "table.json"
    save_replay_table(tpe_like_table([whole], [partial]), path)
    with pytest.raises(ValueError, match="not exhaustive: 20 of 30 valid configs"):
        cmp.run_one(  # type: ignore[attr-defined]
            str(path), partial.study_name, "random", 0, 30, 0.02, True
        )


@pytest.mark.slow
def test_a_config_missing_from_the_table_is_a_clear_error(tmp_path: Path) -> None:
    (p,) = problems_for([512])
    table = exhaustive_table([p])
    missing = full_space()[5]
    del table.studies[p.study_name][missing.name]
    replay = ReplayMeasure(table, strict=True)
    with pytest.raises(ReplayMissingError, match=f"no entry for config {missing.name}"):
        replay.measure(missing, p)
    assert ReplayMeasure(table).measure(missing, p).status == "SKIPPED"  # lenient default
    # Searched over the whole space, the search proposes it (first, as a seed) and the error
    # comes out of the campaign as it is, not as a StopIteration.
    with open_store(tmp_path) as store, pytest.raises(ReplayMissingError, match=missing.name):
        run_replay_campaign(
            replay,
            CampaignOptions(sampler="random", trials=5),
            store=store,
            storage_url=optuna_url(tmp_path),
            problems=[p],
            space_fn=lambda _: full_space(),
            seeds_fn=lambda _: [missing],
        )


@pytest.mark.slow
def test_export_from_db_then_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cmp = _load()
    problems = problems_for([1024])
    with open_store(tmp_path) as store:
        run_replay_campaign(
            exhaustive_table(problems),
            CampaignOptions(sampler="grid"),
            store=store,
            storage_url=optuna_url(tmp_path),
            problems=problems,
            seeds_fn=lambda p: [],
        )
    out_path = tmp_path / "exported.json"
    db = f"sqlite:///{tmp_path / 'results.db'}"
    args = [str(out_path), "--from-db", db, "--gpu", GPU.name, "--seeds", "1",
            "--max-trials", "5", "--samplers", "tpe", "--jobs", "1"]  # fmt: skip
    assert cmp.main(args) == 0  # type: ignore[attr-defined]
    assert out_path.exists()
    out = capsys.readouterr().out
    assert "tpe" in out and "Skipped" not in out


@pytest.mark.slow
def test_campaign_fallback_enqueue_never_raises_stopiteration(tmp_path: Path) -> None:
    # wasted_limit=1: every proposal that evaluates nothing new (an invalid combination, a
    # config already measured) queues an unevaluated config, the path that raised.
    (p,) = problems_for([512])
    replay = ReplayMeasure(exhaustive_table([p]), strict=True)
    with open_store(tmp_path) as store:
        summary = run_replay_campaign(
            replay,
            CampaignOptions(sampler="random", trials=15, wasted_limit=1),
            store=store,
            storage_url=optuna_url(tmp_path),
            problems=[p],
            space_fn=lambda _: full_space(),
            seeds_fn=lambda _: [],
        )
    assert summary.problems[0].trials == 15
