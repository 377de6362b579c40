"""The search end to end in replay mode: samplers find the best, failures never win, invalid
combinations never reach the build or the GPU."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from codegen.families.fa2.space import seed_configs
from core.build_report import BuildReport
from core.fa2_config import Fa2Config
from core.problem import Problem
from core.records import MeasureResult, MeasureStatus
from tests.support.replay import (
    GPU,
    medium_space,
    open_store,
    optuna_url,
    problems_for,
    small_space,
    synthetic_table,
    tiny_space,
)
from tuner import search
from tuner.campaign import DEFAULT_MAX_SPILL_BYTES, CampaignOptions
from tuner.replay import ReplayMeasure, run_replay_campaign
from tuner.replay_table import ReplayEntry, ReplayTable
from tuner.summary import CampaignSummary

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _run(
    tmp_path: Path,
    table: ReplayTable,
    problems: Sequence[Problem],
    sampler: str,
    *,
    trials: int | None,
    seed: int = 0,
    replay: ReplayMeasure | None = None,
    measure_fn: object = None,
    max_spill_bytes: int | None = DEFAULT_MAX_SPILL_BYTES,
    seeds: bool = False,
) -> CampaignSummary:
    options = CampaignOptions(
        sampler=sampler, trials=trials, seed=seed, max_spill_bytes=max_spill_bytes
    )
    with open_store(tmp_path) as store:
        return run_replay_campaign(
            replay or table,
            options,
            store=store,
            storage_url=optuna_url(tmp_path),
            problems=problems,
            seeds_fn=(lambda p: seed_configs(p.d, p.dtype, p.causal)) if seeds else lambda p: [],
            measure_fn=measure_fn,  # type: ignore[arg-type]
        )


def _gpu_eligible(table: ReplayTable, study: str) -> int:
    return sum(e.status not in search.BUILD_STATUSES for e in table.studies[study].values())


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_tpe_finds_the_best_within_budget(tmp_path: Path, seed: int) -> None:
    problems = problems_for([2048])
    table = synthetic_table(problems)
    study = problems[0].study_name
    budget = 20
    assert budget < _gpu_eligible(table, study)  # not an exhaustive search
    summary = _run(tmp_path, table, problems, "tpe", trials=budget, seed=seed)
    (p,) = summary.problems
    assert p.trials == budget
    assert (p.best_config, p.best_ms) == table.best(study)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_random_gets_close_within_budget(tmp_path: Path, seed: int) -> None:
    problems = problems_for([2048])
    table = synthetic_table(problems)
    study = problems[0].study_name
    summary = _run(tmp_path, table, problems, "random", trials=20, seed=seed)
    (p,) = summary.problems
    best = table.best(study)
    assert best is not None and p.best_ms is not None
    assert p.trials == 20
    assert p.best_ms <= best[1] * 1.05


@pytest.mark.slow
def test_random_finds_the_best_with_a_budget_of_every_gpu_config(tmp_path: Path) -> None:
    problems = problems_for([2048])
    table = synthetic_table(problems, tiny_space())
    study = problems[0].study_name
    budget = _gpu_eligible(table, study)
    (p,) = _run(tmp_path, table, problems, "random", trials=budget).problems
    # No config twice: the budget covers exactly every config that reaches the GPU.
    assert p.trials == budget
    assert (p.best_config, p.best_ms) == table.best(study)


@pytest.mark.slow
def test_grid_evaluates_every_config_once(tmp_path: Path) -> None:
    problems = problems_for([1024])
    table = synthetic_table(problems, tiny_space())
    study = problems[0].study_name
    replay = ReplayMeasure(table)
    (p,) = _run(tmp_path, table, problems, "grid", trials=None, replay=replay, seeds=True).problems
    assert p.evaluated == p.space_size == len(table.studies[study])
    assert (p.best_config, p.best_ms) == table.best(study)
    counts = replay.measure_counts
    assert counts and max(counts.values()) == 1
    # Measured = everything but build rejections; seeds were not measured twice either.
    assert len(counts) == _gpu_eligible(table, study)
    assert p.statuses == dict(Counter(e.status for e in table.studies[study].values()))


@pytest.mark.slow
def test_invalid_combinations_never_reach_build_or_measure(tmp_path: Path) -> None:
    # A sparse space: drop every third config, so many combinations of the choices are not
    # configs of the space (as with the real space's smem and register rules).
    space = [c for i, c in enumerate(medium_space()) if i % 3]
    problems = problems_for([1024])
    table = synthetic_table(problems, space)
    valid = {c.name for c in space}
    replay = ReplayMeasure(table)
    summary = _run(tmp_path, table, problems, "random", trials=12, replay=replay)
    (p,) = summary.problems
    assert p.invalid > 0  # the sampler did propose invalid combinations...
    assert set(replay.built) <= valid  # ...and none was built
    assert {config for _, config in replay.measured} <= valid  # ...nor measured
    assert max(Counter(replay.built).values()) == 1  # each valid config built once
    trials = optuna.load_study(study_name=p.study_name, storage=optuna_url(tmp_path)).get_trials(
        deepcopy=False
    )
    invalid = [t for t in trials if search.trial_status(t) == search.STATUS_INVALID]
    assert invalid and all(t.state == optuna.trial.TrialState.PRUNED for t in invalid)
    assert all(search.trial_config(t) is None for t in invalid)


class _Liar:
    """Reports absurdly fast times together with failing statuses for some configs."""

    def __init__(self, replay: ReplayMeasure) -> None:
        self.replay = replay
        self.lied: set[str] = set()

    def __call__(self, report: BuildReport, problem: Problem) -> MeasureResult:
        result = self.replay(report, problem)
        c = report.config
        if result.status == MeasureStatus.OK and c.br == 64:
            self.lied.add(c.name)
            status = MeasureStatus.WRONG_RESULT if c.stages == 1 else MeasureStatus.TIMEOUT
            return replace(result, status=status, median_ms=1e-6, tflops=1e9)
        return result


@pytest.mark.slow
def test_non_ok_statuses_never_become_best(tmp_path: Path) -> None:
    problems = problems_for([1024])
    table = synthetic_table(problems, tiny_space())
    liar = _Liar(ReplayMeasure(table))
    (p,) = _run(tmp_path, table, problems, "grid", trials=None, measure_fn=liar).problems
    assert liar.lied
    assert p.best_config not in liar.lied
    assert p.best_ms is not None and p.best_ms > 1e-3
    ok = {n: e.median_ms for n, e in table.studies[p.study_name].items() if e.status == "OK"}
    honest = {n: ms for n, ms in ok.items() if n not in liar.lied}
    assert p.best_ms == min(honest.values())  # type: ignore[type-var]
    study = optuna.load_study(study_name=p.study_name, storage=optuna_url(tmp_path))
    for t in study.get_trials(deepcopy=False):
        if search.trial_config(t) in liar.lied:
            assert t.state == optuna.trial.TrialState.PRUNED
            assert t.value is None
    assert study.best_trial.value == p.best_ms
    with open_store(tmp_path) as store:
        best = store.best(GPU.name, 64, 1024)
    assert best is not None and best.config.name == p.best_config


@pytest.mark.slow
def test_heavy_spills_are_recorded_not_timed_unless_allowed(tmp_path: Path) -> None:
    problems = problems_for([1024])
    table = synthetic_table(problems, tiny_space())
    study = problems[0].study_name
    spilling = {n for n, e in table.studies[study].items() if e.build_status == "SPILLS"}
    assert spilling
    replay = ReplayMeasure(table)
    (p,) = _run(tmp_path / "a", table, problems, "grid", trials=None, replay=replay).problems
    assert p.statuses["SPILLS"] == len(spilling)
    assert not spilling & {config for _, config in replay.measured}
    with open_store(tmp_path / "a") as store:
        rows = store.results(GPU.name, status="SPILLS", limit=1000).items
    assert {r.config_name for r in rows} == spilling
    assert all(r.median_ms is None and r.error and "spill" in r.error for r in rows)

    allowed = ReplayMeasure(table)
    _run(tmp_path / "b", table, problems, "grid", trials=None, replay=allowed, max_spill_bytes=None)
    assert spilling <= {config for _, config in allowed.measured}


def _with_small_spill(table: ReplayTable, study: str) -> tuple[ReplayTable, str]:
    """``table`` with its second-fastest OK config turned into a 24-B spiller that is the
    fastest of all (as the causal D=128 FA2 tiles are on the H200)."""
    entries = dict(table.studies[study])
    ok = sorted((e.median_ms, n) for n, e in entries.items() if e.median_ms is not None)
    fastest_ms, name = ok[0][0], ok[1][1]
    entries[name] = ReplayEntry(
        status="OK", median_ms=0.9 * fastest_ms, build_status="SPILLS", spill_bytes=24
    )
    return ReplayTable(studies={study: entries}, problems=table.problems, gpu=GPU), name


@pytest.mark.slow
def test_small_spills_are_timed_within_the_limit(tmp_path: Path) -> None:
    problems = problems_for([1024])
    study = problems[0].study_name
    table, spiller = _with_small_spill(synthetic_table(problems, tiny_space()), study)
    heavy = {n for n, e in table.studies[study].items() if e.spill_bytes == 512}

    within = ReplayMeasure(table)
    (p,) = _run(tmp_path / "a", table, problems, "grid", trials=None, replay=within).problems
    assert p.best_config == spiller
    assert spiller in {c for _, c in within.measured}
    assert not heavy & {c for _, c in within.measured}

    strict = ReplayMeasure(table)
    (q,) = _run(tmp_path / "b", table, problems, "grid", trials=None, replay=strict,
                max_spill_bytes=0).problems  # fmt: skip
    assert q.best_config != spiller and q.best_config is not None
    assert spiller not in {c for _, c in strict.measured}
    with open_store(tmp_path / "b") as store:
        rows = store.results(GPU.name, status="SPILLS", limit=1000).items
    assert spiller in {r.config_name for r in rows}
    assert all("--max-spill-bytes" in (r.error or "") for r in rows)


@pytest.mark.slow
def test_resume_with_a_higher_spill_limit_times_what_it_skipped(tmp_path: Path) -> None:
    """A campaign resumed with a larger limit times the SPILLS it skipped before (from its
    trials and from the store), and only those within the new limit."""
    problems = problems_for([1024])
    study = problems[0].study_name
    table, spiller = _with_small_spill(synthetic_table(problems, tiny_space()), study)
    first = ReplayMeasure(table)
    (p,) = _run(tmp_path, table, problems, "grid", trials=None, replay=first,
                max_spill_bytes=0).problems  # fmt: skip
    assert p.best_config != spiller
    again = ReplayMeasure(table)
    (q,) = _run(tmp_path, table, problems, "grid", trials=None, replay=again).problems
    assert {c for _, c in again.measured} == {spiller}, (again.measured, q)
    assert q.best_config == spiller


@pytest.mark.slow
def test_build_failures_are_recorded_as_measurements(tmp_path: Path) -> None:
    problems = problems_for([512])
    table = synthetic_table(problems, tiny_space())
    failed = {n for n, e in table.studies[problems[0].study_name].items()
              if e.status == "COMPILE_FAILED"}  # fmt: skip
    assert failed
    _run(tmp_path, table, problems, "grid", trials=None)
    with open_store(tmp_path) as store:
        rows = store.results(GPU.name, status="COMPILE_FAILED", limit=1000).items
    assert {r.config_name for r in rows} == failed
    assert all(r.trial_number is not None for r in rows)


@pytest.mark.slow
def test_measurements_carry_search_provenance(tmp_path: Path) -> None:
    problems = problems_for([512])
    table = synthetic_table(problems)
    _run(tmp_path, table, problems, "tpe", trials=4, seed=7)
    with open_store(tmp_path) as store:
        rows = store.results(GPU.name, status="OK", limit=1000).items
        assert rows
        from db.models import Measurement
        from db.session import session_scope

        with session_scope(store.engine) as s:
            extras = [m.extra for m in s.query(Measurement).all()]
    assert all(e and e["search"]["study"] == problems[0].study_name for e in extras)
    assert all(e["search"]["sampler"] == "tpe" for e in extras if e)
    assert {r.trial_number for r in rows} == {
        e["search"]["trial"] for e in extras if e and "replay" in e
    }


def test_unknown_sampler_is_refused(tmp_path: Path) -> None:
    problems = problems_for([512])
    with pytest.raises(ValueError, match="unknown sampler"):
        _run(tmp_path, synthetic_table(problems), problems, "bayes", trials=1)


def _configs(names: Sequence[str]) -> list[Fa2Config]:
    return [Fa2Config.from_name(n) for n in names]


def test_small_space_fixture_is_small() -> None:
    assert 20 <= len(small_space()) <= 60
    assert len(_configs([c.name for c in small_space()])) == len(small_space())
