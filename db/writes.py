"""The store's write side: record GPUs, builds, problems and measurements.

Each function takes the engine of a database whose schema is at head, runs in its own
write transaction (:func:`db.session.session_scope` with ``write=True``) and returns the id of
the row it wrote. :class:`db.store.Store` exposes them as methods; the contracts (idempotence,
what is refreshed on a repeat, what is refused) are documented there.

Contract: upserts go through the dialect's ``INSERT .. ON CONFLICT`` (SQLite and PostgreSQL
only), so concurrent writers (the tuner's workers) never race into duplicate rows; a
measurement is append-only. The read side is :mod:`db.queries`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from core.build_report import BuildReport
from core.gpu_name import normalize_gpu_name
from core.problem import Problem as ProblemSpec
from core.problem import describe_kv_page, seqlens_text
from core.records import GpuInfo, MeasureResult, MeasureStatus
from core.variant import SWITCHES
from db.models import (
    VARIANT_KEY_COLUMNS,
    Build,
    Gpu,
    Measurement,
    Problem,
    build_kv_page,
    build_report_values,
    kv_page_value,
    row_kv_page,
    row_variant,
    utcnow,
    variant_values,
)
from db.session import session_scope

__all__ = ["problem_id", "record_build", "record_measurement", "upsert_gpu"]

# The GPU columns a repeated upsert refreshes (the identity and created_at stay).
_GPU_REFRESHED = (
    "name",
    "sm_count",
    "driver_version",
    "cuda_version",
    "memory_bytes",
    "smem_optin_bytes",
    "l2_bytes",
    "updated_at",
)
_BUILD_IDENTITY = ("config_key", "arch", "source_hash")


def _insert(session: Session, model: type[Any]) -> Any:
    """An INSERT with ON CONFLICT support for the session's dialect."""
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return pg_insert(model)
    if dialect == "sqlite":
        return sqlite_insert(model)
    raise NotImplementedError(f"fa2tune's store supports SQLite and PostgreSQL, not {dialect}")


def _problem_identity(problem: ProblemSpec, gpu_id: int) -> dict[str, Any]:
    """The row's identity columns plus ``seqlens`` (a varlen row keeps its total token count
    in ``nk``: see db.models.Problem). The variant's key columns, the KV-cache layout and its
    length pattern are part of it; the cap's value is not (see :func:`problem_id`). A
    ``mixed`` pattern comes only with a layout: :class:`core.problem.Problem` refuses it
    without one."""
    lens = problem.seqlens
    keyed = variant_values(problem.variant)
    return {
        **{name: keyed[name] for name in VARIANT_KEY_COLUMNS},
        "gpu_id": gpu_id,
        "d": problem.d,
        "n": problem.n,
        "nk": problem.n_keys if lens is None else sum(lens),
        "seqlens": seqlens_text(lens),
        "batch": problem.batch,
        "heads": problem.heads,
        "kv_heads": problem.n_kv_heads,
        "dtype": problem.dtype,
        "causal": problem.causal,
        "kv_page": kv_page_value(problem.kv_page),
        "kv_lengths": problem.kv_lengths,
    }


def _build_values(report: BuildReport) -> dict[str, Any]:
    config = report.config
    return {
        "config_key": config.key,
        "config_name": config.name,
        "family": config.family,
        "d": config.d,
        "dtype": config.dtype,
        "causal": config.causal,
        "params": config.params(),
        "arch": report.arch,
        "status": str(report.status),
        "flags": list(report.flags),
        **build_report_values(report),
    }


def upsert_gpu(engine: Engine, info: GpuInfo) -> int:
    """:meth:`db.store.Store.upsert_gpu`: one row per (name key, compute capability).

    Raises:
        ValueError: the name has no key (blank, or only "NVIDIA"): no query could find it.
    """
    if not normalize_gpu_name(info.name):
        raise ValueError(f"GPU name {info.name!r} has no letters or digits to match it by")
    now = utcnow()
    values = {
        "name": info.name.strip(),
        "name_key": normalize_gpu_name(info.name),
        "compute_capability": info.compute_capability,
        "sm_count": info.sm_count,
        "driver_version": info.driver_version,
        "cuda_version": info.cuda_version,
        "memory_bytes": info.memory_bytes,
        "smem_optin_bytes": info.smem_optin_bytes,
        "l2_bytes": info.l2_bytes,
        "updated_at": now,
    }
    refreshed = {k: values[k] for k in _GPU_REFRESHED}
    with session_scope(engine, write=True) as s:
        stmt = (
            _insert(s, Gpu)
            .values(**values, created_at=now)
            .on_conflict_do_update(
                index_elements=["name_key", "compute_capability"], set_=refreshed
            )
        )
        s.execute(stmt)
        return s.scalars(
            select(Gpu.id).where(
                Gpu.name_key == values["name_key"],
                Gpu.compute_capability == info.compute_capability,
            )
        ).one()


