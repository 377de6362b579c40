"""tuner.campaign: resume, interruption, budgets, building ahead, summaries."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import optuna
import pytest

from codegen.families.fa2.space import seed_configs
from core.build_report import BuildReport
from core.fa2_config import Fa2Config
from core.problem import Problem
from core.records import MeasureResult
from db.models import Build, Measurement
from db.session import session_scope
from db.store import Store
from tests.support.replay import (
    GPU,
    open_store,
    optuna_url,
    problems_for,
    synthetic_table,
    tiny_space,
)
from tuner import search
from tuner.build_ahead import BuildAhead
from tuner.campaign import CampaignOptions, run_campaign
from tuner.replay import ReplayMeasure, run_replay_campaign
from tuner.replay_table import ReplayTable
from tuner.summary import CampaignSummary, TrialEvent

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _campaign(
    tmp_path: Path,
    table: ReplayTable,
    problems: Sequence[Problem],
    *,
    trials: int | None = None,
    time_budget_s: float | None = None,
    measure_fn: object = None,
    replay: ReplayMeasure | None = None,
    sampler: str = "tpe",
    progress: object = None,
    clock: Callable[[], float] = time.monotonic,
    **kwargs: object,
) -> CampaignSummary:
    options = CampaignOptions(
        sampler=sampler,
        trials=trials,
        time_budget_s=time_budget_s,
        **kwargs,  # type: ignore[arg-type]
    )
    with open_store(tmp_path) as store:
        return run_replay_campaign(
            replay or table,
            options,
            store=store,
            storage_url=optuna_url(tmp_path),
            problems=problems,
            measure_fn=measure_fn,  # type: ignore[arg-type]
            progress=progress,  # type: ignore[arg-type]
            clock=clock,
        )


def _measurements(tmp_path: Path) -> list[tuple[int, str, str]]:
    """(problem id, config name, status) of every stored measurement."""
    # No migration check here: it takes SQLite's write lock, and the kill test polls this
    # while a child process is writing.
    url = f"sqlite:///{tmp_path / 'results.db'}"
    with Store.from_url(url, migrate=False) as store, session_scope(store.engine) as s:
        rows = s.query(Measurement.problem_id, Build.config_name, Measurement.status).join(
            Build, Build.id == Measurement.build_id
        )
        return [(p, c, st) for p, c, st in rows]


def _gpu_counts(rows: list[tuple[int, str, str]]) -> Counter[int]:
    return Counter(p for p, _, st in rows if st in search.GPU_STATUSES)


def _assert_each_config_measured_once(rows: list[tuple[int, str, str]]) -> None:
    per_pair = Counter((p, c) for p, c, _ in rows)
    assert per_pair and max(per_pair.values()) == 1, per_pair.most_common(3)


@pytest.mark.slow
def test_resume_continues_the_studies(tmp_path: Path) -> None:
    problems = problems_for([512, 2048])
    table = synthetic_table(problems)
    first = _campaign(tmp_path, table, problems, trials=4)
    assert [p.trials for p in first.problems] == [4, 4]
    storage = optuna_url(tmp_path)
    numbers_before = {
        p.study_name: len(optuna.load_study(study_name=p.study_name, storage=storage).trials)
        for p in problems
    }
    second = _campaign(tmp_path, table, problems, trials=10)
    assert [p.trials for p in second.problems] == [10, 10]
    for p in second.problems:
        study = optuna.load_study(study_name=p.study_name, storage=optuna_url(tmp_path))
        assert len(study.trials) > numbers_before[p.study_name]  # the same study went on
        seeds = [t for t in study.trials if t.user_attrs.get(search.ATTR_SEED)]
        expected = [c for c in seed_configs(64) if c.name in table.studies[p.study_name]]
        assert expected and len(seeds) == len(expected)  # queued by the first run only
    rows = _measurements(tmp_path)
    _assert_each_config_measured_once(rows)
    assert sorted(_gpu_counts(rows).values()) == [10, 10]
    # Nothing left to do: a third run measures nothing.
    third = _campaign(tmp_path, table, problems, trials=10)
    assert third.total_measured == 0
    assert len(_measurements(tmp_path)) == len(rows)


class _InterruptAfter:
    def __init__(self, replay: ReplayMeasure, calls: int) -> None:
        self.replay, self.calls = replay, calls

    def __call__(self, report: BuildReport, problem: Problem) -> MeasureResult:
        self.calls -= 1
        if self.calls < 0:
            raise KeyboardInterrupt
        return self.replay(report, problem)


@pytest.mark.slow
def test_interrupted_campaign_resumes_without_remeasuring(tmp_path: Path) -> None:
    problems = problems_for([512, 1024])
    table = synthetic_table(problems)
    replay = ReplayMeasure(table)
    stopped = _campaign(tmp_path, table, problems, trials=8, measure_fn=_InterruptAfter(replay, 5))
    assert stopped.interrupted
    assert len(stopped.problems) == 0  # interrupted within the first problem
    assert sum(_gpu_counts(_measurements(tmp_path)).values()) == 5
    done = _campaign(tmp_path, table, problems, trials=8, replay=replay)
    assert not done.interrupted
    assert [p.trials for p in done.problems] == [8, 8]
    rows = _measurements(tmp_path)
    _assert_each_config_measured_once(rows)
    assert sorted(_gpu_counts(rows).values()) == [8, 8]
    assert max(replay.measure_counts.values()) == 1


def _killable_campaign(tmp: str, trials: int) -> None:
    """Child process: a slow campaign that the test kills with SIGKILL."""
    from tests.support.replay import problems_for as pf
    from tests.support.replay import synthetic_table as st

    path = Path(tmp)
    problems = pf([512])
    replay = ReplayMeasure(st(problems), latency_s=0.2)
    run_replay_campaign(
        replay,
        CampaignOptions(trials=trials, heartbeat_interval=1, grace_period=2),
        store=f"sqlite:///{path / 'results.db'}",
        storage_url=f"sqlite:///{path / 'studies.db'}",
        problems=problems,
        seeds_fn=lambda p: [],
    )


@pytest.mark.slow
def test_resume_after_kill_9(tmp_path: Path) -> None:
    trials = 8
    ctx = mp.get_context("spawn")
    child = ctx.Process(target=_killable_campaign, args=(str(tmp_path), trials))
    child.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if (tmp_path / "results.db").exists():
            try:
                if sum(_gpu_counts(_measurements(tmp_path)).values()) >= 3:
                    break
            except Exception:  # the schema may not exist yet
                continue
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert child.exitcode == -signal.SIGKILL
    measured_before = sum(_gpu_counts(_measurements(tmp_path)).values())
    assert 3 <= measured_before < trials

    problems = problems_for([512])
    replay = ReplayMeasure(synthetic_table(problems))
    summary = _campaign(
        tmp_path, replay.table, problems, trials=trials, replay=replay,
        heartbeat_interval=1, grace_period=2,
    )  # fmt: skip
    assert summary.problems[0].trials == trials
    rows = _measurements(tmp_path)
    _assert_each_config_measured_once(rows)
    assert sum(_gpu_counts(rows).values()) == trials


@pytest.mark.slow
def test_time_budget_is_shared_by_the_problems(tmp_path: Path) -> None:
    problems = problems_for([512, 1024, 2048])
    table = synthetic_table(problems)
    replay = ReplayMeasure(table, latency_s=0.05)
    started = time.monotonic()
    summary = _campaign(tmp_path, table, problems, time_budget_s=6.0, replay=replay)
    took = time.monotonic() - started
    assert len(summary.problems) == 3  # every problem got its share
    assert all(p.trials >= 1 for p in summary.problems)
    assert took < 6.0 + 10.0  # a trial in flight may overrun its problem's share a little
    assert all(p.evaluated < p.space_size for p in summary.problems)


@pytest.mark.slow
def test_summary_and_time_split(tmp_path: Path) -> None:
    problems = problems_for([1024])
    table = synthetic_table(problems, tiny_space())
    replay = ReplayMeasure(table, latency_s=0.01)
    summary = _campaign(tmp_path, table, problems, sampler="grid", replay=replay)
    (p,) = summary.problems
    assert p.evaluated == p.space_size == len(tiny_space())
    assert sum(p.statuses.values()) == p.evaluated
    assert p.best_tflops is not None and p.best_tflops > 0
    assert p.measured == p.evaluated  # one measurement per config (build rejections too)
    t = summary.times
    assert t.wall_s > 0 and t.measure_s >= 0.01 * p.trials
    assert t.search_s == pytest.approx(t.wall_s - t.build_wait_s - t.measure_s)
    data = summary.to_dict()
    assert data["total_trials"] == p.trials and data["sampler"] == "grid"


class _Recorder:
    def __init__(self) -> None:
        self.events: list[TrialEvent] = []
        self.calls: list[str] = []

    def campaign_started(self, problems: object, trials: object, time_budget_s: object) -> None:
        self.calls.append("campaign_started")

    def problem_started(
        self, index: int, problem: object, target: object, deadline: object
    ) -> None:
        self.calls.append(f"problem_started {index}")

    def trial_finished(self, event: TrialEvent) -> None:
        self.events.append(event)

    def problem_finished(self, index: int, summary: object) -> None:
        self.calls.append(f"problem_finished {index}")

    def campaign_finished(self, summary: object) -> None:
        self.calls.append("campaign_finished")


@pytest.mark.slow
def test_progress_events(tmp_path: Path) -> None:
    problems = problems_for([512, 1024])
    table = synthetic_table(problems)
    rec = _Recorder()
    _campaign(tmp_path, table, problems, trials=3, progress=rec)
    assert rec.calls == [
        "campaign_started",
        "problem_started 0",
        "problem_finished 0",
        "problem_started 1",
        "problem_finished 1",
        "campaign_finished",
    ]
    assert rec.events and rec.events[-1].trials == 3 and rec.events[-1].target == 3
    bests = [e.best_ms for e in rec.events if e.problem == problems[0] and e.best_ms]
    assert bests == sorted(bests, reverse=True)  # best so far only improves


# ----------------------------------------------------------------------- building ahead


class _SlowBuild:
    """Records batches; blocks each background batch until released."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.gate = threading.Event()
        self.lock = threading.Lock()
        self.table = ReplayMeasure(synthetic_table(problems_for([512])))

    def __call__(self, configs: Sequence[Fa2Config]) -> list[BuildReport]:
        with self.lock:
            self.batches.append([c.name for c in configs])
        if len(configs) > 1:
            self.gate.wait(10)
        return self.table.build(configs)


