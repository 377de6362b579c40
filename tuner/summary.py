"""What a campaign reports: progress events while it runs, summaries when it ends.

:func:`tuner.campaign.run_campaign` sends a :class:`CampaignObserver` one event per problem
started and finished and one :class:`TrialEvent` per finished trial, and returns a
:class:`CampaignSummary`: per problem a :class:`ProblemSummary` (best config, budget used,
outcome counts) and where the wall time went (:class:`TimeSplit`).

Contract: every type here is a frozen value built by the campaign from its studies; the
``to_dict`` forms are what ``fa2tune tune --summary-json`` writes. This module never touches
optuna, the database or the GPU, and draws nothing (:mod:`tuner.progress` renders these).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from core.problem import Problem

# The default observer logs as the campaign it reports on, as it did when it lived there.
log = logging.getLogger("tuner.campaign")


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
    """What :func:`tuner.campaign.run_campaign` did: one summary per problem plus totals."""

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