def record_build(engine: Engine, report: BuildReport) -> int:
    """:meth:`db.store.Store.record_build`: one row per (config key, arch, source hash)."""
    values = _build_values(report)
    with session_scope(engine, write=True) as s:
        stmt = (
            _insert(s, Build)
            .values(**values, created_at=utcnow())
            .on_conflict_do_update(
                index_elements=list(_BUILD_IDENTITY),
                set_={k: v for k, v in values.items() if k not in _BUILD_IDENTITY},
            )
        )
        s.execute(stmt)
        return s.scalars(
            select(Build.id).where(*(getattr(Build, k) == values[k] for k in _BUILD_IDENTITY))
        ).one()


def problem_id(engine: Engine, problem: ProblemSpec, gpu_id: int) -> int:
    """:meth:`db.store.Store.problem_id`: look up first (a read), insert only when new."""
    identity = _problem_identity(problem, gpu_id)
    query = select(Problem.id).filter_by(**identity)
    with session_scope(engine) as s:
        found = s.scalar(query)
    if found is not None:
        return found
    with session_scope(engine, write=True) as s:
        s.execute(
            _insert(s, Problem)
            .values(**identity, softcap=problem.variant.softcap, created_at=utcnow())
            .on_conflict_do_nothing()
        )
        found = s.scalar(query)
    if found is None:  # a varlen list that agrees with a stored one on count, max and total
        raise ValueError(
            f"another varlen problem with {problem.batch} sequences, longest {problem.n} and "
            f"{identity['nk']} tokens in all is stored for this GPU, D, dtype and mask; "
            "the store keeps one length list per such triple"
        )
    return found


def record_measurement(
    engine: Engine,
    problem_id: int,
    build_id: int,
    result: MeasureResult,
    gpu: GpuInfo,
    trial_number: int | None = None,
) -> int:
    """:meth:`db.store.Store.record_measurement`: append one row, after checking the fit."""
    if result.status == MeasureStatus.OK and result.median_ms is None:
        raise ValueError("an OK measurement needs median_ms")
    with session_scope(engine, write=True) as s:
        problem = s.get(Problem, problem_id)
        build = s.get(Build, build_id)
        if problem is None:
            raise ValueError(f"no problem with id {problem_id}")
        if build is None:
            raise ValueError(f"no build with id {build_id}")
        fit = (build.d, build.dtype, build.causal) == (problem.d, problem.dtype, problem.causal)
        if not fit:
            raise ValueError(
                f"build {build.config_name} does not fit problem d={problem.d} "
                f"dtype={problem.dtype} causal={problem.causal}"
            )
        variant = row_variant(problem)
        if {n: bool(build.params.get(n, False)) for n in SWITCHES} != variant.needs:
            raise ValueError(
                f"build {build.config_name} is not built for the problem's attention variant "
                f"({variant.describe()}): a config's variant switches must be what it needs"
            )
        page, built = row_kv_page(problem), build_kv_page(build.params)
        if built != page:
            raise ValueError(
                f"build {build.config_name} is not built for the problem's KV-cache layout "
                f"({describe_kv_page(page)}; the build reads {describe_kv_page(built)})"
            )
        row = Measurement(
            problem_id=problem_id,
            build_id=build_id,
            status=str(result.status),
            median_ms=result.median_ms,
            p10_ms=result.p10_ms,
            p90_ms=result.p90_ms,
            reps=result.reps,
            tflops=result.tflops,
            max_abs_err=result.max_abs_err,
            rel_err=result.rel_err,
            ref_err=result.ref_err,
            driver_registers=result.driver_registers,
            driver_local_bytes=result.driver_local_bytes,
            error=result.error,
            extra=dict(result.extra) or None,
            driver_version=gpu.driver_version,
            cuda_version=gpu.cuda_version,
            sm_clock_mhz=gpu.sm_clock_mhz,
            mem_clock_mhz=gpu.mem_clock_mhz,
            trial_number=trial_number,
            created_at=utcnow(),
        )
        s.add(row)
        s.flush()
        return row.id