def test_build_ahead_builds_everything_once_in_batches() -> None:
    configs = tiny_space()
    build = _SlowBuild()
    build.gate.set()
    ahead = BuildAhead(build, batch_size=5)
    ahead.submit(configs)
    ahead.submit(configs[:3])  # already queued: not built twice
    reports = [ahead.get(c) for c in configs]
    assert [r.config for r in reports] == configs
    ahead.close()
    built = [name for batch in build.batches for name in batch]
    assert sorted(built) == sorted(c.name for c in configs)
    assert max(len(b) for b in build.batches) <= 5
    assert len(ahead.drain_finished()) == len(configs)
    assert ahead.drain_finished() == []
    assert ahead.busy_s >= 0


def test_build_ahead_compiles_a_queued_config_at_once_when_asked() -> None:
    configs = tiny_space()
    build = _SlowBuild()
    ahead = BuildAhead(build, batch_size=4)
    ahead.submit(configs)
    while not build.batches:  # the background thread took the first batch and is stuck
        time.sleep(0.01)
    last = configs[-1]
    report = ahead.get(last)  # queued far behind: compiled on this thread right away
    assert report.config == last
    assert [last.name] in build.batches
    build.gate.set()
    assert ahead.get(configs[0]).config == configs[0]  # in the stuck batch: awaited
    ahead.close()
    built = [name for batch in build.batches for name in batch]
    assert built.count(last.name) == 1


