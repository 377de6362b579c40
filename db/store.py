"""The typed query layer every other stage uses: record builds and measurements, ask for the best.

Writers (the tuner's workers) and readers (the service, the CLI) share one :class:`Store` API;
all SQL lives here and in :mod:`db.transfer`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, Engine, Select, exists, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session, contains_eager

from core.build_report import BuildReport
from core.config import KernelConfig
from core.family import AnyConfig, config_from_params
from core.gpu_name import normalize_gpu_name
from core.problem import Problem as ProblemSpec
from core.records import GpuInfo, MeasureResult, MeasureStatus
from db.models import Build, Gpu, Measurement, Problem, build_report_values, utcnow
from db.session import init_db, make_engine, session_scope

MAX_PAGE = 1000


@dataclass(frozen=True)
class BestResult:
    """The fastest correct config for a problem, with its build and measurement provenance.

    Attributes:
        config: the winning kernel configuration.
        config_key: its stable key.
        gpu: GPU name as the driver reports it (e.g. ``"NVIDIA H200"``).
        compute_capability: e.g. ``"9.0"``.
        d, n, nk, batch, heads, kv_heads, dtype, causal: the problem it was measured on.
        exact: True when the problem's N is the one asked for.
        from_n: the N the result was measured at (== n; differs from the request when
            ``exact`` is False).
        median_ms, p10_ms, p90_ms: kernel time per launch, milliseconds.
        tflops: throughput as recorded by the tuner.
        max_abs_err, rel_err: accuracy against the float32 reference.
        arch, registers, spill_stores, spill_loads, stack_bytes, static_smem, source_hash,
            nvcc_version: the build.
        driver_version, cuda_version, sm_clock_mhz, mem_clock_mhz: device state when measured.
        measured_at: when the measurement was taken (UTC).
        measurement_id, build_id, problem_id: database ids (local to this database).
    """

    config: KernelConfig
    config_key: str
    gpu: str
    compute_capability: str
    d: int
    n: int
    nk: int
    batch: int
    heads: int
    kv_heads: int
    dtype: str
    causal: bool
    exact: bool
    from_n: int
    median_ms: float
    p10_ms: float | None
    p90_ms: float | None
    tflops: float | None
    max_abs_err: float | None
    rel_err: float | None
    arch: str
    registers: int | None
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    static_smem: int
    source_hash: str
    nvcc_version: str
    driver_version: str
    cuda_version: str
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    measured_at: datetime
    measurement_id: int
    build_id: int
    problem_id: int

    @property
    def config_name(self) -> str:
        return self.config.name

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (config nested, ``measured_at`` ISO 8601)."""
        data = asdict(self)
        data["config"] = self.config.to_dict()
        data["config_name"] = self.config.name
        data["measured_at"] = self.measured_at.isoformat()
        return data


@dataclass(frozen=True)
class GpuSummary:
    """A GPU known to the database, with how many measurements it has."""

    name: str
    compute_capability: str
    sm_count: int
    driver_version: str
    cuda_version: str
    memory_bytes: int
    smem_optin_bytes: int
    measurements: int
    ok_measurements: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ResultRow:
    """One measurement with its problem, GPU and build, flattened for listing."""

    measurement_id: int
    gpu: str
    compute_capability: str
    d: int
    n: int
    nk: int
    batch: int
    heads: int
    kv_heads: int
    dtype: str
    causal: bool
    config_name: str
    config_key: str
    arch: str
    source_hash: str
    registers: int | None
    spill_stores: int
    spill_loads: int
    status: str
    median_ms: float | None
    p10_ms: float | None
    p90_ms: float | None
    tflops: float | None
    max_abs_err: float | None
    rel_err: float | None
    error: str | None
    trial_number: int | None
    driver_version: str
    cuda_version: str
    measured_at: datetime

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["measured_at"] = self.measured_at.isoformat()
        return data


@dataclass(frozen=True)
class ResultPage:
    """A page of :class:`ResultRow` plus the total count of matching rows."""

    total: int
    offset: int
    limit: int
    items: list[ResultRow]

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "offset": self.offset,
            "limit": self.limit,
            "items": [row.to_dict() for row in self.items],
        }


def _insert(session: Session, model: type[Any]) -> Any:
    """An INSERT with ON CONFLICT support for the session's dialect."""
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return pg_insert(model)
    if dialect == "sqlite":
        return sqlite_insert(model)
    raise NotImplementedError(f"fa2tune's store supports SQLite and PostgreSQL, not {dialect}")


