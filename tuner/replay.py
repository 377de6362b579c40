"""Replay mode: run the whole search on the CPU against a table of recorded measurements.

A replay table holds, per problem (keyed by :attr:`Problem.study_name`), the outcome of each
config: ``{"status": ..., "median_ms": ..., "build_status": ...}``. It is exported from a
results database (:func:`export_replay_table`, typically after an exhaustive ``grid``
campaign on the real GPU) and saved as JSON::

    {
      "format": "fa2tune-replay/1",
      "gpu": {... GpuInfo ...},
      "arch": "sm_90",
      "problems": {
        "<study name>": {
          "problem": {... Problem ...},
          "configs": {"<config name>": {"status": "OK", "median_ms": 0.41,
                                          "build_status": "OK"}, ...}
        }, ...
      }
    }

:func:`load_replay_table` also accepts the bare form ``{"<study name>": {"<config name>":
{"status": ..., "median_ms": ...}}}``. :class:`ReplayMeasure` then stands in for the build
(``build_fn``), the GPU worker (``measure_fn``) and the space (``space_fn``) of
:func:`tuner.campaign.run_campaign`, so samplers can be compared and the campaign tested
without a GPU or nvcc. :func:`run_replay_campaign` is that wiring, the one entry point of
``fa2tune tune --replay``, ``bench/compare_samplers.py`` and the tests.

A table answers for a problem's whole search space only when it *covers* it: every valid
config has a recorded outcome (:meth:`ReplayTable.missing` lists those that do not). A table
exported from a TPE campaign holds a few dozen configs of a few hundred and stands in for the
GPU over those only. A :class:`ReplayMeasure` made ``strict`` raises
:class:`ReplayMissingError` for a config it is asked to measure that has no recorded outcome,
instead of answering SKIPPED.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from core.build_report import BuildReport, BuildStatus
from core.family import AnyConfig, config_from_name
from core.problem import Problem
from core.records import GpuInfo, MeasureResult, MeasureStatus
from db.store import Store
from tuner import search
from tuner.campaign import CampaignOptions, SeedFn, SpaceFn, run_campaign
from tuner.problem_run import MeasureFn
from tuner.summary import CampaignObserver, CampaignSummary

log = logging.getLogger(__name__)

FORMAT: Final = "fa2tune-replay/1"
REPLAY_SOURCE_HASH: Final = "replay"
_BUILD_LEVEL: Final[dict[str, BuildStatus]] = {
    MeasureStatus.COMPILE_FAILED: BuildStatus.COMPILE_FAILED,
    MeasureStatus.SMEM_OVERFLOW: BuildStatus.SMEM_OVERFLOW,
    MeasureStatus.SPILLS: BuildStatus.SPILLS,
}


class ReplayMissingError(LookupError):
    """A config was measured in replay but the table has no recorded outcome for it."""


@dataclass(frozen=True)
class ReplayEntry:
    """The recorded outcome of one config on one problem.

    Attributes:
        status: a :class:`MeasureStatus` value.
        median_ms: the time when ``status`` is OK.
        build_status: the build's :class:`BuildStatus` when known (a spilling build that was
            timed is status OK, build status SPILLS).
        spill_bytes: the build's spill (stores or loads, bytes per thread) when known, so a
            replay applies ``--max-spill-bytes`` as the GPU campaign would.
    """

    status: str
    median_ms: float | None = None
    build_status: str | None = None
    spill_bytes: int | None = None

    @property
    def is_outcome(self) -> bool:
        """True when the entry says what the config does: a time, or a definite failure.

        SKIPPED (never ran, for some other reason) and an OK without a time say nothing.
        """
        if self.status == MeasureStatus.SKIPPED:
            return False
        return self.status != MeasureStatus.OK or self.median_ms is not None

    def to_dict(self) -> dict[str, object]:
        data: dict[str, object] = {"status": self.status, "median_ms": self.median_ms}
        if self.build_status is not None:
            data["build_status"] = self.build_status
        if self.spill_bytes is not None:
            data["spill_bytes"] = self.spill_bytes
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReplayEntry:
        status = str(data["status"])
        MeasureStatus(status)  # validates
        median = data.get("median_ms")
        build = data.get("build_status")
        if build is not None:
            BuildStatus(str(build))
        spill = data.get("spill_bytes")
        return cls(
            status=status,
            median_ms=float(median) if median is not None else None,
            build_status=str(build) if build is not None else None,
            spill_bytes=int(spill) if spill is not None else None,
        )


@dataclass
class ReplayTable:
    """Recorded outcomes per study, with the problems and GPU when the file carries them."""

    studies: dict[str, dict[str, ReplayEntry]]
    problems: dict[str, Problem] = field(default_factory=dict)
    gpu: GpuInfo | None = None
    arch: str | None = None

    def to_dict(self) -> dict[str, object]:
        """The JSON form (see the module docstring)."""
        return {
            "format": FORMAT,
            "gpu": self.gpu.to_dict() if self.gpu is not None else None,
            "arch": self.arch,
            "problems": {
                study: {
                    "problem": (self.problems[study].to_dict() if study in self.problems else None),
                    "configs": {name: e.to_dict() for name, e in sorted(entries.items())},
                }
                for study, entries in sorted(self.studies.items())
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReplayTable:
        """Parse the wrapped or the bare JSON form.

        Raises:
            ValueError: on anything that is not a replay table.
        """
        try:
            if "format" in data:
                if data["format"] != FORMAT:
                    raise ValueError(f"unsupported replay format {data['format']!r}")
                gpu = GpuInfo(**data["gpu"]) if data.get("gpu") else None
                studies: dict[str, dict[str, ReplayEntry]] = {}
                problems: dict[str, Problem] = {}
                for study, body in data["problems"].items():
                    studies[study] = _entries(body["configs"])
                    if body.get("problem"):
                        problems[study] = Problem.from_dict(body["problem"])
                return cls(studies=studies, problems=problems, gpu=gpu, arch=data.get("arch"))
            studies = {study: _entries(body) for study, body in data.items()}
            parsed = {study: problem_from_study_name(study) for study in studies}
            return cls(
                studies=studies,
                problems={study: p for study, p in parsed.items() if p is not None},
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"not a replay table: {exc}") from exc

    def configs(self, study_name: str) -> list[AnyConfig]:
        """The configs recorded for a study (its whole search space in replay)."""
        return sorted(config_from_name(n) for n in self.studies.get(study_name, {}))

    def missing(self, study_name: str, space: Iterable[AnyConfig]) -> list[AnyConfig]:
        """The configs of ``space`` that have no recorded outcome for the study.

        Empty when the table is exhaustive over ``space`` (a ``grid`` campaign's export);
        configs recorded with SKIPPED count as missing (see :attr:`ReplayEntry.is_outcome`).
        """
        entries = self.studies.get(study_name, {})
        return [c for c in space if (e := entries.get(c.name)) is None or not e.is_outcome]

    def best(
        self, study_name: str, among: Container[str] | None = None
    ) -> tuple[str, float] | None:
        """The fastest OK ``(config name, median ms)`` of a study, if any.

        Args:
            study_name: the study.
            among: only these config names (e.g. the current search space) when given.
        """
        ok = [
            (e.median_ms, name)
            for name, e in self.studies.get(study_name, {}).items()
            if e.status == MeasureStatus.OK
            and e.median_ms is not None
            and (among is None or name in among)
        ]
        if not ok:
            return None
        ms, name = min(ok)
        return name, ms


_STUDY_RE = re.compile(
    r"^(?P<gpu>[a-z0-9-]+)_d(?P<d>\d+)_n(?P<n>\d+)(?:_nk(?P<nk>\d+))?_b(?P<b>\d+)"
    r"_h(?P<h>\d+)(?:_kv(?P<kv>\d+))?_(?P<dtype>fp16|bf16)_(?P<mask>full|causal)$"
)


def problem_from_study_name(name: str) -> Problem | None:
    """The problem a study name (:attr:`Problem.study_name`) stands for, or None.

    The GPU is the normalised name in the study name (normalising it again is a no-op, so
    the problem's study name is ``name`` again).
    """
    m = _STUDY_RE.match(name)
    if m is None:
        return None
    return Problem(
        gpu=m["gpu"],
        d=int(m["d"]),
        n=int(m["n"]),
        batch=int(m["b"]),
        heads=int(m["h"]),
        dtype=m["dtype"],  # type: ignore[arg-type]
        causal=m["mask"] == "causal",
        kv_heads=int(m["kv"]) if m["kv"] else None,
        nk=int(m["nk"]) if m["nk"] else None,
    )


def _entries(body: Mapping[str, Any]) -> dict[str, ReplayEntry]:
    entries = {}
    for name, entry in body.items():
        config_from_name(name)  # validates
        entries[name] = ReplayEntry.from_dict(entry)
    return entries


def load_replay_table(path: str | Path) -> ReplayTable:
    """Read a replay table from a JSON file.

    Raises:
        OSError: when the file cannot be read.
        ValueError: when it is not JSON or not a replay table.
    """
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a replay table (top level is not an object)")
    return ReplayTable.from_dict(data)


def save_replay_table(table: ReplayTable, path: str | Path) -> None:
    """Write a replay table as JSON."""
    Path(path).write_text(json.dumps(table.to_dict(), indent=1) + "\n", encoding="utf-8")


def export_replay_table(store: Store, gpu: str) -> dict[str, object]:
    """Export one GPU's measurements as a replay table (the JSON form, ready to dump).

    Per problem and config the fastest OK measurement wins, else the latest one.

    Args:
        store: the results database.
        gpu: the GPU's name as users write it (``"H200"``, ``"NVIDIA H200"``).

    Raises:
        ValueError: when the store has no measurement for that GPU.
    """
    from core.gpu_name import normalize_gpu_name

    key = normalize_gpu_name(gpu)
    info = next((g for g in store.gpus() if normalize_gpu_name(g.name) == key), None)
    if info is None:
        raise ValueError(f"no GPU named {gpu!r} in the database")
    studies: dict[str, dict[str, ReplayEntry]] = {}
    problems: dict[str, Problem] = {}
    chosen: dict[tuple[str, str], tuple[bool, float, int]] = {}
    arch: str | None = None
    offset = 0
    while True:
        page = store.results(gpu=gpu, offset=offset, limit=1000)
        for row in page.items:
            problem = Problem(
                gpu=row.gpu,
                d=row.d,
                n=row.n,
                batch=row.batch,
                heads=row.heads,
                dtype=row.dtype,  # type: ignore[arg-type]
                causal=row.causal,
                kv_heads=row.kv_heads if row.kv_heads != row.heads else None,
                nk=row.nk if row.nk != row.n else None,
            )
            study = problem.study_name
            problems.setdefault(study, problem)
            arch = arch or row.arch
            ms = row.median_ms if row.status == MeasureStatus.OK else None
            # Rank: OK before not OK, then fastest, then latest.
            rank = (ms is None, ms if ms is not None else 0.0, -row.measurement_id)
            best = chosen.get((study, row.config_name))
            if best is not None and best <= rank:
                continue
            chosen[(study, row.config_name)] = rank
            spills = row.spill_stores > 0 or row.spill_loads > 0
            build = _BUILD_LEVEL.get(row.status) or (BuildStatus.SPILLS if spills else None)
            studies.setdefault(study, {})[row.config_name] = ReplayEntry(
                status=row.status,
                median_ms=row.median_ms,
                build_status=str(build) if build is not None else str(BuildStatus.OK),
                spill_bytes=max(row.spill_stores, row.spill_loads) if spills else None,
            )
        offset += len(page.items)
        if not page.items or offset >= page.total:
            break
    if not studies:
        raise ValueError(f"no measurements for GPU {gpu!r}")
    gpu_info = GpuInfo(
        name=info.name,
        compute_capability=info.compute_capability,
        sm_count=info.sm_count,
        driver_version=info.driver_version,
        cuda_version=info.cuda_version,
        memory_bytes=info.memory_bytes,
        smem_optin_bytes=info.smem_optin_bytes,
    )
    return ReplayTable(studies=studies, problems=problems, gpu=gpu_info, arch=arch).to_dict()


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
                status = _build_status(entry)
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


def _build_status(entry: ReplayEntry) -> BuildStatus:
    if entry.build_status is not None:
        return BuildStatus(entry.build_status)
    return _BUILD_LEVEL.get(entry.status, BuildStatus.OK)


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
            :func:`codegen.space.seed_configs`.
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