def test_build_ahead_reports_build_errors_to_the_caller() -> None:
    def broken(configs: Sequence[Fa2Config]) -> list[BuildReport]:
        raise RuntimeError("nvcc exploded")

    ahead = BuildAhead(broken, batch_size=2)
    ahead.submit(tiny_space()[:2])
    with pytest.raises(RuntimeError, match="nvcc exploded"):
        ahead.get(tiny_space()[0])
    ahead.close()


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")
def test_campaign_on_postgres(postgres_url: str) -> None:
    from sqlalchemy import make_url, text

    from db.session import make_engine

    problems = problems_for([512])
    replay = ReplayMeasure(synthetic_table(problems, tiny_space()))
    schema = make_url(postgres_url).query["options"].split("=", 1)[1]  # type: ignore[union-attr]
    try:
        with Store.from_url(postgres_url) as store:

            def campaign(trials: int) -> CampaignSummary:
                return run_replay_campaign(
                    replay,
                    CampaignOptions(trials=trials),
                    store=store,
                    storage_url=search.resolve_storage_url(postgres_url),
                    problems=problems,
                    seeds_fn=lambda p: [],
                )

            first, second = campaign(3), campaign(5)
            assert (first.problems[0].trials, second.problems[0].trials) == (3, 5)
            rows = store.results(GPU.name, limit=1000).items
            assert len({r.config_name for r in rows}) == len(rows)
    finally:
        engine = make_engine(postgres_url)
        with engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}_optuna" CASCADE'))
        engine.dispose()