def _problem_identity(problem: ProblemSpec, gpu_id: int) -> dict[str, Any]:
    return {
        "gpu_id": gpu_id,
        "d": problem.d,
        "n": problem.n,
        "nk": problem.n_keys,
        "batch": problem.batch,
        "heads": problem.heads,
        "kv_heads": problem.n_kv_heads,
        "dtype": problem.dtype,
        "causal": problem.causal,
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


def build_config(build: Build) -> AnyConfig:
    """The config (of the build's family) a build row was compiled from."""
    return config_from_params(build.family, build.d, build.dtype, build.causal, build.params)


def problem_flops(problem: Problem) -> float:
    """Forward FLOPs of a problem row, counted as :attr:`core.problem.Problem.flops`."""
    spec = ProblemSpec(
        gpu="",
        d=problem.d,
        n=problem.n,
        batch=problem.batch,
        heads=problem.heads,
        dtype=problem.dtype,  # type: ignore[arg-type]
        causal=problem.causal,
        kv_heads=problem.kv_heads,
        nk=problem.nk,
    )
    return spec.flops


def _best_result(
    gpu: Gpu, problem: Problem, build: Build, m: Measurement, *, exact: bool
) -> BestResult:
    assert m.median_ms is not None  # only OK rows with a median are ranked
    return BestResult(
        config=build_config(build),
        config_key=build.config_key,
        gpu=gpu.name,
        compute_capability=gpu.compute_capability,
        d=problem.d,
        n=problem.n,
        nk=problem.nk,
        batch=problem.batch,
        heads=problem.heads,
        kv_heads=problem.kv_heads,
        dtype=problem.dtype,
        causal=problem.causal,
        exact=exact,
        from_n=problem.n,
        median_ms=m.median_ms,
        p10_ms=m.p10_ms,
        p90_ms=m.p90_ms,
        tflops=m.tflops,
        max_abs_err=m.max_abs_err,
        rel_err=m.rel_err,
        arch=build.arch,
        registers=build.registers,
        spill_stores=build.spill_stores,
        spill_loads=build.spill_loads,
        stack_bytes=build.stack_bytes,
        static_smem=build.static_smem,
        source_hash=build.source_hash,
        nvcc_version=build.nvcc_version,
        driver_version=m.driver_version,
        cuda_version=m.cuda_version,
        sm_clock_mhz=m.sm_clock_mhz,
        mem_clock_mhz=m.mem_clock_mhz,
        measured_at=m.created_at,
        measurement_id=m.id,
        build_id=build.id,
        problem_id=problem.id,
    )


class StoredOutcome(NamedTuple):
    """What the store says one config did on one problem (:meth:`Store.outcome`)."""

    status: str
    median_ms: float | None


class Store:
    """Typed access to the results database.

    Args:
        engine: an engine from :func:`db.session.make_engine` whose schema is at head
            (see :meth:`from_url` or :func:`db.session.init_db`).
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    @classmethod
    def from_url(cls, url: str, *, migrate: bool = True) -> Store:
        """Open the database at ``url``, migrating its schema to head unless ``migrate=False``."""
        engine = make_engine(url)
        if migrate:
            init_db(engine)
        return cls(engine)

    @property
    def engine(self) -> Engine:
        return self._engine

    def close(self) -> None:
        """Release the engine's pooled connections."""
        self._engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ---------------------------------------------------------------- writes

    def upsert_gpu(self, info: GpuInfo) -> int:
        """Record a GPU (or refresh its latest driver/CUDA/memory facts) and return its id."""
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
            "updated_at": now,
        }
        refreshed = {
            k: values[k]
            for k in (
                "name",
                "sm_count",
                "driver_version",
                "cuda_version",
                "memory_bytes",
                "smem_optin_bytes",
                "updated_at",
            )
        }
        with session_scope(self._engine, write=True) as s:
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

    def record_build(self, report: BuildReport) -> int:
        """Record a build and return its id; the same (config, arch, source hash) is one row.

        Recording the same identity again updates the row to the newer report (a rebuild
        after a transient nvcc failure corrects the status) and returns the same id.
        """
        values = _build_values(report)
        identity = ("config_key", "arch", "source_hash")
        with session_scope(self._engine, write=True) as s:
            stmt = (
                _insert(s, Build)
                .values(**values, created_at=utcnow())
                .on_conflict_do_update(
                    index_elements=list(identity),
                    set_={k: v for k, v in values.items() if k not in identity},
                )
            )
            s.execute(stmt)
            return s.scalars(
                select(Build.id).where(*(getattr(Build, k) == values[k] for k in identity))
            ).one()

    def problem_id(self, problem: ProblemSpec, gpu_id: int) -> int:
        """The id of ``problem`` on GPU ``gpu_id``, created when new.

        ``problem.gpu`` is not consulted: the GPU is ``gpu_id`` (from :meth:`upsert_gpu`).
        """
        identity = _problem_identity(problem, gpu_id)
        query = select(Problem.id).filter_by(**identity)
        with session_scope(self._engine) as s:
            found = s.scalar(query)
        if found is not None:
            return found
        with session_scope(self._engine, write=True) as s:
            s.execute(
                _insert(s, Problem).values(**identity, created_at=utcnow()).on_conflict_do_nothing()
            )
            return s.scalars(query).one()

    def record_measurement(
        self,
        problem_id: int,
        build_id: int,
        result: MeasureResult,
        gpu: GpuInfo,
        trial_number: int | None = None,
    ) -> int:
        """Append one measurement and return its id.

        Args:
            problem_id: from :meth:`problem_id`.
            build_id: from :meth:`record_build`.
            result: what the worker measured.
            gpu: the device's state at measurement time (driver, CUDA, clocks are kept).
            trial_number: the optuna trial, when the search produced it.

        Raises:
            ValueError: unknown problem or build, a build whose config does not fit the
                problem (head dim, dtype, causality), or an OK result without a median time.
        """
        if result.status == MeasureStatus.OK and result.median_ms is None:
            raise ValueError("an OK measurement needs median_ms")
        with session_scope(self._engine, write=True) as s:
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

    # ----------------------------------------------------------------- reads

    def measured_pairs(self, problem_id: int) -> set[str]:
        """Config keys already measured (any status) for a problem: what a resume skips."""
        with session_scope(self._engine) as s:
            keys = s.scalars(
                select(Build.config_key)
                .join(Measurement, Measurement.build_id == Build.id)
                .where(Measurement.problem_id == problem_id)
                .distinct()
            )
            return set(keys)

    def outcome(self, problem_id: int, config_key: str) -> StoredOutcome:
        """The stored outcome of one config on one problem: the fastest OK, else the latest.

        A resumed campaign hands this to the sampler instead of measuring again
        (:meth:`measured_pairs` gives the keys only).

        Returns:
            The status and median time; ``("SKIPPED", None)`` when nothing is stored.
        """
        query = (
            select(Measurement.status, Measurement.median_ms)
            .join(Build, Build.id == Measurement.build_id)
            .where(Measurement.problem_id == problem_id, Build.config_key == config_key)
        )
        with session_scope(self._engine) as s:
            ok = s.execute(
                query.where(
                    Measurement.status == MeasureStatus.OK.value,
                    Measurement.median_ms.is_not(None),
                )
                .order_by(Measurement.median_ms)
                .limit(1)
            ).first()
            if ok is not None:
                return StoredOutcome(str(ok[0]), ok[1])
            last = s.execute(query.order_by(Measurement.id.desc()).limit(1)).first()
        if last is None:
            return StoredOutcome(str(MeasureStatus.SKIPPED), None)
        return StoredOutcome(str(last[0]), last[1])

    def spill_bytes(self, config_key: str) -> int:
        """The largest spill (stores or loads, bytes per thread) of a config's stored builds;
        0 when none is stored."""
        query = select(Build.spill_stores, Build.spill_loads).where(Build.config_key == config_key)
        with session_scope(self._engine) as s:
            return max((max(row) for row in s.execute(query)), default=0)

    def _problems_query(
        self,
        gpu: str,
        d: int,
        dtype: str,
        causal: bool,
        nk: int | None,
        batch: int | None,
        heads: int | None,
        kv_heads: int | None,
    ) -> Select[Any]:
        query = (
            select(Problem)
            .join(Gpu, Gpu.id == Problem.gpu_id)
            .options(contains_eager(Problem.gpu))  # the GPU comes with the join, no lazy load
            .where(
                Gpu.name_key == normalize_gpu_name(gpu),
                Problem.d == d,
                Problem.dtype == dtype,
                Problem.causal == causal,
                # No nk asked for means square problems (the campaign's), never Nq != Nk.
                Problem.nk == (nk if nk is not None else Problem.n),
            )
        )
        if batch is not None:
            query = query.where(Problem.batch == batch)
        if heads is not None:
            query = query.where(Problem.heads == heads)
        if kv_heads is not None:
            query = query.where(Problem.kv_heads == kv_heads)
        return query

    @staticmethod
    def _best_of(s: Session, problems: Sequence[Problem], *, exact: bool) -> BestResult | None:
        """Fastest OK measurement per problem (an index lookup each), then the best problem.

        Problems that differ only in batch/heads are compared by throughput, since their
        medians are not comparable; within a problem the fastest median wins.
        """
        best: tuple[float, float, int, BestResult] | None = None
        for problem in problems:
            row = s.execute(
                select(Measurement, Build)
                .join(Build, Build.id == Measurement.build_id)
                .where(
                    Measurement.problem_id == problem.id,
                    Measurement.status == MeasureStatus.OK.value,
                    Measurement.median_ms.is_not(None),
                )
                .order_by(Measurement.median_ms, Measurement.id)
                .limit(1)
            ).first()
            if row is None:
                continue
            m, build = row
            assert m.median_ms is not None
            rank = (-problem_flops(problem) / m.median_ms, m.median_ms, m.id)
            if best is None or rank < best[:3]:
                best = (*rank, _best_result(problem.gpu, problem, build, m, exact=exact))
        return best[3] if best is not None else None

    def best(
        self,
        gpu: str,
        d: int,
        n: int,
        dtype: str = "fp16",
        causal: bool = False,
        *,
        nk: int | None = None,
        batch: int | None = None,
        heads: int | None = None,
        kv_heads: int | None = None,
    ) -> BestResult | None:
        """The fastest correct (status OK) config measured for exactly this problem.

        Args:
            gpu: GPU name as users write it (``"H200"``, ``"NVIDIA H200"``).
            d: head dimension.
            n: query length (and key length unless ``nk`` is given).
            dtype: ``"fp16"`` or ``"bf16"``.
            causal: causal masking.
            nk: key length; None means square problems (``nk == n``).
            batch, heads, kv_heads: restrict to these; None accepts any (ranked by
                throughput across them).

        Returns:
            The winner, or None when no OK measurement exists for the problem.
        """
        with session_scope(self._engine) as s:
            query = self._problems_query(gpu, d, dtype, causal, nk, batch, heads, kv_heads)
            problems = s.scalars(query.where(Problem.n == n).order_by(Problem.id)).all()
            return self._best_of(s, problems, exact=True)

    def best_or_nearest(
        self,
        gpu: str,
        d: int,
        n: int,
        dtype: str = "fp16",
        causal: bool = False,
        *,
        nk: int | None = None,
        batch: int | None = None,
        heads: int | None = None,
        kv_heads: int | None = None,
    ) -> BestResult | None:
        """:meth:`best`, or else the best at the nearest N tuned for this GPU/D/dtype/causal.

        Nearness is by ratio (``|log(N_tuned / n)|``) because tuned lengths are spaced
        geometrically; a tie goes to the larger N. The result then has ``exact=False`` and
        ``from_n`` set to the N it was measured at.

        Returns:
            The exact or nearest result, or None when nothing OK was measured at any N.
        """
        hit = self.best(
            gpu, d, n, dtype, causal, nk=nk, batch=batch, heads=heads, kv_heads=kv_heads
        )
        if hit is not None or n <= 0:
            return hit
        with session_scope(self._engine) as s:
            query = self._problems_query(gpu, d, dtype, causal, nk, batch, heads, kv_heads)
            has_ok = exists().where(
                Measurement.problem_id == Problem.id,
                Measurement.status == MeasureStatus.OK.value,
                Measurement.median_ms.is_not(None),
            )
            tuned = s.scalars(query.where(has_ok).with_only_columns(Problem.n).distinct()).all()
            if not tuned:
                return None
            nearest = min(tuned, key=lambda t: (abs(math.log(t / n)), -t))
            problems = s.scalars(query.where(Problem.n == nearest).order_by(Problem.id)).all()
            return self._best_of(s, problems, exact=False)

    def gpus(self) -> list[GpuSummary]:
        """Every GPU in the database with its measurement counts, by name."""
        ok = func.count(Measurement.id).filter(Measurement.status == MeasureStatus.OK.value)
        query = (
            select(Gpu, func.count(Measurement.id), ok)
            .outerjoin(Problem, Problem.gpu_id == Gpu.id)
            .outerjoin(Measurement, Measurement.problem_id == Problem.id)
            .group_by(Gpu.id)
            .order_by(Gpu.name, Gpu.compute_capability)
        )
        with session_scope(self._engine) as s:
            return [
                GpuSummary(
                    name=g.name,
                    compute_capability=g.compute_capability,
                    sm_count=g.sm_count,
                    driver_version=g.driver_version,
                    cuda_version=g.cuda_version,
                    memory_bytes=g.memory_bytes,
                    smem_optin_bytes=g.smem_optin_bytes,
                    measurements=total,
                    ok_measurements=n_ok,
                )
                for g, total, n_ok in s.execute(query)
            ]

    def results(
        self,
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
        """Measurements matching the filters, a page at a time.

        Rows are ordered by GPU, problem, then fastest first (failures, which have no time,
        last), so pages are stable.

        Args:
            gpu, d, n, dtype, causal, status: filters; None means any.
            offset: rows to skip (>= 0).
            limit: rows per page (1 .. 1000).

        Raises:
            ValueError: offset or limit out of range.
        """
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
        with session_scope(self._engine) as s:
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
                )
                for m, p, g, b in rows
            ]
        return ResultPage(total=total or 0, offset=offset, limit=limit, items=items)
