"""Results files: dump a database (or one GPU of it) to JSON and ingest such a file.

The file's format, its records and their validation are :mod:`db.dump_format`'s. A dump refers
to everything by natural keys, never by database ids, which makes it portable between
databases and ingest idempotent: an ingested row that is already present (same natural key) is
skipped, and measurements are deduplicated on (problem, build, created_at, median_ms).

Contract: ingest validates the whole file before writing anything and writes in one
transaction, so a bad file changes nothing (:class:`~db.dump_format.TransferError`); equal
databases dump to equal files, written atomically. The service's ``POST /v1/results`` is
:func:`~db.dump_format.parse_dump` + :func:`ingest`.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from core.build_report import BuildStatus
from core.gpu_name import normalize_gpu_name
from core.kv_lengths import KV_LENGTHS
from core.problem import parse_seqlens, seqlens_text
from core.records import MeasureStatus
from core.variant import Variant
from core.version import __version__
from db.dump_fields import clip_text
from db.dump_format import (
    BuildKey,
    BuildRecord,
    BuildRef,
    ConfigRecord,
    DumpFile,
    GpuKey,
    GpuRecord,
    MeasurementRecord,
    ProblemKey,
    ProblemRecord,
    load_dump,
    parse_dump,
    variant_key,
)
from db.models import (
    NO_KV_PAGE,
    Build,
    Gpu,
    Measurement,
    Problem,
    build_report_values,
    kv_page_value,
    row_kv_page,
    row_variant,
    utcnow,
    variant_values,
)
from db.queries import build_config
from db.session import PG_INGEST_LOCK, session_scope
from db.store import Store

logger = logging.getLogger(__name__)

_IN_CHUNK = 500  # bound on SQL IN (...) list sizes


@dataclass(frozen=True)
class IngestSummary:
    """What an ingest did. ``added``/``skipped`` count measurements; the rest count rows added."""

    added: int
    skipped: int
    gpus_added: int = 0
    builds_added: int = 0
    problems_added: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


# ------------------------------------------------------------------------------------ dump


def _chunks(items: list[Any]) -> Iterable[list[Any]]:
    for start in range(0, len(items), _IN_CHUNK):
        yield items[start : start + _IN_CHUNK]


def _gpu_record(g: Gpu) -> GpuRecord:
    return GpuRecord(
        name=g.name,
        compute_capability=g.compute_capability,
        sm_count=g.sm_count,
        driver_version=g.driver_version,
        cuda_version=g.cuda_version,
        memory_bytes=g.memory_bytes,
        smem_optin_bytes=g.smem_optin_bytes,
        l2_bytes=g.l2_bytes,
    )


def _build_record(b: Build) -> BuildRecord:
    config = build_config(b)
    report = build_report_values(b)
    return BuildRecord(
        config_name=b.config_name,
        config=ConfigRecord.of(config),
        arch=b.arch,
        status=BuildStatus(b.status),
        flags=list(b.flags),
        # Clipped to what an ingest takes, so a file this writes always ingests.
        **{**report, "error": clip_text(report["error"])},
    )


def _problem_record(p: Problem, g: Gpu) -> ProblemRecord:
    return ProblemRecord(
        gpu=g.name,
        compute_capability=g.compute_capability,
        d=p.d,
        n=p.n,
        nk=p.nk,
        batch=p.batch,
        heads=p.heads,
        kv_heads=p.kv_heads,
        dtype=p.dtype,  # type: ignore[arg-type]
        causal=p.causal,
        seqlens=list(parse_seqlens(p.seqlens) or ()) or None,
        **_variant_fields(row_variant(p)),
        kv_page=row_kv_page(p),
        kv_lengths=p.kv_lengths,
    )


def _variant_fields(variant: Variant) -> dict[str, Any]:
    """A problem record's variant fields (their defaults, which a dump leaves out, when
    plain)."""
    return {
        "window_left": variant.window_left,
        "window_right": variant.window_right,
        "chunk": variant.chunk,
        "softcap": variant.softcap,
        "sinks": variant.sinks,
    }


def export(store: Store, gpu: str | None = None) -> DumpFile:
    """Everything in the database (or only what belongs to ``gpu``) as a :class:`DumpFile`.

    With a GPU filter only the builds its measurements use are included; without one, every
    build is (also those never measured). Records are sorted so equal databases give equal
    files.
    """
    with session_scope(store.engine) as s:
        gpu_query = select(Gpu).order_by(Gpu.name, Gpu.compute_capability)
        if gpu is not None:
            gpu_query = gpu_query.where(Gpu.name_key == normalize_gpu_name(gpu))
        gpus = list(s.scalars(gpu_query))
        gpu_by_id = {g.id: g for g in gpus}
        problems: list[Problem] = []
        for ids in _chunks(list(gpu_by_id)):
            problems.extend(s.scalars(select(Problem).where(Problem.gpu_id.in_(ids))))
        problem_by_id = {p.id: _problem_record(p, gpu_by_id[p.gpu_id]) for p in problems}
        measurements: list[Measurement] = []
        for ids in _chunks(list(problem_by_id)):
            measurements.extend(
                s.scalars(select(Measurement).where(Measurement.problem_id.in_(ids)))
            )
        if gpu is None:
            builds = list(s.scalars(select(Build)))
        else:
            builds = []
            for ids in _chunks(sorted({m.build_id for m in measurements})):
                builds.extend(s.scalars(select(Build).where(Build.id.in_(ids))))
        build_by_id = {b.id: _build_record(b) for b in builds}
        measurement_records = [
            MeasurementRecord(
                problem=problem_by_id[m.problem_id],
                build=BuildRef(
                    config_name=build_by_id[m.build_id].config_name,
                    arch=build_by_id[m.build_id].arch,
                    source_hash=build_by_id[m.build_id].source_hash,
                ),
                status=MeasureStatus(m.status),
                median_ms=m.median_ms,
                p10_ms=m.p10_ms,
                p90_ms=m.p90_ms,
                reps=m.reps,
                tflops=m.tflops,
                max_abs_err=m.max_abs_err,
                rel_err=m.rel_err,
                ref_err=m.ref_err,
                driver_registers=m.driver_registers,
                driver_local_bytes=m.driver_local_bytes,
                error=clip_text(m.error),
                extra=m.extra,
                driver_version=m.driver_version,
                cuda_version=m.cuda_version,
                sm_clock_mhz=m.sm_clock_mhz,
                mem_clock_mhz=m.mem_clock_mhz,
                trial_number=m.trial_number,
                created_at=m.created_at,
            )
            for m in measurements
        ]

    def problem_sort(p: ProblemRecord) -> tuple[Any, ...]:
        return (
            p.gpu,
            p.compute_capability,
            p.d,
            p.dtype,
            p.causal,
            p.n,
            p.nk,
            p.batch,
            p.heads,
            p.kv_heads,
            variant_key(p.variant),
            NO_KV_PAGE if p.kv_page is None else p.kv_page,  # dense problems keep their order
            KV_LENGTHS.index(p.kv_lengths),  # full first: files before patterns keep theirs
        )

    return DumpFile(
        generator=f"fa2tune {__version__}",
        gpus=[_gpu_record(g) for g in gpus],
        builds=sorted(build_by_id.values(), key=lambda b: (b.config_name, b.arch, b.source_hash)),
        problems=sorted(problem_by_id.values(), key=problem_sort),
        measurements=sorted(
            measurement_records,
            key=lambda m: (problem_sort(m.problem), m.created_at, m.build.config_name),
        ),
    )


def dump(store: Store, path: Path, gpu: str | None = None) -> DumpFile:
    """Write :func:`export` to ``path`` as JSON, atomically (a crash leaves no partial file).

    Returns:
        The dump that was written.
    """
    data = export(store, gpu)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(data.model_dump_json(indent=1))
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    logger.info(
        "dumped %d measurements (%d builds, %d problems) to %s",
        len(data.measurements),
        len(data.builds),
        len(data.problems),
        path,
    )
    return data


# ---------------------------------------------------------------------------------- ingest


def lock_for_ingest(session: Session) -> None:
    """Serialise ingests: their dedupe is check-then-insert, which must not interleave.

    On PostgreSQL this takes a transaction-scoped advisory lock; SQLite write sessions
    already start with ``BEGIN IMMEDIATE``.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_INGEST_LOCK})