@pytest.mark.slow
@pytest.mark.compile
@pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")
def test_real_builds_and_worker_process(tmp_path: Path) -> None:
    """The production glue on a CPU: nvcc builds in the background, a spawned worker process
    (with the GPU-free fake handler) measures, the store records both."""
    import shutil

    from codegen.build import build_configs
    from measure.worker import BenchWorker
    from tests.support.fake_handlers import FAKE

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    space = seed_configs(64)[:3]
    problems = problems_for([512, 1024])

    def build_fn(configs: Sequence[Fa2Config]) -> list[BuildReport]:
        return build_configs(configs, arch="sm_90", cache_dir=tmp_path / "cache", jobs=2)

    with (
        open_store(tmp_path) as store,
        BenchWorker(handler=FAKE, job_timeout_s=60) as worker,
    ):
        summary = run_campaign(
            problems,
            CampaignOptions(sampler="grid", build_batch=2),
            store=store,
            storage_url=optuna_url(tmp_path),
            gpu=GPU,
            space_fn=lambda p: space,
            seeds_fn=lambda p: space[:1],
            build_fn=build_fn,
            measure_fn=worker.measure,
        )
        rows = store.results(GPU.name, limit=1000).items
    assert [p.evaluated for p in summary.problems] == [3, 3]
    assert {r.status for r in rows} == {"OK"}
    assert len(rows) == 6 and all(r.median_ms == 1.0 for r in rows)
    assert {r.source_hash for r in rows} and all(r.registers for r in rows)
    assert summary.times.build_s > 0


def test_default_space_follows_the_gpus_shared_memory() -> None:
    from dataclasses import replace

    from codegen.families.fa2.space import enumerate_space, fa2_default_config
    from codegen.families.fa3 import space as fa3_space
    from tuner.campaign import _defaults

    (problem,) = problems_for([1024])
    space_fn, seeds_fn, _ = _defaults("sm_90", GPU, None, None, None)
    # On an sm_90 GPU the portable family's space, then the Hopper family's.
    fa3 = fa3_space.enumerate_space(64, "fp16", False)
    assert list(space_fn(problem)) == [
        *enumerate_space(64, "fp16", False, 227 * 1024, "sm_90"), *fa3
    ]  # fmt: skip
    seeds = list(seeds_fn(problem))
    assert set(seeds) == {
        *seed_configs(64, "fp16", False),
        *fa3_space.seed_configs(64, "fp16", False),
    }
    # Each family's default first, then alternating: a short budget measures both families.
    assert seeds[:2] == [
        fa2_default_config(64, "fp16", False),
        fa3_space.default_config(64, "fp16", False),
    ]
    assert [c.family for c in seeds[:6]] == ["fa2", "fa3"] * 3
    ada_fn = _defaults("sm_89", GPU, None, None, None)[0]
    assert all(c.family == "fa2" for c in ada_fn(problem))
    small = replace(GPU, smem_optin_bytes=48 * 1024)
    small_space_fn, _, _ = _defaults("sm_90", small, None, None, None)
    assert 0 < len(small_space_fn(problem)) < len(space_fn(problem))
    assert all(c.smem_bytes <= 48 * 1024 for c in small_space_fn(problem))


