"""The store's listings: every GPU with its counts, and pages of measurements.

Holds the queries :class:`db.store.Store` exposes as ``gpus`` and ``results`` (contracts on the
``Store``); the lookups of the best config are :mod:`db.queries`'. Same contract: read-only,
one session per query, detached values; GPU names matched through
:func:`core.gpu_name.normalize_gpu_name`.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, Engine, func, select

from core.gpu_name import normalize_gpu_name
from core.records import MeasureStatus
from db.models import Build, Gpu, Measurement, Problem, row_kv_page, row_variant
from db.results import MAX_PAGE, GpuSummary, ResultPage, ResultRow
from db.session import session_scope

__all__ = ["gpus", "results"]


def gpus(engine: Engine) -> list[GpuSummary]:
    """:meth:`db.store.Store.gpus`."""
    ok = func.count(Measurement.id).filter(Measurement.status == MeasureStatus.OK.value)
    query = (
        select(Gpu, func.count(Measurement.id), ok)
        .outerjoin(Problem, Problem.gpu_id == Gpu.id)
        .outerjoin(Measurement, Measurement.problem_id == Problem.id)
        .group_by(Gpu.id)
        .order_by(Gpu.name, Gpu.compute_capability)
    )
    with session_scope(engine) as s:
        return [
            GpuSummary(
                name=g.name,
                compute_capability=g.compute_capability,
                sm_count=g.sm_count,
                driver_version=g.driver_version,
                cuda_version=g.cuda_version,
                memory_bytes=g.memory_bytes,
                smem_optin_bytes=g.smem_optin_bytes,
                l2_bytes=g.l2_bytes,
                measurements=total,
                ok_measurements=n_ok,
            )
            for g, total, n_ok in s.execute(query)
        ]


def results(
    engine: Engine,
    gpu: str | None = None,
    d: int | None = None,
    n: int | None = None,
    *,
    dtype: str | None = None,
    causal: bool | None = None,
    status: str | None = None,
    offset: int = 0,
    limit: int = 100,
) -> ResultPage:
    """:meth:`db.store.Store.results`: one count query, one page query."""
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be in 1..{MAX_PAGE}, got {limit}")
    conditions: list[ColumnElement[bool]] = []
    if gpu is not None:
        conditions.append(Gpu.name_key == normalize_gpu_name(gpu))
    if d is not None:
        conditions.append(Problem.d == d)
    if n is not None:
        conditions.append(Problem.n == n)
    if dtype is not None:
        conditions.append(Problem.dtype == dtype)
    if causal is not None:
        conditions.append(Problem.causal == causal)
    if status is not None:
        conditions.append(Measurement.status == status)
    joined = (
        select(Measurement, Problem, Gpu, Build)
        .join(Problem, Problem.id == Measurement.problem_id)
        .join(Gpu, Gpu.id == Problem.gpu_id)
        .join(Build, Build.id == Measurement.build_id)
        .where(*conditions)
    )
    with session_scope(engine) as s:
        total = s.scalar(
            select(func.count(Measurement.id))
            .join(Problem, Problem.id == Measurement.problem_id)
            .join(Gpu, Gpu.id == Problem.gpu_id)
            .where(*conditions)
        )
        rows = s.execute(
            joined.order_by(
                Gpu.name,
                Problem.d,
                Problem.n,
                Problem.nk,
                Problem.dtype,
                Problem.causal,
                Problem.batch,
                Problem.heads,
                Problem.kv_heads,
                Problem.window_left,
                Problem.window_right,
                Problem.chunk,
                Problem.softcap_on,
                Problem.sinks,
                # A problem's rows together: a shape's cache layouts and length patterns are
                # problems of their own.
                Problem.kv_page,
                Problem.kv_lengths,
                Measurement.median_ms.is_(None),
                Measurement.median_ms,
                Measurement.id,
            )
            .offset(offset)
            .limit(limit)
        )
        items = [
            ResultRow(
                measurement_id=m.id,
                gpu=g.name,
                compute_capability=g.compute_capability,
                d=p.d,
                n=p.n,
                nk=p.nk,
                batch=p.batch,
                heads=p.heads,
                kv_heads=p.kv_heads,
                dtype=p.dtype,
                causal=p.causal,
                config_name=b.config_name,
                family=b.family,
                config_key=b.config_key,
                arch=b.arch,
                source_hash=b.source_hash,
                registers=b.registers,
                spill_stores=b.spill_stores,
                spill_loads=b.spill_loads,
                status=m.status,
                median_ms=m.median_ms,
                p10_ms=m.p10_ms,
                p90_ms=m.p90_ms,
                tflops=m.tflops,
                max_abs_err=m.max_abs_err,
                rel_err=m.rel_err,
                error=m.error,
                trial_number=m.trial_number,
                driver_version=m.driver_version,
                cuda_version=m.cuda_version,
                measured_at=m.created_at,
                variant=row_variant(p),
                kv_page=row_kv_page(p),
                kv_lengths=p.kv_lengths,
            )
            for m, p, g, b in rows
        ]
    return ResultPage(total=total or 0, offset=offset, limit=limit, items=items)
