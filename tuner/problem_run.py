"""One problem's study during a campaign: answer its trials, decide when it is done.

:class:`ProblemRun` is the objective of one problem's optuna study (:mod:`tuner.search`)
within :func:`tuner.campaign.run_campaign`, which opens the study and calls
:meth:`ProblemRun.drive`. Each trial:

1. maps the sampler's parameters to a config; an invalid combination is pruned at once
   (status ``INVALID``), never built nor measured;
2. publishes its config (user attribute ``config``) and checks the study for other trials
   of the same config: an earlier finished one is reused, a running one makes this trial a
   ``DUPLICATE`` (failed, so the sampler ignores it);
3. asks the store whether the config was already measured for the problem (a resume after
   a kill, or another campaign): if so that outcome is reused and nothing is measured;
4. otherwise awaits the build (:class:`tuner.build_ahead.BuildAhead`), records a failed,
   overflowing or too much spilling build as a measurement with that status, and has a
   usable one verified and timed by ``measure_fn``. The measurement goes to the store with
   its provenance; the trial's value is the median ms when the status is OK, else the trial
   is pruned with the status as user attribute, so a failure can never become the best.

Sharing a study
    Several processes (one per GPU) may run the same campaign on one database: optuna's
    distributed mode, each trial asking the shared study. Two trials can still draw the same
    config; the trial *numbers* (assigned atomically by the storage) break the tie: a trial
    first publishes its config, waits until every lower-numbered running trial has published
    its own, and yields to a lower-numbered trial of the same config. So a config is measured
    once per problem, whatever the interleaving.

Contract: ``trials`` counts the distinct configs the study has run on the GPU, whoever ran
them; a trial over that budget is failed (``ABANDONED``) and stops the study. Nothing here
splits time between problems, compiles on its own or opens a study: that is the campaign's.
"""

from __future__ import annotations

import logging
import math
import os
import random
import socket
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Final

import optuna
from optuna.exceptions import TrialPruned
from optuna.trial import FrozenTrial, Trial, TrialState

from core.build_report import BuildReport, BuildStatus
from core.family import AnyConfig
from core.problem import Problem
from core.records import GpuInfo, MeasureResult, MeasureStatus
from db.store import Store
from tuner import search
from tuner.build_ahead import BuildAhead
from tuner.search import TrialRole
from tuner.summary import CampaignObserver, ProblemSummary, TimeSplit, TrialEvent

log = logging.getLogger(__name__)

#: Verify and time one usable build on one problem (``tuner.worker.BenchWorker.measure``).
MeasureFn = Callable[[BuildReport, Problem], MeasureResult]

STATUS_ABANDONED: Final = "ABANDONED"
_MEASURE_STATUSES: Final[frozenset[str]] = frozenset(str(s) for s in MeasureStatus)
_POLL_S: Final = 0.05


class SearchSkip(Exception):
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


def _with_tflops(result: MeasureResult, problem: Problem) -> MeasureResult:
    if result.tflops is None and result.median_ms and result.status == MeasureStatus.OK:
        return replace(result, tflops=problem.flops / (result.median_ms * 1e-3) / 1e12)
    return result


@dataclass
class CampaignContext:
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
    #: The campaign's clock for deadlines and time shares (seconds, monotonic).
    clock: Callable[[], float] = time.monotonic
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


class ProblemRun:
    """Answers the trials of one problem's study (the objective) and decides when to stop."""

    def __init__(
        self,
        ctx: CampaignContext,
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
        # Whose trial this is: a campaign resumed after a kill fails it at once.
        trial.set_user_attr(search.ATTR_OWNER, search.trial_owner(trial.number))
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
            raise SearchSkip(f"{config.name} is being measured by trial {owner}")
        if not self._within_budget(trial, config):
            self._mark(trial, TrialRole.ABANDONED, STATUS_ABANDONED)
            self.study.stop()
            self.skipped.add(trial.number)
            raise SearchSkip("the trial budget is used up")
        key = config.key
        if key in self.ctx.store.measured_pairs(self.problem_id):
            status, median = self.ctx.store.outcome(self.problem_id, key)
            retime = status == MeasureStatus.SPILLS and self.ctx.times_build(
                self.ctx.store.spill_bytes(key)
            )
            if not retime:
                return self._finish(trial, config, TrialRole.STORED, status, median, None)
        result = self._evaluate(trial, config)
        return self._finish(
            trial, config, TrialRole.MEASURED, str(result.status), result.median_ms, result.tflops
        )

    def _evaluate(self, trial: Trial, config: AnyConfig) -> MeasureResult:
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
        config: AnyConfig,
        role: str,
        status: str,
        median_ms: float | None,
        tflops: float | None,
    ) -> float:
        ok = status == MeasureStatus.OK and median_ms is not None and math.isfinite(median_ms)
        if ok and tflops is None:
            tflops = self.problem.flops / (median_ms * 1e-3) / 1e12  # type: ignore[operator]
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

    def _within_budget(self, trial: Trial, config: AnyConfig) -> bool:
        """True when measuring ``config`` keeps the problem within ``trials``.

        Configs measured right now by lower-numbered trials count as spent; if they fill the
        budget, wait for them (they may end as a free build rejection) rather than overshoot.
        Stale trials of a killed process are failed meanwhile (:func:`search.fail_stale_trials`:
        at once for a dead process of this machine, else after the grace period); the wait is
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
            search.fail_stale_trials(self.study)
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
        if self.deadline is not None and self.ctx.clock() >= self.deadline:
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
                max(0.0, self.deadline - self.ctx.clock()) if self.deadline is not None else None
            )
            self.study.optimize(
                self.objective,
                timeout=timeout,
                callbacks=[self.after_trial],
                catch=(SearchSkip,),
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
            params = self.space.enqueue_params(config, self.study)
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
        study.enqueue_trial(self.space.enqueue_params(config, study), user_attrs={"fallback": True})

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