def ingest_into(session: Session, data: DumpFile) -> IngestSummary:
    """Ingest a validated dump within the caller's transaction (see :func:`ingest`).

    The caller must hold the ingest lock (:func:`lock_for_ingest`) in ``session``.
    """
    now = utcnow()
    # GPUs: existing rows keep their facts; a dump never overwrites local provenance.
    gpu_ids: dict[GpuKey, int] = {}
    gpus_added = 0
    for g in data.gpus:
        if g.key in gpu_ids:
            continue
        found = session.scalar(
            select(Gpu.id).where(Gpu.name_key == g.key[0], Gpu.compute_capability == g.key[1])
        )
        if found is None:
            row = Gpu(
                name=g.name.strip(),
                name_key=g.key[0],
                compute_capability=g.compute_capability,
                sm_count=g.sm_count,
                driver_version=g.driver_version,
                cuda_version=g.cuda_version,
                memory_bytes=g.memory_bytes,
                smem_optin_bytes=g.smem_optin_bytes,
                l2_bytes=g.l2_bytes,
                created_at=now,
                updated_at=now,
            )
            session.add(row)
            session.flush()
            found = row.id
            gpus_added += 1
        gpu_ids[g.key] = found

    # Builds: look up every key of the file in chunks, insert the missing ones.
    build_ids: dict[BuildKey, int] = {}
    wanted_keys = sorted({b.key[0] for b in data.builds})
    for keys in _chunks(wanted_keys):
        for bid, ckey, arch, source_hash in session.execute(
            select(Build.id, Build.config_key, Build.arch, Build.source_hash).where(
                Build.config_key.in_(keys)
            )
        ):
            build_ids[(ckey, arch, source_hash)] = bid
    new_builds: dict[BuildKey, Build] = {}
    for b in data.builds:
        if b.key in build_ids or b.key in new_builds:
            continue
        config = b.config.to_config()
        new_builds[b.key] = Build(
            config_key=config.key,
            config_name=config.name,
            **b.config.model_dump(),
            arch=b.arch,
            status=str(b.status),
            flags=list(b.flags),
            **build_report_values(b),
            created_at=now,
        )
    session.add_all(new_builds.values())
    session.flush()
    build_ids.update({key: row.id for key, row in new_builds.items()})

    # Problems: all problems of the file's GPUs are few; load them and insert the missing.
    id_to_gpu_key = {v: k for k, v in gpu_ids.items()}
    problem_ids: dict[ProblemKey, int] = {}
    for p_row in session.scalars(select(Problem).where(Problem.gpu_id.in_(list(id_to_gpu_key)))):
        key: ProblemKey = (
            id_to_gpu_key[p_row.gpu_id],
            p_row.d,
            p_row.n,
            p_row.nk,
            p_row.batch,
            p_row.heads,
            p_row.kv_heads,
            p_row.dtype,
            p_row.causal,
            parse_seqlens(p_row.seqlens) or (),
            variant_key(row_variant(p_row)),
            row_kv_page(p_row),
            p_row.kv_lengths,
        )
        problem_ids[key] = p_row.id
    new_problems: dict[ProblemKey, Problem] = {}
    for p in data.problems:
        if p.key in problem_ids or p.key in new_problems:
            continue
        new_problems[p.key] = Problem(
            gpu_id=gpu_ids[p.gpu_key],
            d=p.d,
            n=p.n,
            nk=p.nk,
            batch=p.batch,
            heads=p.heads,
            kv_heads=p.kv_heads,
            dtype=p.dtype,
            causal=p.causal,
            seqlens=seqlens_text(tuple(p.seqlens) if p.seqlens else None),
            **variant_values(p.variant),
            kv_page=kv_page_value(p.kv_page),
            kv_lengths=p.kv_lengths,
            created_at=now,
        )
    session.add_all(new_problems.values())
    session.flush()
    problem_ids.update({key: row.id for key, row in new_problems.items()})

    # Measurements: dedupe on (problem, build, created_at, median_ms) against the database
    # and within the file, then insert in bulk.
    seen: set[tuple[int, int, datetime, float | None]] = set()
    touched = sorted({problem_ids[m.problem.key] for m in data.measurements})
    for ids in _chunks(touched):
        seen.update(
            session.execute(
                select(
                    Measurement.problem_id,
                    Measurement.build_id,
                    Measurement.created_at,
                    Measurement.median_ms,
                ).where(Measurement.problem_id.in_(ids))
            )
        )
    rows: list[dict[str, Any]] = []
    skipped = 0
    for m in data.measurements:
        pid, bid = problem_ids[m.problem.key], build_ids[m.build.key]
        natural = (pid, bid, m.created_at, m.median_ms)
        if natural in seen:
            skipped += 1
            continue
        seen.add(natural)
        fields = m.model_dump(exclude={"problem", "build", "status"})
        rows.append({**fields, "problem_id": pid, "build_id": bid, "status": str(m.status)})
    if rows:
        session.add_all(Measurement(**row) for row in rows)
        session.flush()
    return IngestSummary(
        added=len(rows),
        skipped=skipped,
        gpus_added=gpus_added,
        builds_added=len(new_builds),
        problems_added=len(new_problems),
    )


def ingest(store: Store, data: DumpFile | bytes | str | Mapping[str, Any]) -> IngestSummary:
    """Validate and ingest a results file in one transaction: all of it or nothing.

    Args:
        store: the target database.
        data: a parsed :class:`DumpFile`, JSON text/bytes, or decoded JSON.

    Returns:
        Counts of what was added and of measurements skipped as already present.

    Raises:
        TransferError: the data is not a valid results file (nothing is written).
    """
    dump_file = data if isinstance(data, DumpFile) else parse_dump(data)
    with session_scope(store.engine, write=True) as s:
        lock_for_ingest(s)
        summary = ingest_into(s, dump_file)
    logger.info(
        "ingested results: %d measurements added, %d already present",
        summary.added,
        summary.skipped,
    )
    return summary


def ingest_file(store: Store, path: Path) -> IngestSummary:
    """:func:`ingest` the file at ``path``.

    Raises:
        TransferError: unreadable or invalid file (nothing is written).
    """
    return ingest(store, load_dump(path))


def to_json(data: DumpFile) -> str:
    """The dump as JSON text (what :func:`dump` writes)."""
    return data.model_dump_json(indent=1)
