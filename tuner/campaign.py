"""The engine of ``fa2tune tune``: search every problem's study, building ahead of the GPU.

One campaign is a list of :class:`~core.problem.Problem`\\ s. Each gets an optuna study
(:mod:`tuner.search`) whose trials are answered by this module:

1. The sampler's parameters are mapped to a config; an invalid combination is pruned at once
   (status ``INVALID``), never built nor measured.
2. The trial publishes its config (user attribute ``config``) and checks the study for other
   trials of the same config (see *Sharing a study* below): an earlier finished one is reused,
   a running one makes this trial a ``DUPLICATE`` (failed, so the sampler ignores it).
3. The store is asked whether the config was already measured for the problem (a resume after
   a kill, or another campaign): if so that outcome is reused and nothing is measured.
4. Otherwise the build is awaited (it is normally already done, see *Building ahead*), a
   failed, overflowing or too much spilling build (more than ``max_spill_bytes``) is recorded
   as a measurement with that status, and a usable one is verified and timed by ``measure_fn``.
   The measurement goes to the store with its provenance; the trial's value is the median ms
   when the status is OK, else the trial is pruned with the status as user attribute, so a
   failure can never become the best.

Budget
    ``trials`` counts, per problem, the distinct configs the study has *run on the GPU*
    (statuses OK, WRONG_RESULT, RUNTIME_FAILED, TIMEOUT), whichever process or run measured
    them. Invalid proposals, reuses, duplicates and build rejections (COMPILE_FAILED,
    SMEM_OVERFLOW, untimed SPILLS) are recorded but free. ``time_budget_s`` covers the whole
    campaign: each problem gets the remaining time divided by the problems left, so time a
    problem does not use flows to the next; time still left at the end goes back, split the
    same way, to the problems whose share ran out before their ``trials``. With neither, every
    valid config is evaluated (what ``grid`` is for). A problem also ends when all its valid
    configs are evaluated.

Building ahead
    Builds do not depend on N, so one build per config serves every problem of its
    (D, dtype, causal) group. :class:`BuildAhead` compiles all valid configs of the
    campaign's groups, in problem order, in batches (one ``build_fn`` call, i.e. one parallel
    ninja run, per batch) on a background thread while the GPU measures. A proposed config
    whose build is not done is awaited: if it is in the batch compiling now, that batch is
    awaited; if it is still queued it is compiled at once on the calling thread, so the GPU
    never waits behind the queue.

Sharing a study
    Several processes (one per GPU) may run the same campaign on one database: optuna's
    distributed mode, each trial asking the shared study. Two trials can still draw the same
    config; the trial *numbers* (assigned atomically by the storage) break the tie: a trial
    first publishes its config, waits until every lower-numbered running trial has published
    its own, and yields to a lower-numbered trial of the same config. So a config is measured
    once per problem, whatever the interleaving.

Resume
    Studies live in the database, so re-running the same command continues them: the
    samplers see all earlier trials, the budget counts them, and the store's measured pairs
    are never measured again. A ``kill -9`` loses at most the trials in flight; their
    RUNNING rows are failed and re-queued by the heartbeat (see :func:`search.open_storage`).
"""

from __future__ import annotations

import logging
import math
import os
import random
import socket
import threading
import time
import warnings
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Final, Protocol

import optuna
from optuna.exceptions import ExperimentalWarning, TrialPruned
from optuna.trial import FrozenTrial, Trial, TrialState
from sqlalchemy import select

from core.build_report import BuildReport, BuildStatus
from core.config import KernelConfig
from core.problem import Problem
from core.records import GpuInfo, MeasureResult, MeasureStatus
from db.models import Build as BuildRow
from db.models import Measurement as MeasurementRow
from db.session import session_scope
from db.store import Store
from tuner import search
from tuner.search import TrialRole

log = logging.getLogger(__name__)

#: Compile a list of configs, one report per config (``codegen.build.build_configs``).
BuildFn = Callable[[Sequence[KernelConfig]], Sequence[BuildReport]]
#: Verify and time one usable build on one problem (``measure.worker.BenchWorker.measure``).
MeasureFn = Callable[[BuildReport, Problem], MeasureResult]
#: The valid configs of a problem's group (``codegen.space.enumerate_space``).
SpaceFn = Callable[[Problem], Sequence[KernelConfig]]
#: The configs every new study starts with (``codegen.space.seed_configs``).
SeedFn = Callable[[Problem], Sequence[KernelConfig]]

STATUS_ABANDONED: Final = "ABANDONED"
_MEASURE_STATUSES: Final[frozenset[str]] = frozenset(str(s) for s in MeasureStatus)
_POLL_S: Final = 0.05
#: Seconds of unused budget below which no cut-short problem is continued.
_MIN_EXTRA_S: Final = 1.0
#: Spill bytes per thread up to which a build is still timed. Small spills are not failures:
#: on the H200 the causal D=128 128x64 4-warp configs spill 4-108 B (ptxas, sm_90) and still
#: beat every spill-free config of those problems, the best of them by 12-15 %
#: (docs/performance.md). Larger spills are skipped to save GPU time; a campaign can raise or
#: lower the limit.
DEFAULT_MAX_SPILL_BYTES: Final = 128


