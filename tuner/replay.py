"""Replay mode: run the whole search on the CPU against a table of recorded measurements.

:class:`ReplayMeasure` answers from a :class:`~tuner.replay_table.ReplayTable` (the table,
its file and its export are :mod:`tuner.replay_table`'s) in place of the build
(``build_fn``), the GPU worker (``measure_fn``) and the space (``space_fn``) of
:func:`tuner.campaign.run_campaign`, so samplers can be compared and the campaign tested
without a GPU or nvcc. :func:`run_replay_campaign` is that wiring, the one entry point of
``fa2tune tune --replay``, ``bench/compare_samplers.py`` and the tests.

A config the table has no outcome for is answered SKIPPED; a :class:`ReplayMeasure` made
``strict`` raises :class:`ReplayMissingError` instead. Without a named database the results
and studies go to a scratch folder deleted afterwards (one a killed run left behind is
deleted by the next run).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Final

from core.build_report import BuildReport, BuildStatus
from core.family import AnyConfig
from core.problem import Problem
from core.records import GpuInfo, MeasureResult, MeasureStatus
from db.store import Store
from tuner import search
from tuner.campaign import CampaignOptions, SeedFn, SpaceFn, run_campaign
from tuner.problem_run import MeasureFn
from tuner.replay_table import ReplayTable
from tuner.summary import CampaignObserver, CampaignSummary

log = logging.getLogger(__name__)

REPLAY_SOURCE_HASH: Final = "replay"


class ReplayMissingError(LookupError):
    """A config was measured in replay but the table has no recorded outcome for it."""


class ReplayMeasure:
    """Answers builds and measurements from a :class:`ReplayTable`.

    :func:`run_replay_campaign` uses :meth:`build` as ``build_fn``, the instance itself as
    ``measure_fn`` and :meth:`space` as ``space_fn`` of :func:`tuner.campaign.run_campaign`.

    Args:
        table: the recorded outcomes.
        arch: architecture written into the fake build reports.
        latency_s: seconds each measurement sleeps (to exercise timing-dependent code).
        strict: raise :class:`ReplayMissingError` when asked to measure a config without a
            recorded outcome, instead of answering SKIPPED (a search that must only see
            recorded outcomes, such as a sampler comparison, then fails loudly).
    """

    def __init__(
        self,
        table: ReplayTable,
        *,
        arch: str = "sm_90",
        latency_s: float = 0.0,
        strict: bool = False,
    ) -> None:
        self.table = table
        self.arch = table.arch or arch
        self.latency_s = latency_s
        self.strict = strict
        self._lock = threading.Lock()
        self._build_status: dict[str, BuildStatus] = {}
        self._spill_bytes: dict[str, int] = {}
        for entries in table.studies.values():
            for name, entry in entries.items():
                status = entry.build
                if status != BuildStatus.OK or name not in self._build_status:
                    self._build_status[name] = status
                if entry.spill_bytes is not None:
                    self._spill_bytes[name] = max(entry.spill_bytes, self._spill_bytes.get(name, 0))
        #: (study name, config name) of every measurement answered, in order.
        self.measured: list[tuple[str, str]] = []
        #: config names of every build asked for, in order.
        self.built: list[str] = []

    @property
    def measure_counts(self) -> Counter[tuple[str, str]]:
        """How often each (study, config) was measured."""
        with self._lock:
            return Counter(self.measured)

    def space(self, problem: Problem) -> list[AnyConfig]:
        """The configs recorded for ``problem`` (``space_fn``).

        Raises:
            KeyError: when the table has no such problem.
        """
        if problem.study_name not in self.table.studies:
            known = ", ".join(sorted(self.table.studies)) or "none"
            raise KeyError(f"replay table has no problem {problem.study_name} (it has: {known})")
        return self.table.configs(problem.study_name)

    def build(self, configs: Sequence[AnyConfig]) -> list[BuildReport]:
        """Fake build reports with the recorded build status (``build_fn``)."""
        reports = []
        for config in configs:
            status = self._build_status.get(config.name, BuildStatus.OK)
            failed = status in (BuildStatus.COMPILE_FAILED, BuildStatus.SMEM_OVERFLOW)
            # Unknown spill sizes replay as 64 B: a spill, but under the default limit.
            spill = self._spill_bytes.get(config.name, 64) if status == BuildStatus.SPILLS else 0
            reports.append(
                BuildReport(
                    config=config,
                    arch=self.arch,
                    status=status,
                    registers=None if failed else 128,
                    spill_stores=spill,
                    spill_loads=spill,
                    stack_bytes=0,
                    static_smem=0,
                    compile_seconds=0.0,
                    # Never opened: replay measurements come from the table.
                    cubin=None if failed else Path(f"/replay/{config.name}.cubin"),
                    source_hash=REPLAY_SOURCE_HASH,
                    nvcc_version="replay",
                    error=f"replayed {status}" if failed else None,
                )
            )
        with self._lock:
            self.built.extend(c.name for c in configs)
        return reports

    def measure(self, config: AnyConfig, problem: Problem) -> MeasureResult:
        """The recorded outcome of ``config`` on ``problem``; SKIPPED when not recorded.

        Raises:
            ReplayMissingError: in ``strict`` mode, when the table has no recorded outcome.
        """
        with self._lock:
            self.measured.append((problem.study_name, config.name))
        if self.latency_s:
            time.sleep(self.latency_s)
        entry = self.table.studies.get(problem.study_name, {}).get(config.name)
        if self.strict and (entry is None or not entry.is_outcome):
            recorded = len(self.table.studies.get(problem.study_name, {}))
            what = "no entry" if entry is None else f"only an entry recorded as {entry.status}"
            raise ReplayMissingError(
                f"replay table has {what} for config {config.name} of problem "
                f"{problem.study_name} ({recorded} configs recorded): the table does not cover "
                "the search space; export it from an exhaustive (grid) campaign"
            )
        if entry is None:
            return MeasureResult(status=MeasureStatus.SKIPPED, error="not in the replay table")
        status = MeasureStatus(entry.status)
        if status in (MeasureStatus.SPILLS, MeasureStatus.COMPILE_FAILED):
            # Recorded without a time (the build was rejected then); nothing to replay.
            return MeasureResult(status=MeasureStatus.SKIPPED, error=f"recorded as {status}")
        ms = entry.median_ms if status == MeasureStatus.OK else None
        return MeasureResult(
            status=status,
            median_ms=ms,
            p10_ms=ms,
            p90_ms=ms,
            reps=1 if ms is not None else 0,
            tflops=problem.tflops(ms) if ms else None,
            extra={"replay": True},
        )

    def __call__(self, report: BuildReport, problem: Problem) -> MeasureResult:
        return self.measure(report.config, problem)


def in_campaign_order(problems: Iterable[Problem]) -> list[Problem]:
    """``problems`` grouped as ``fa2tune tune`` groups them: by dtype, mask and D, then N (so
    each group's builds serve it in one go)."""
    return sorted(problems, key=lambda p: (p.dtype, p.causal, p.d, p.n, p.batch, p.heads))


#: Name prefix of the scratch folders (in the system's temp directory), before the owner's PID.
SCRATCH_PREFIX: Final = "fa2tune-replay-"
_SCRATCH_RE: Final = re.compile(rf"{SCRATCH_PREFIX}(\d+)-[^/]+")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: another user's process
        return True
    return True


def remove_stale_scratch(temp_dir: str | Path | None = None) -> list[Path]:
    """Delete the scratch folders of replay runs whose process is gone (killed with
    ``kill -9``, so its ``finally`` never ran).

    A folder is named ``fa2tune-replay-<pid>-<random>``; one whose PID is alive is kept
    (a running replay, or a recycled PID: then it goes at a later run).

    Args:
        temp_dir: where to look; default the system's temp directory.

    Returns:
        The folders deleted.
    """
    where = Path(temp_dir if temp_dir is not None else tempfile.gettempdir())
    removed = []
    try:
        entries = list(where.iterdir())
    except OSError:
        return []
    for entry in entries:
        m = _SCRATCH_RE.fullmatch(entry.name)
        if m is None or not entry.is_dir() or entry.is_symlink() or _alive(int(m[1])):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        if not entry.exists():
            log.info("removed %s, left behind by a killed replay", entry)
            removed.append(entry)
    return removed


def run_replay_campaign(
    table: ReplayTable | ReplayMeasure,
    options: CampaignOptions,
    *,
    store: Store | str | None = None,
    storage_url: str | None = None,
    problems: Sequence[Problem] | None = None,
    space_fn: SpaceFn | None = None,
    seeds_fn: SeedFn | None = None,
    measure_fn: MeasureFn | None = None,
    progress: CampaignObserver | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> CampaignSummary:
    """Run :func:`tuner.campaign.run_campaign` answered from a replay table: no GPU, no nvcc.

    The replay stands in for the builds, the GPU and (unless ``space_fn`` is given) the
    search space; new studies start from FlashAttention-2's seed configs, as in ``fa2tune
    tune``; the GPU is the table's, or a placeholder named after the first problem's GPU (a
    bare table has none).

    Args:
        table: the recorded outcomes, or a :class:`ReplayMeasure` over them (to set its
            latency or strictness, or to read afterwards what it built and measured).
        options: how to search.
        store: where builds and measurements are recorded: a :class:`Store` (left open), a
            database URL (opened and closed here; its studies resume on a rerun), or None for
            a scratch SQLite folder deleted afterwards, so a rerun starts over (replayed
            outcomes are not measurements: they go to a real database only when asked to).
            A scratch folder a killed run left behind is deleted by the next run
            (:func:`remove_stale_scratch`).
        storage_url: the optuna storage; default the store's database (see
            :func:`search.resolve_storage_url`), or a scratch SQLite file with a scratch store.
        problems: what to tune, in order; default the table's problems in campaign order
            (:func:`in_campaign_order`).
        space_fn: the configs of a problem; default those the table records for it.
        seeds_fn: the configs each new study starts with; default
            :func:`codegen.families.fa2.space.seed_configs`.
        measure_fn: verifies and times one build; default the replay (pass a wrapper around
            it to add latency or failures).
        progress: receives progress events; None logs only.
        clock: the time source of the time budget (see :func:`run_campaign`).

    Returns:
        The campaign's summary.

    Raises:
        ValueError: when there is no problem to tune, and as :func:`run_campaign` does.
        ReplayMissingError: from a strict :class:`ReplayMeasure` asked for a config the table
            does not cover.
    """
    from codegen.families.fa2.space import seed_configs

    replay = table if isinstance(table, ReplayMeasure) else ReplayMeasure(table)
    todo = (
        list(problems)
        if problems is not None
        else in_campaign_order(replay.table.problems.values())
    )
    if not todo:
        raise ValueError("no problem to replay: the table names none and none were given")
    gpu = replay.table.gpu or GpuInfo(
        name=todo[0].gpu, compute_capability="0.0", sm_count=0, driver_version="replay",
        cuda_version="replay",
    )  # fmt: skip

    def campaign(results: Store, studies: str) -> CampaignSummary:
        return run_campaign(
            todo,
            options,
            store=results,
            storage_url=studies,
            gpu=gpu,
            measure_fn=measure_fn or replay,
            space_fn=space_fn or replay.space,
            seeds_fn=seeds_fn or (lambda p: seed_configs(p.d, p.dtype, p.causal)),
            build_fn=replay.build,
            progress=progress,
            clock=clock,
        )

    if isinstance(store, Store):
        url = store.engine.url.render_as_string(hide_password=False)
        return campaign(store, storage_url or search.resolve_storage_url(url))
    if isinstance(store, str):
        with Store.from_url(store) as opened:
            return campaign(opened, storage_url or search.resolve_storage_url(store))
    remove_stale_scratch()
    with (
        tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-") as scratch,
        Store.from_url(f"sqlite:///{scratch}/results.db") as scratch_store,
    ):
        return campaign(scratch_store, storage_url or f"sqlite:///{scratch}/studies.db")
