"""Replay tables: recorded outcomes per problem and config, their JSON file and their export.

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
{"status": ..., "median_ms": ...}}}``; anything else is refused with a ``ValueError``. A
table's studies may hold configs of several kernel families.

A table answers for a problem's whole search space only when it *covers* it: every valid
config has a recorded outcome (:meth:`ReplayTable.missing` lists those that do not). A table
exported from a TPE campaign holds a few dozen configs of a few hundred and stands in for the
GPU over those only. Answering a campaign from a table is :mod:`tuner.replay`'s.
"""

from __future__ import annotations

import json
import re
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from core.build_report import BuildStatus
from core.family import AnyConfig, config_from_name
from core.problem import Problem
from core.records import GpuInfo, MeasureStatus
from db.store import Store

FORMAT: Final = "fa2tune-replay/1"
#: The build status a measurement status implies when the table records none.
_BUILD_LEVEL: Final[dict[str, BuildStatus]] = {
    MeasureStatus.COMPILE_FAILED: BuildStatus.COMPILE_FAILED,
    MeasureStatus.SMEM_OVERFLOW: BuildStatus.SMEM_OVERFLOW,
    MeasureStatus.SPILLS: BuildStatus.SPILLS,
}


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

    @property
    def build(self) -> BuildStatus:
        """The build's status: the recorded one, else the one the status implies (OK unless
        the build was rejected)."""
        if self.build_status is not None:
            return BuildStatus(self.build_status)
        return _BUILD_LEVEL.get(self.status, BuildStatus.OK)

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
        """The configs recorded for a study (its whole search space in replay): grouped by
        family (by name), each family's in the order its config type defines.

        Configs of different families do not compare (their types differ), so the family
        name goes first in the key; within a family the order is the one of a one-family
        table (a table exported from several families' results was refused otherwise).
        """
        configs = [config_from_name(n) for n in self.studies.get(study_name, {})]
        return sorted(configs, key=_family_first)

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


def _family_first(config: AnyConfig) -> tuple[str, AnyConfig]:
    return (config.family, config)


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
            if "_vl" in row.config_name.split("_"):
                continue  # a packed batch's row: its lengths are not in the listing
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
                variant=row.variant,
                kv_page=row.kv_page,
                kv_lengths=row.kv_lengths,
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
        l2_bytes=info.l2_bytes,
    )
    return ReplayTable(studies=studies, problems=problems, gpu=gpu_info, arch=arch).to_dict()