# --------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class TimeSplit:
    """Where a campaign's wall time went.

    Attributes:
        wall_s: the campaign's wall time.
        build_s: time the build machinery spent compiling (background and on demand).
        build_wait_s: part of ``wall_s`` the search spent waiting for a build.
        measure_s: part of ``wall_s`` spent verifying and timing on the GPU.
        search_s: the rest of ``wall_s``: sampling, database, bookkeeping.
    """

    wall_s: float = 0.0
    build_s: float = 0.0
    build_wait_s: float = 0.0
    measure_s: float = 0.0

    @property
    def search_s(self) -> float:
        return max(0.0, self.wall_s - self.build_wait_s - self.measure_s)

    def to_dict(self) -> dict[str, float]:
        return {
            "wall_s": self.wall_s,
            "build_s": self.build_s,
            "build_wait_s": self.build_wait_s,
            "measure_s": self.measure_s,
            "search_s": self.search_s,
        }


@dataclass(frozen=True)
class ProblemSummary:
    """The state of one problem's study after the campaign.

    Attributes:
        problem: the problem.
        study_name: its optuna study.
        space_size: number of valid configs.
        best_config: name of the fastest OK config in the study, if any.
        best_ms: its median time.
        best_tflops: its throughput.
        trials: configs run on the GPU (what ``trials`` budgets), all runs and processes.
        evaluated: configs with any recorded outcome (GPU or build rejection).
        statuses: outcome counts over the evaluated configs.
        measured: measurements this process took (GPU or build rejection) in this run.
        reused: trials answered from an earlier trial or the store in this run.
        invalid: invalid proposals in this run.
        duplicates: proposals yielded to another process's trial in this run.
        times: this problem's share of the time split.
    """

    problem: Problem
    study_name: str
    space_size: int
    best_config: str | None
    best_ms: float | None
    best_tflops: float | None
    trials: int
    evaluated: int
    statuses: dict[str, int]
    measured: int
    reused: int
    invalid: int
    duplicates: int
    times: TimeSplit = field(default_factory=TimeSplit)

    def to_dict(self) -> dict[str, object]:
        return {
            "problem": self.problem.to_dict(),
            "study_name": self.study_name,
            "space_size": self.space_size,
            "best_config": self.best_config,
            "best_ms": self.best_ms,
            "best_tflops": self.best_tflops,
            "trials": self.trials,
            "evaluated": self.evaluated,
            "statuses": dict(self.statuses),
            "measured": self.measured,
            "reused": self.reused,
            "invalid": self.invalid,
            "duplicates": self.duplicates,
            "times": self.times.to_dict(),
        }