def test_default_space_skips_families_without_the_head_dim(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """D=40 is fa2's (tile rounded up to 64) but not the Hopper family's: fa3 is left out of
    the space and the seeds with one log line for the head dim, not an error."""
    import logging

    from codegen.families.fa2.space import enumerate_space, fa2_default_config
    from tuner.campaign import _defaults

    problems = [*problems_for([1024, 4096], d=40), *problems_for([1024], d=64)]
    space_fn, seeds_fn, _ = _defaults("sm_90", GPU, None, None, None)
    with caplog.at_level(logging.INFO, logger="tuner.campaign"):
        spaces = [list(space_fn(p)) for p in problems]
        seeds = list(seeds_fn(problems[0]))
    assert spaces[0] == spaces[1] == enumerate_space(40, "fp16", False, 227 * 1024, "sm_90")
    assert {c.family for c in spaces[2]} == {"fa2", "fa3"}
    assert seeds[0] == fa2_default_config(40, "fp16", False)
    assert {c.family for c in seeds} == {"fa2"}
    skips = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert skips == ["D=40: skipping fa3 (head dims fa3: 64, 96, 128, 256)"]
    # Only fa3 asked for: nothing to search at D=40 (the CLI refuses that before any build).
    fa3_only = _defaults("sm_90", GPU, None, None, None, ("fa3",))[0]
    assert list(fa3_only(problems[0])) == []


class _FakeClock:
    """The campaign's clock: advanced only by the measurements, never by the machine."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _SlowFor:
    """A replay whose measurements of one problem take ``seconds`` each on ``clock``, those
    of the others none."""

    def __init__(
        self, replay: ReplayMeasure, slow: Problem, seconds: float, clock: _FakeClock
    ) -> None:
        self.replay, self.slow, self.seconds, self.clock = replay, slow, seconds, clock

    def __call__(self, report: BuildReport, problem: Problem) -> MeasureResult:
        if problem == self.slow:
            self.clock.now += self.seconds
        return self.replay(report, problem)


class _Finishes(_Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.trials: list[tuple[int, int]] = []

    def problem_finished(self, index: int, summary: object) -> None:
        super().problem_finished(index, summary)
        self.trials.append((index, summary.trials))  # type: ignore[attr-defined]


@pytest.mark.slow
def test_unused_budget_goes_back_to_problems_cut_short(tmp_path: Path) -> None:
    """With --trials and --time-budget, a problem whose even share ran out before its trials
    continues with the time the problems after it did not need.

    The budget runs on a fake clock that only the slow problem's measurements advance (0.5 s
    each), so the outcome is the same on an idle or a busy machine."""
    problems = problems_for([512, 1024])
    table = synthetic_table(problems)
    replay = ReplayMeasure(table)
    rec = _Finishes()
    clock = _FakeClock()
    trials = 10
    summary = _campaign(
        tmp_path, table, problems, trials=trials, time_budget_s=6.0, replay=replay,
        measure_fn=_SlowFor(replay, problems[0], 0.5, clock), progress=rec, clock=clock,
    )  # fmt: skip
    assert len(rec.trials) == 3, rec.trials
    first, fast, again = rec.trials
    assert first == (0, 6)  # its 3 s share allowed 6 measurements of 0.5 s
    assert fast == (1, trials)  # the fast problem finished without using its 3 s...
    assert again == (0, trials)  # ...which went back to problem 0: 4 more trials
    assert summary.problems[0].trials == trials
    assert clock.now == 1000.0 + 0.5 * trials  # problem 0 measured once per GPU trial
    assert rec.calls[-3:] == ["problem_started 0", "problem_finished 0", "campaign_finished"]