@dataclass(frozen=True)
class CampaignSummary:
    """What :func:`run_campaign` did: one summary per problem plus totals."""

    problems: list[ProblemSummary]
    times: TimeSplit
    sampler: str
    interrupted: bool = False

    @property
    def total_trials(self) -> int:
        return sum(p.trials for p in self.problems)

    @property
    def total_measured(self) -> int:
        return sum(p.measured for p in self.problems)

    @property
    def statuses(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for p in self.problems:
            total.update(p.statuses)
        return dict(total)

    def to_dict(self) -> dict[str, object]:
        return {
            "sampler": self.sampler,
            "interrupted": self.interrupted,
            "problems": [p.to_dict() for p in self.problems],
            "total_trials": self.total_trials,
            "total_measured": self.total_measured,
            "statuses": self.statuses,
            "times": self.times.to_dict(),
        }


@dataclass(frozen=True)
class TrialEvent:
    """One finished trial, as reported to the progress display."""

    problem: Problem
    trial_number: int
    config: str | None
    status: str | None
    role: str | None
    value_ms: float | None
    trials: int  # GPU-run configs so far (the budgeted count)
    target: int | None
    best_ms: float | None
    best_config: str | None


class CampaignObserver(Protocol):
    """Receives the campaign's progress (:class:`tuner.progress.RichProgress` draws it)."""

    def campaign_started(
        self, problems: Sequence[Problem], trials: int | None, time_budget_s: float | None
    ) -> None: ...

    def problem_started(
        self, index: int, problem: Problem, target: int | None, deadline: float | None
    ) -> None: ...

    def trial_finished(self, event: TrialEvent) -> None: ...

    def problem_finished(self, index: int, summary: ProblemSummary) -> None: ...

    def campaign_finished(self, summary: CampaignSummary) -> None: ...


class NullObserver:
    """An observer that only logs (the default)."""

    def campaign_started(
        self, problems: Sequence[Problem], trials: int | None, time_budget_s: float | None
    ) -> None:
        log.info("campaign: %d problems", len(problems))

    def problem_started(
        self, index: int, problem: Problem, target: int | None, deadline: float | None
    ) -> None:
        log.info("problem %d: %s", index + 1, problem.study_name)

    def trial_finished(self, event: TrialEvent) -> None:
        log.debug(
            "trial %d %s %s %s %s",
            event.trial_number,
            event.config,
            event.status,
            event.role,
            event.value_ms,
        )

    def problem_finished(self, index: int, summary: ProblemSummary) -> None:
        log.info(
            "problem %s: best %s %s ms", summary.study_name, summary.best_config, summary.best_ms
        )

    def campaign_finished(self, summary: CampaignSummary) -> None:
        log.info("campaign done in %.1f s", summary.times.wall_s)


# --------------------------------------------------------------------------------------------
# Building ahead


#: Niceness of the background build thread and the compilers it starts.
BACKGROUND_NICE: Final = 10


def _lower_thread_priority(nice: int) -> None:
    """Renice the calling thread only (Linux: niceness is per thread, inherited by children).

    The background compilers then yield the CPU to the measuring worker (so a busy CPU does
    not open gaps between timed launches) and to builds the GPU is waiting for, which run at
    normal priority on the search thread.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (AttributeError, OSError) as exc:  # not Linux, or not permitted
        log.debug("could not lower the build thread's priority: %s", exc)


class BuildAhead:
    """Compiles queued configs in batches on a background thread; on demand when asked.

    Args:
        build_fn: compiles a batch and returns one report per config.
        batch_size: configs per ``build_fn`` call (the parallel width of one ninja run).
    """

    def __init__(self, build_fn: BuildFn, batch_size: int = 16) -> None:
        self._build_fn = build_fn
        self._batch_size = max(1, batch_size)
        self._cond = threading.Condition()
        self._queue: dict[str, KernelConfig] = {}  # insertion-ordered: the build order
        self._futures: dict[str, Future[BuildReport]] = {}
        self._finished: list[BuildReport] = []
        self._closed = False
        self._busy_s = 0.0
        self._thread = threading.Thread(target=self._run, name="fa2tune-build-ahead", daemon=True)
        self._thread.start()

    @property
    def busy_s(self) -> float:
        """Seconds spent inside ``build_fn`` (background and on demand, summed)."""
        with self._cond:
            return self._busy_s

    def submit(self, configs: Iterable[KernelConfig]) -> None:
        """Queue configs for the background thread (each is built once)."""
        with self._cond:
            for config in configs:
                if config.name not in self._futures:
                    self._futures[config.name] = Future()
                    self._queue[config.name] = config
            self._cond.notify_all()

    def get(self, config: KernelConfig) -> BuildReport:
        """The build of ``config``: done already, awaited, or compiled now.

        Raises:
            Exception: whatever ``build_fn`` raised for the batch holding ``config``.
        """
        with self._cond:
            future = self._futures.get(config.name)
            build_now = future is None or config.name in self._queue
            if build_now:
                # Not started yet: take it out of the queue and compile it on this thread.
                self._queue.pop(config.name, None)
                future = self._futures.setdefault(config.name, Future())
        assert future is not None
        if build_now:
            self._build([config], {config.name: future})
        return future.result()

    def drain_finished(self) -> list[BuildReport]:
        """Reports finished since the last call (so the caller can record them)."""
        with self._cond:
            done, self._finished = self._finished, []
        return done

    def close(self) -> None:
        """Drop the queue and wait for the batch in progress to finish."""
        with self._cond:
            self._closed = True
            for name in self._queue:
                self._futures[name].cancel()
            self._queue.clear()
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        _lower_thread_priority(BACKGROUND_NICE)
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                names = list(self._queue)[: self._batch_size]
                batch = [self._queue.pop(name) for name in names]
                futures = {name: self._futures[name] for name in names}
            self._build(batch, futures)

    def _build(self, batch: list[KernelConfig], futures: dict[str, Future[BuildReport]]) -> None:
        start = time.perf_counter()
        try:
            reports = list(self._build_fn(batch))
        except BaseException as exc:
            # Whoever awaits these builds gets the error; an interrupt still propagates.
            for future in futures.values():
                future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            log.exception("building %d configs failed", len(batch))
            return
        finally:
            with self._cond:
                self._busy_s += time.perf_counter() - start
        by_name = {r.config.name: r for r in reports}
        with self._cond:
            self._finished.extend(reports)
        for config in batch:
            report = by_name.get(config.name)
            if report is None:
                futures[config.name].set_exception(
                    RuntimeError(f"build_fn returned no report for {config.name}")
                )
            else:
                futures[config.name].set_result(report)


# --------------------------------------------------------------------------------------------
# One problem's study


class _SearchSkip(Exception):
    """A trial that is neither measured nor pruned (duplicate or over budget): it fails."""


@dataclass
class _Scan:
    """What the study's trials say, as seen from one trial (or from the callback)."""

    outcome: dict[str, FrozenTrial]  # config -> first finished trial with a measured status
    running: dict[str, int]  # config -> lowest running trial number that claims it
    gpu_run: set[str]  # configs run on the GPU (the budgeted count)

    @classmethod
    def of(
        cls, trials: Sequence[FrozenTrial], *, times_spills: Callable[[int], bool] | None = None
    ) -> _Scan:
        """Scan ``trials``.

        An untimed SPILLS outcome does not count when ``times_spills`` (the campaign's spill
        limit) would now time its build, or when its spill bytes were not recorded: such a
        config is evaluated again (its build is cached) and decided by the current limit.
        """
        outcome: dict[str, FrozenTrial] = {}
        running: dict[str, int] = {}
        gpu_run: set[str] = set()
        for t in trials:
            config = search.trial_config(t)
            if config is None:
                continue
            status = search.trial_status(t)
            if status == MeasureStatus.SPILLS and times_spills is not None:
                recorded = t.user_attrs.get(search.ATTR_SPILL_BYTES)
                if not isinstance(recorded, int) or times_spills(recorded):
                    continue
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
                if status in _MEASURE_STATUSES and config not in outcome:
                    outcome[config] = t
                if status in search.GPU_STATUSES:
                    gpu_run.add(config)
            elif t.state == TrialState.RUNNING:
                running[config] = min(running.get(config, t.number), t.number)
        return cls(outcome=outcome, running=running, gpu_run=gpu_run)


def _seed_for(seed: int | None, study_name: str, salt: int) -> int | None:
    # Distinct, stable seeds per study and per process: two processes sharing a study with one
    # seed would draw the same random startup configs in lockstep and collide on every trial.
    if seed is None:
        return None
    return zlib.crc32(f"{seed}:{study_name}:{salt}".encode())


def _with_tflops(result: MeasureResult, problem: Problem) -> MeasureResult:
    if result.tflops is None and result.median_ms and result.status == MeasureStatus.OK:
        return replace(result, tflops=problem.tflops(result.median_ms))
    return result


def stored_spill_bytes(store: Store, config_key: str) -> int:
    """The largest spill (stores or loads, bytes per thread) of the stored builds of a config."""
    query = select(BuildRow.spill_stores, BuildRow.spill_loads).where(
        BuildRow.config_key == config_key
    )
    with session_scope(store.engine) as s:
        return max((max(row) for row in s.execute(query)), default=0)


def stored_outcome(store: Store, problem_id: int, config_key: str) -> tuple[str, float | None]:
    """The store's outcome of one config on one problem: the fastest OK, else the latest.

    An adapter over :mod:`db.models` (``Store.measured_pairs`` gives keys only, and a resume
    needs the value to hand to the sampler).

    Returns:
        ``(status, median_ms)``; ``("SKIPPED", None)`` when nothing is stored.
    """
    query = (
        select(MeasurementRow.status, MeasurementRow.median_ms)
        .join(BuildRow, BuildRow.id == MeasurementRow.build_id)
        .where(MeasurementRow.problem_id == problem_id, BuildRow.config_key == config_key)
    )
    with session_scope(store.engine) as s:
        ok = s.execute(
            query.where(
                MeasurementRow.status == MeasureStatus.OK.value,
                MeasurementRow.median_ms.is_not(None),
            )
            .order_by(MeasurementRow.median_ms)
            .limit(1)
        ).first()
        if ok is not None:
            return str(ok[0]), ok[1]
        last = s.execute(query.order_by(MeasurementRow.id.desc()).limit(1)).first()
    if last is None:
        return str(MeasureStatus.SKIPPED), None
    return str(last[0]), last[1]


@dataclass
class _Context:
    """What every problem of a campaign shares."""

    store: Store
    gpu: GpuInfo
    gpu_id: int
    sampler: str
    max_spill_bytes: int | None
    measure_fn: MeasureFn
    builds: BuildAhead
    observer: CampaignObserver
    claim_wait_s: float
    in_flight_wait_s: float
    wasted_limit: int
    rng: random.Random
    build_ids: dict[str, int] = field(default_factory=dict)
    build_wait_s: float = 0.0
    measure_s: float = 0.0

    def times_build(self, spill_bytes: int) -> bool:
        """True when a build spilling ``spill_bytes`` is within the limit and gets timed."""
        return self.max_spill_bytes is None or spill_bytes <= self.max_spill_bytes

    def record_finished_builds(self) -> None:
        for report in self.builds.drain_finished():
            self.build_id(report)

    def build_id(self, report: BuildReport) -> int:
        found = self.build_ids.get(report.config.name)
        if found is None:
            found = self.build_ids[report.config.name] = self.store.record_build(report)
        return found


class _ProblemRun:
    """Answers the trials of one problem's study (the objective) and decides when to stop."""

    def __init__(
        self,
        ctx: _Context,
        index: int,
        problem: Problem,
        study: optuna.Study,
        space: search.SearchSpace,
        problem_id: int,
        trials: int | None,
        deadline: float | None,
    ) -> None:
        self.ctx = ctx
        self.index = index
        self.problem = problem
        self.study = study
        self.space = space
        self.problem_id = problem_id
        self.trials = trials
        self.deadline = deadline
        self.names = {c.name for c in space.configs}
        self.roles: Counter[str] = Counter()
        self.wasted = 0  # consecutive proposals that evaluated nothing new
        self.silent: set[int] = set()  # running trials that never published a config
        self.skipped: set[int] = set()  # trials failed on purpose (duplicate, over budget)
        self.build_wait_s = 0.0
        self.measure_s = 0.0

    # ---------------------------------------------------------------- the objective

    def objective(self, trial: Trial) -> float:
        config = self.space.suggest(trial)
        if config is None:
            self._mark(trial, TrialRole.INVALID, search.STATUS_INVALID)
            raise TrialPruned("not a valid config")
        trial.set_user_attr(search.ATTR_CONFIG, config.name)  # the claim
        scan = self._scan(trial.number)
        prior = scan.outcome.get(config.name)
        if prior is not None:
            return self._reuse(trial, prior)
        owner = scan.running.get(config.name)
        if owner is not None and owner < trial.number:
            self._mark(trial, TrialRole.DUPLICATE, search.STATUS_DUPLICATE)
            # Another process drew the same config: its sampler may be in lockstep with ours
            # (same seed and salt, e.g. every container's GPU is "device 0"). A fresh random
            # state breaks the tie; single-process runs never get here and stay reproducible.
            self.study.sampler.reseed_rng()
            self.skipped.add(trial.number)
            raise _SearchSkip(f"{config.name} is being measured by trial {owner}")
        if not self._within_budget(trial, config):
            self._mark(trial, TrialRole.ABANDONED, STATUS_ABANDONED)
            self.study.stop()
            self.skipped.add(trial.number)
            raise _SearchSkip("the trial budget is used up")
        key = config.key
        if key in self.ctx.store.measured_pairs(self.problem_id):
            status, median = stored_outcome(self.ctx.store, self.problem_id, key)
            retime = status == MeasureStatus.SPILLS and self.ctx.times_build(
                stored_spill_bytes(self.ctx.store, key)
            )
            if not retime:
                return self._finish(trial, config, TrialRole.STORED, status, median, None)
        result = self._evaluate(trial, config)
        return self._finish(
            trial, config, TrialRole.MEASURED, str(result.status), result.median_ms, result.tflops
        )

    def _evaluate(self, trial: Trial, config: KernelConfig) -> MeasureResult:
        ctx = self.ctx
        start = time.perf_counter()
        report = ctx.builds.get(config)
        waited = time.perf_counter() - start
        self.build_wait_s += waited
        ctx.record_finished_builds()
        build_id = ctx.build_id(report)
        if report.status in (BuildStatus.COMPILE_FAILED, BuildStatus.SMEM_OVERFLOW):
            result = MeasureResult(status=MeasureStatus(str(report.status)), error=report.error)
        elif report.status == BuildStatus.SPILLS and not ctx.times_build(report.spill_bytes):
            trial.set_user_attr(search.ATTR_SPILL_BYTES, report.spill_bytes)
            result = MeasureResult(
                status=MeasureStatus.SPILLS,
                error=(
                    f"not timed: ptxas spills {report.spill_stores} B stores, "
                    f"{report.spill_loads} B loads, over the limit of {ctx.max_spill_bytes} B "
                    "(--max-spill-bytes)"
                ),
            )
        elif not report.usable:
            result = MeasureResult(
                status=MeasureStatus.COMPILE_FAILED, error=report.error or "no cubin"
            )
        else:
            start = time.perf_counter()
            result = ctx.measure_fn(report, self.problem)
            self.measure_s += time.perf_counter() - start
        result = _with_tflops(result, self.problem)
        provenance: dict[str, object] = {
            "study": self.study.study_name,
            "trial": trial.number,
            "sampler": ctx.sampler,
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }
        result = replace(result, extra={**result.extra, "search": provenance})
        ctx.store.record_measurement(
            self.problem_id, build_id, result, ctx.gpu, trial_number=trial.number
        )
        return result

    def _finish(
        self,
        trial: Trial,
        config: KernelConfig,
        role: str,
        status: str,
        median_ms: float | None,
        tflops: float | None,
    ) -> float:
        ok = status == MeasureStatus.OK and median_ms is not None and math.isfinite(median_ms)
        if ok and tflops is None:
            tflops = self.problem.tflops(median_ms)  # type: ignore[arg-type]
        self._mark(trial, role, status)
        if ok:
            trial.set_user_attr(search.ATTR_TFLOPS, tflops)
            return float(median_ms)  # type: ignore[arg-type]
        raise TrialPruned(f"{config.name}: {status}")

    def _reuse(self, trial: Trial, prior: FrozenTrial) -> float:
        status = search.trial_status(prior) or str(MeasureStatus.SKIPPED)
        self._mark(trial, TrialRole.REUSED, status)
        trial.set_user_attr("reused_from", prior.number)
        if prior.state == TrialState.COMPLETE and prior.value is not None:
            if search.ATTR_TFLOPS in prior.user_attrs:
                trial.set_user_attr(search.ATTR_TFLOPS, prior.user_attrs[search.ATTR_TFLOPS])
            return prior.value
        raise TrialPruned(f"{search.trial_config(prior)}: {status} (trial {prior.number})")

    def _mark(self, trial: Trial, role: str, status: str) -> None:
        trial.set_user_attr(search.ATTR_ROLE, role)
        trial.set_user_attr(search.ATTR_STATUS, status)
        self.roles[role] += 1

    def _scan(self, number: int) -> _Scan:
        """The study as seen by trial ``number``, once every earlier trial has published.

        A lower-numbered trial that is RUNNING but has no config yet is still sampling: wait
        (bounded) for it, so the tie-break by trial number sees every competing claim. One
        that never publishes is a dead process's; it is ignored after ``claim_wait_s``.
        """
        give_up = time.monotonic() + self.ctx.claim_wait_s
        while True:
            trials = self.study.get_trials(deepcopy=False)
            sampling = {
                t.number
                for t in trials
                if t.state == TrialState.RUNNING
                and t.number < number
                and t.number not in self.silent
                and search.ATTR_CONFIG not in t.user_attrs
                and search.ATTR_STATUS not in t.user_attrs
            }
            if not sampling:
                return _Scan.of(trials, times_spills=self.ctx.times_build)
            if time.monotonic() >= give_up:
                # Waited for these once: never again (the heartbeat will fail them).
                self.silent |= sampling
                return _Scan.of(trials, times_spills=self.ctx.times_build)
            time.sleep(_POLL_S)

    def _scan_now(self, study: optuna.Study) -> _Scan:
        return _Scan.of(study.get_trials(deepcopy=False), times_spills=self.ctx.times_build)

    def _within_budget(self, trial: Trial, config: KernelConfig) -> bool:
        """True when measuring ``config`` keeps the problem within ``trials``.

        Configs measured right now by lower-numbered trials count as spent; if they fill the
        budget, wait for them (they may end as a free build rejection) rather than overshoot.
        Stale trials of a killed process are failed meanwhile (after the grace period); a
        RUNNING trial that never sent a heartbeat cannot be failed that way, so the wait is
        bounded by ``in_flight_wait_s`` too.
        """
        if self.trials is None:
            return True
        give_up = time.monotonic() + self.ctx.in_flight_wait_s
        while True:
            scan = self._scan(trial.number)
            if len(scan.gpu_run) >= self.trials:
                return False
            in_flight = {
                name
                for name, number in scan.running.items()
                if number < trial.number and name != config.name and name not in scan.outcome
            }
            if len(scan.gpu_run) + len(in_flight) < self.trials:
                return True
            if time.monotonic() >= give_up:
                log.warning(
                    "%s: trials %s are still running after %.0f s; measuring regardless",
                    self.study.study_name,
                    sorted(scan.running[name] for name in in_flight),
                    self.ctx.in_flight_wait_s,
                )
                return True
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ExperimentalWarning)
                optuna.storages.fail_stale_trials(self.study)
            time.sleep(_POLL_S * 4)

    # ---------------------------------------------------------------- after each trial

    def after_trial(self, study: optuna.Study, frozen: FrozenTrial) -> None:
        all_trials = study.get_trials(deepcopy=False)
        scan = _Scan.of(all_trials, times_spills=self.ctx.times_build)
        role = frozen.user_attrs.get(search.ATTR_ROLE)
        best = self._best(all_trials)
        self.ctx.observer.trial_finished(
            TrialEvent(
                problem=self.problem,
                trial_number=frozen.number,
                config=search.trial_config(frozen),
                status=search.trial_status(frozen),
                role=role if isinstance(role, str) else None,
                value_ms=frozen.value if frozen.state == TrialState.COMPLETE else None,
                trials=len(scan.gpu_run),
                target=self.trials,
                best_ms=best.value if best is not None else None,
                best_config=search.trial_config(best) if best is not None else None,
            )
        )
        if self.done(scan):
            study.stop()
            return
        if role in (TrialRole.MEASURED, TrialRole.STORED):
            self.wasted = 0
        else:
            self.wasted += 1
        if self.wasted >= self.ctx.wasted_limit:
            self._enqueue_fresh(study, scan)

    def done(self, scan: _Scan | None = None) -> bool:
        """True when the problem needs no more trials from this process (now)."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return True
        return self.complete(scan)

    def complete(self, scan: _Scan | None = None) -> bool:
        """True when the trial budget is used or nothing is left to evaluate, whatever the
        clock says (a problem its time share cut short is not complete)."""
        if scan is None:
            scan = self._scan_now(self.study)
        if self.trials is not None and len(scan.gpu_run) >= self.trials:
            return True
        # Everything evaluated, or all that is left is being measured by other trials.
        left = self.names - scan.outcome.keys() - scan.running.keys()
        return not left

    def drive(self) -> None:
        """Run trials until :meth:`done`.

        A sampler may stop the study with configs still open (the grid sampler does once its
        grid has been visited, e.g. when a resume re-opens skipped spills), so this goes on
        until the problem is done. Every ``optimize`` call runs a trial, and wasted ones lead
        to a queued fresh config, so this ends.
        """
        while not self.done():
            timeout = (
                max(0.0, self.deadline - time.monotonic()) if self.deadline is not None else None
            )
            self.study.optimize(
                self.objective,
                timeout=timeout,
                callbacks=[self.after_trial],
                catch=(_SearchSkip,),
            )

    def queue_retimes(self) -> int:
        """Queue the configs this study skipped as SPILLS that the spill limit now times (a
        campaign resumed with a higher ``--max-spill-bytes``), so the sampler need not draw
        them again. Returns how many were queued."""
        trials = self.study.get_trials(deepcopy=False)
        scan = _Scan.of(trials, times_spills=self.ctx.times_build)
        waiting = {frozenset(t.params.items()) for t in trials if t.state == TrialState.WAITING}
        skipped = {
            name
            for t in trials
            if search.trial_status(t) == MeasureStatus.SPILLS
            and (name := search.trial_config(t)) is not None
            and name not in scan.outcome
            and name not in scan.running
        }
        queued = 0
        for config in self.space.configs:
            params = dict(search.params_of(config))
            if config.name in skipped and frozenset(params.items()) not in waiting:
                self.study.enqueue_trial(params, user_attrs={"retime": True})
                queued += 1
        if queued:
            log.info("%s: queued %d spilling configs the limit now times", self.study.study_name,
                     queued)  # fmt: skip
        return queued

    def _enqueue_fresh(self, study: optuna.Study, scan: _Scan) -> None:
        # The sampler keeps proposing what is known (converged TPE, or random draws landing on
        # invalid or measured points): queue an unevaluated config so the search progresses.
        left = sorted(self.names - scan.outcome.keys() - scan.running.keys())
        self.wasted = 0
        if not left:
            return
        pick = self.ctx.rng.choice(left)  # draw once, then find that config
        config = next(c for c in self.space.configs if c.name == pick)
        log.debug(
            "%s: %d proposals in a row evaluated nothing new; queueing %s",
            study.study_name,
            self.ctx.wasted_limit,
            config.name,
        )
        study.enqueue_trial(dict(search.params_of(config)), user_attrs={"fallback": True})

    @staticmethod
    def _best(trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
        best: FrozenTrial | None = None
        for t in trials:
            if t.state != TrialState.COMPLETE or t.value is None:
                continue
            if search.trial_status(t) != MeasureStatus.OK:
                continue
            if best is None or t.value < (best.value or math.inf):
                best = t
        return best

    def summary(self) -> ProblemSummary:
        all_trials = self.study.get_trials(deepcopy=False)
        scan = _Scan.of(all_trials, times_spills=self.ctx.times_build)
        best = self._best(all_trials)
        statuses = Counter(search.trial_status(t) or "?" for t in scan.outcome.values())
        tflops = best.user_attrs.get(search.ATTR_TFLOPS) if best is not None else None
        return ProblemSummary(
            problem=self.problem,
            study_name=self.study.study_name,
            space_size=len(self.space),
            best_config=search.trial_config(best) if best is not None else None,
            best_ms=best.value if best is not None else None,
            best_tflops=float(tflops) if isinstance(tflops, (int, float)) else None,
            trials=len(scan.gpu_run),
            evaluated=len(scan.outcome),
            statuses=dict(statuses),
            measured=self.roles[TrialRole.MEASURED],
            reused=self.roles[TrialRole.REUSED] + self.roles[TrialRole.STORED],
            invalid=self.roles[TrialRole.INVALID],
            duplicates=self.roles[TrialRole.DUPLICATE],
            times=TimeSplit(build_wait_s=self.build_wait_s, measure_s=self.measure_s),
        )


# --------------------------------------------------------------------------------------------
# The campaign


class _QuietSkips(logging.Filter):
    """Drops optuna's warnings (with traceback) about trials this campaign failed on purpose.

    A duplicate or over-budget trial is failed by raising :class:`_SearchSkip`, which optuna
    reports as a failure with a traceback; those are expected, and logged here at DEBUG.
    """

    def __init__(self) -> None:
        super().__init__()
        self.run: _ProblemRun | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], _SearchSkip):
            log.debug("trial skipped: %s", record.exc_info[1])
            return False
        run = self.run
        if run is None or not run.skipped:
            return True
        message = record.getMessage()
        return not any(message.startswith(f"Trial {n} failed") for n in run.skipped)


_OPTUNA_OPTIMIZE_LOGGER: Final = "optuna.study._optimize"


def _group(problem: Problem) -> tuple[int, str, bool]:
    return (problem.d, problem.dtype, problem.causal)


def run_campaign(
    problems: Sequence[Problem],
    *,
    store: Store,
    storage_url: str,
    gpu: GpuInfo,
    measure_fn: MeasureFn,
    arch: str = "sm_90",
    space_fn: SpaceFn | None = None,
    seeds_fn: SeedFn | None = None,
    build_fn: BuildFn | None = None,
    sampler: str = "tpe",
    trials: int | None = None,
    time_budget_s: float | None = None,
    max_spill_bytes: int | None = DEFAULT_MAX_SPILL_BYTES,
    seed: int | None = search.DEFAULT_SEED,
    worker_index: int = 0,
    build_batch: int = 16,
    progress: CampaignObserver | None = None,
    claim_wait_s: float = 10.0,
    wasted_limit: int = 25,
    heartbeat_interval: int = search.DEFAULT_HEARTBEAT_S,
    grace_period: int = search.DEFAULT_GRACE_S,
) -> CampaignSummary:
    """Tune every problem with its own study, compiling ahead of the GPU.

    Args:
        problems: what to tune, in order (problems of one (D, dtype, causal) group share
            builds, so keep them together).
        store: where builds and measurements are recorded.
        storage_url: optuna RDB storage URL (normally the store's database).
        gpu: the device measured on (provenance; its name must match ``Problem.gpu``; its
            ``smem_optin_bytes`` bounds the default space).
        measure_fn: verifies and times one build on one problem (``BenchWorker.measure``).
        arch: nvcc architecture of the default ``space_fn`` and ``build_fn``.
        space_fn: the valid configs of a problem; default :func:`codegen.space.enumerate_space`
            for ``arch`` and the GPU's shared memory.
        seeds_fn: the configs each new study starts with; default
            :func:`codegen.space.seed_configs`.
        build_fn: compiles a batch of configs; default :func:`codegen.build.build_configs`
            for ``arch`` with the settings' cache directory and jobs.
        sampler: ``tpe``, ``random`` or ``grid`` (see :func:`search.make_sampler`).
        trials: GPU-run configs per problem; None for no limit.
        time_budget_s: wall-clock budget of the whole campaign; None for no limit.
        max_spill_bytes: time builds whose ptxas spill stores and loads are at most this many
            bytes per thread; a build over it is recorded as SPILLS and not timed. None times
            every build, 0 none that spills.
        seed: sampler seed (mixed with the study name and ``worker_index``); None for a
            nondeterministic search.
        worker_index: distinguishes processes sharing the studies (e.g. the device index).
        build_batch: configs per background ``build_fn`` call.
        progress: receives progress events; None logs only.
        claim_wait_s: how long a trial waits for earlier trials to publish their configs.
        wasted_limit: proposals in a row that evaluate nothing new before an unevaluated
            config is queued.
        heartbeat_interval: seconds between trial heartbeats.
        grace_period: seconds after which a silent RUNNING trial is failed and re-queued.

    Returns:
        The summary; ``interrupted`` is True when a ``KeyboardInterrupt`` stopped the
        campaign (the interrupt is not re-raised; the studies stay resumable).

    Raises:
        ValueError: for an unknown sampler or a problem with an empty space.
    """
    if sampler not in search.sampler_names():
        raise ValueError(
            f"unknown sampler {sampler!r}; choose one of {', '.join(search.sampler_names())}"
        )
    space_fn, seeds_fn, build_fn = _defaults(arch, gpu, space_fn, seeds_fn, build_fn)
    observer: CampaignObserver = progress if progress is not None else NullObserver()
    started = time.monotonic()
    deadline = started + time_budget_s if time_budget_s is not None else None
    storage = search.open_storage(
        storage_url, heartbeat_interval=heartbeat_interval, grace_period=grace_period
    )
    builds = BuildAhead(build_fn, batch_size=build_batch)
    ctx = _Context(
        store=store,
        gpu=gpu,
        gpu_id=store.upsert_gpu(gpu),
        sampler=sampler,
        max_spill_bytes=max_spill_bytes,
        measure_fn=measure_fn,
        builds=builds,
        observer=observer,
        claim_wait_s=claim_wait_s,
        # A dead process's trial turns stale after grace_period; allow twice that.
        in_flight_wait_s=2.0 * grace_period + heartbeat_interval,
        wasted_limit=wasted_limit,
        rng=random.Random(seed),
    )
    spaces: dict[tuple[int, str, bool], search.SearchSpace] = {}
    for problem in problems:
        group = _group(problem)
        if group not in spaces:
            spaces[group] = search.SearchSpace.from_configs(space_fn(problem))
            first = spaces[group].configs[0]
            if (first.d, first.dtype, first.causal) != group:
                raise ValueError(
                    f"space_fn gave {first.name} for problem {problem.study_name}: "
                    "configs must match the problem's D, dtype and mask"
                )
            # Seeds first: they are every new study's first proposals.
            seeds = [c for c in seeds_fn(problem) if c in spaces[group]]
            builds.submit([*seeds, *spaces[group].configs])

    observer.campaign_started(problems, trials, time_budget_s)
    summaries: list[ProblemSummary] = []
    runs: list[_ProblemRun] = []
    interrupted = False
    quiet = _QuietSkips()
    logging.getLogger(_OPTUNA_OPTIMIZE_LOGGER).addFilter(quiet)
    try:
        for index, problem in enumerate(problems):
            problem_deadline = None
            if deadline is not None:
                share = (deadline - time.monotonic()) / (len(problems) - index)
                problem_deadline = time.monotonic() + max(0.0, share)
            run = _open_problem(
                ctx, index, problem, storage, spaces[_group(problem)], seeds_fn,
                trials, problem_deadline, seed, worker_index,
            )  # fmt: skip
            runs.append(run)
            observer.problem_started(index, problem, trials, problem_deadline)
            quiet.run = run
            run.drive()
            summaries.append(run.summary())
            observer.problem_finished(index, summaries[-1])
        # Time the even split gave to problems that finished early (budget reached, space
        # exhausted) goes back to the ones their share cut short, split evenly again.
        short = [run for run in runs if deadline is not None and not run.complete()]
        for k, run in enumerate(short):
            left = deadline - time.monotonic() if deadline is not None else 0.0
            if left < _MIN_EXTRA_S:
                break
            run.deadline = time.monotonic() + left / (len(short) - k)
            log.info("%s: %.0f s of unused budget to continue", run.study.study_name, left)
            observer.problem_started(run.index, run.problem, trials, run.deadline)
            quiet.run = run
            run.drive()
            summaries[run.index] = run.summary()
            observer.problem_finished(run.index, summaries[run.index])
    except KeyboardInterrupt:
        log.warning("interrupted; re-run the same command to resume")
        interrupted = True
    finally:
        logging.getLogger(_OPTUNA_OPTIMIZE_LOGGER).removeFilter(quiet)
        builds.close()
        ctx.record_finished_builds()
        ctx.build_wait_s = sum(run.build_wait_s for run in runs)
        ctx.measure_s = sum(run.measure_s for run in runs)
    result = CampaignSummary(
        problems=summaries,
        times=TimeSplit(
            wall_s=time.monotonic() - started,
            build_s=builds.busy_s,
            build_wait_s=ctx.build_wait_s,
            measure_s=ctx.measure_s,
        ),
        sampler=sampler,
        interrupted=interrupted,
    )
    observer.campaign_finished(result)
    return result


def _defaults(
    arch: str,
    gpu: GpuInfo,
    space_fn: SpaceFn | None,
    seeds_fn: SeedFn | None,
    build_fn: BuildFn | None,
) -> tuple[SpaceFn, SeedFn, BuildFn]:
    """The production space, seeds and build for ``arch`` where none is given."""
    from codegen.space import ARCH_SMEM_LIMIT, enumerate_space, seed_configs

    limit = ARCH_SMEM_LIMIT.get(arch, 0)
    smem = min(gpu.smem_optin_bytes or limit, limit) if limit else gpu.smem_optin_bytes

    def default_space(p: Problem) -> Sequence[KernelConfig]:
        return enumerate_space(p.d, p.dtype, p.causal, smem, arch)

    def default_seeds(p: Problem) -> Sequence[KernelConfig]:
        return seed_configs(p.d, p.dtype, p.causal)

    def default_build(configs: Sequence[KernelConfig]) -> Sequence[BuildReport]:
        from codegen.build import build_configs

        return build_configs(configs, arch=arch, smem_limit=smem or None)

    return (
        space_fn or default_space,
        seeds_fn or default_seeds,
        build_fn or default_build,
    )


def _open_problem(
    ctx: _Context,
    index: int,
    problem: Problem,
    storage: optuna.storages.BaseStorage,
    space: search.SearchSpace,
    seeds_fn: SeedFn,
    trials: int | None,
    deadline: float | None,
    seed: int | None,
    worker_index: int,
) -> _ProblemRun:
    sampler = search.make_sampler(
        ctx.sampler, space, _seed_for(seed, problem.study_name, worker_index)
    )
    study = search.open_study(problem, storage, sampler)
    bound = search.bind_space(study, space)
    if bound is not space:
        # The study was created with other choices: the grid must enumerate those.
        study.sampler = search.make_sampler(
            ctx.sampler, bound, _seed_for(seed, problem.study_name, worker_index)
        )
    search.enqueue_seeds(study, bound, seeds_fn(problem))
    problem_id = ctx.store.problem_id(problem, ctx.gpu_id)
    run = _ProblemRun(ctx, index, problem, study, bound, problem_id, trials, deadline)
    run.queue_retimes()
    return run
