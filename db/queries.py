"""The store's read side: the SQL behind every question asked of the results database.

Holds the module-level queries :class:`db.store.Store` exposes as methods (``best``,
``best_or_nearest``, ``best_for_shape``, ``best_varlen``, ``best_varlen_shape``,
``shape_winners``, ``varlen_winners``, ``variant_winners``, ``measured_pairs``, ``outcome``,
``spill_bytes``;
their contracts are documented on the ``Store``), the helpers they share, and the row
helpers other readers use:
:func:`build_config` (a build row's config, also used by :mod:`db.transfer`),
:func:`problem_flops`, :func:`problem_shape` and :func:`effective_sm_count`. The listings
(``gpus``, ``results``) are :mod:`db.listing`'s.

A dense shape and a packed variable-length batch (a :class:`core.lookup.Packed`) are
two modes of one lookup, :func:`best_match`: a packed problem is compared as its count of
sequences at their mean length (:func:`core.shape.varlen_shape`) under the dense distance.
The attention variant is part of what :func:`best_match` is asked (plain by default); every
other query answers for plain problems only (the per-N lookups, the header's plain winners)
but :func:`variant_winners` (the header's variant tables), and every problem row read back
keeps its variant (:func:`db.models.row_variant`). So is the KV-cache layout
(``kv_page``: :attr:`core.problem.Problem.kv_page`): :func:`best_match` answers a cache
lookup from cache problems of its very layout only and a dense lookup from dense problems
only; every other query reads dense problems only but :func:`cache_winners`. A cache lookup
also names the length pattern its problems were timed on (``kv_lengths``:
:attr:`core.problem.Problem.kv_lengths`, ``full`` by default) and is answered by problems of
that pattern only; every result carries its problem's pattern.

Contract: every query takes the engine of a database whose schema is at head, runs in one
read-only :func:`db.session.session_scope`, writes nothing, and returns values from
:mod:`db.results` (detached from the session) or plain Python values. GPU names are matched
through :func:`core.gpu_name.normalize_gpu_name`, as :mod:`db.writes` stores them.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, Engine, Select, and_, bindparam, exists, func, or_, select
from sqlalchemy.orm import Session, contains_eager

from core.family import AnyConfig, config_from_params
from core.gpu_name import normalize_gpu_name
from core.kv_lengths import check_kv_lengths
from core.lookup import Candidate, Packed, pick, served_mask
from core.problem import Problem as ProblemSpec
from core.problem import parse_seqlens
from core.records import MeasureStatus
from core.shape import (
    MAX_DIM,
    Shape,
    ShapeError,
    shape_distance,
)
from core.variant import PLAIN, SWITCHES, Variant
from db.models import (
    FULL_KV_LENGTHS,
    NO_KV_PAGE,
    Build,
    Gpu,
    Measurement,
    Problem,
    build_kv_page,
    kv_page_value,
    row_kv_page,
    row_variant,
)
from db.results import BestResult, StoredOutcome
from db.session import session_scope

__all__ = [
    "DEFAULT_SM_COUNT",
    "Match",
    "best",
    "best_for_shape",
    "best_match",
    "best_or_nearest",
    "best_packed",
    "build_config",
    "effective_sm_count",
    "measured_pairs",
    "outcome",
    "problem_flops",
    "problem_shape",
    "shape_winners",
    "spill_bytes",
    "variant_winners",
    "varlen_winners",
]

logger = logging.getLogger(__name__)

#: SMs assumed when a GPU's recorded ``sm_count`` is not positive (an old or hand-written
#: dump): the H200's and H100 SXM's 132, the GPUs fa2tune ships results for.
DEFAULT_SM_COUNT = 132


def build_config(build: Build) -> AnyConfig:
    """The config (of the build's family) a build row was compiled from."""
    return config_from_params(build.family, build.d, build.dtype, build.causal, build.params)


def problem_flops(problem: Problem) -> float:
    """Forward FLOPs of a problem row, counted as :attr:`core.problem.Problem.flops`."""
    return problem_spec(problem).flops


def plain_problem() -> ColumnElement[bool]:
    """The clause "this problem row is of plain attention" (no window, chunk, cap or sinks)."""
    return and_(~local_problem(), ~Problem.softcap_on, ~Problem.sinks)


def dense_problem() -> ColumnElement[bool]:
    """The clause "this problem row is not a KV-cache problem" (every row before 0006)."""
    return Problem.kv_page == NO_KV_PAGE


def local_problem() -> ColumnElement[bool]:
    """The clause "this problem row's keys are masked by a window or a chunk"."""
    return or_(Problem.window_left >= 0, Problem.window_right >= 0, Problem.chunk > 0)


def build_switches(params: dict[str, Any]) -> dict[str, bool]:
    """A build's variant switches (:data:`core.variant.SWITCHES`) from its stored
    parameters, where a switch that is off is left out (``config.params()``)."""
    return {name: bool(params.get(name, False)) for name in SWITCHES}


def problem_spec(problem: Problem, gpu: str = "") -> ProblemSpec:
    """The problem a row stores, as the campaign's :class:`core.problem.Problem` (with the
    variant, KV-cache layout and length pattern it was tuned for)."""
    lens = parse_seqlens(problem.seqlens)
    variant = row_variant(problem)
    if lens is not None:
        return ProblemSpec.varlen(
            gpu, problem.d, lens, heads=problem.heads, kv_heads=problem.kv_heads,
            dtype=problem.dtype, causal=problem.causal, variant=variant,
        )  # fmt: skip
    return ProblemSpec(
        gpu=gpu,
        d=problem.d,
        n=problem.n,
        batch=problem.batch,
        heads=problem.heads,
        dtype=problem.dtype,  # type: ignore[arg-type]
        causal=problem.causal,
        kv_heads=problem.kv_heads,
        nk=problem.nk,
        variant=variant,
        kv_page=row_kv_page(problem),
        kv_lengths=problem.kv_lengths,
    )


def _tflops(problem: Problem, m: Measurement) -> float:
    """The throughput a ranking uses: this problem's FLOPs over this measurement's median."""
    assert m.median_ms is not None  # only OK rows with a median are ranked
    return problem_flops(problem) / (m.median_ms * 1e-3) / 1e12


def _best_result(
    gpu: Gpu, problem: Problem, build: Build, m: Measurement, *, exact: bool, distance: float = 0.0
) -> BestResult:
    assert m.median_ms is not None  # only OK rows with a median are ranked
    # The throughput is the one the ranking used (this problem's FLOPs over this median), not
    # the row's recorded figure: whatever a store holds, one answer's figures agree.
    tflops = _tflops(problem, m)
    return BestResult(
        config=config_from_params(build.family, build.d, build.dtype, build.causal, build.params),
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
        tflops=tflops,
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
        distance=distance,
        variant=row_variant(problem),
        kv_page=row_kv_page(problem),
        kv_lengths=problem.kv_lengths,
    )


def effective_sm_count(counts: Iterable[int]) -> int:
    """The SM count the shape distance uses for a GPU recorded as ``counts`` (one per GPU row
    of the name: a name may be stored under several compute capabilities): the largest
    positive one, else :data:`DEFAULT_SM_COUNT`."""
    return max((c for c in counts if c > 0), default=DEFAULT_SM_COUNT)


def problem_shape(problem: Problem) -> Shape | None:
    """A problem row's shape; None for a row no kernel could run (never written by fa2tune's
    own writers, which validate, but a store is not trusted to hold only those)."""
    try:
        return Shape(problem.n, problem.nk, problem.batch, problem.heads, problem.kv_heads)
    except ShapeError as exc:
        logger.warning("problem %d skipped for shape lookups: %s", problem.id, exc)
        return None


def measured_pairs(engine: Engine, problem_id: int) -> set[str]:
    """:meth:`db.store.Store.measured_pairs`."""
    with session_scope(engine) as s:
        keys = s.scalars(
            select(Build.config_key)
            .join(Measurement, Measurement.build_id == Build.id)
            .where(Measurement.problem_id == problem_id)
            .distinct()
        )
        return set(keys)


def outcome(engine: Engine, problem_id: int, config_key: str) -> StoredOutcome:
    """:meth:`db.store.Store.outcome`: the fastest OK, else the latest, else SKIPPED."""
    query = (
        select(Measurement.status, Measurement.median_ms)
        .join(Build, Build.id == Measurement.build_id)
        .where(Measurement.problem_id == problem_id, Build.config_key == config_key)
    )
    with session_scope(engine) as s:
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


def spill_bytes(engine: Engine, config_key: str) -> int:
    """:meth:`db.store.Store.spill_bytes`."""
    query = select(Build.spill_stores, Build.spill_loads).where(Build.config_key == config_key)
    with session_scope(engine) as s:
        return max((max(row) for row in s.execute(query)), default=0)


def _problems_query(
    gpu: str,
    d: int,
    dtype: str,
    causal: bool,
    nk: int | None,
    batch: int | None,
    heads: int | None,
    kv_heads: int | None,
) -> Select[Any]:
    """The problems of one GPU/D/dtype/causal (square unless ``nk``), narrowed to the
    batch/heads/kv_heads given; each comes with its GPU loaded."""
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
            Problem.seqlens == "",  # dense problems only (packed: best_match)
            plain_problem(),  # plain attention only (variants: best_match)
            dense_problem(),  # no KV-cache problem (cache layouts: best_match)
        )
    )
    if batch is not None:
        query = query.where(Problem.batch == batch)
    if heads is not None:
        query = query.where(Problem.heads == heads)
    if kv_heads is not None:
        query = query.where(Problem.kv_heads == kv_heads)
    return query


def _verified_by_speed(problem_id: int, *where: ColumnElement[bool]) -> Any:
    """A problem's verified measurements (OK, with a median) with their builds, fastest first
    (ties: the earlier measurement), narrowed by ``where``: a select of (Measurement, Build)
    rows (typed Any, as :func:`_fastest`: its generic form differs between SQLAlchemy
    releases)."""
    return (
        select(Measurement, Build)
        .join(Build, Build.id == Measurement.build_id)
        .where(
            Measurement.problem_id == problem_id,
            Measurement.status == MeasureStatus.OK.value,
            Measurement.median_ms.is_not(None),
            *where,
        )
        .order_by(Measurement.median_ms, Measurement.id)
    )


def best_of(
    s: Session,
    problems: Sequence[Problem],
    *,
    exact: bool,
    family: str | None = None,
    distance: float = 0.0,
) -> BestResult | None:
    """Fastest OK measurement per problem (an index lookup each), then the best problem.

    Problems that differ only in batch/heads are compared by throughput, since their
    medians are not comparable; within a problem the fastest median wins. ``family``
    restricts the candidates to one kernel family's builds.
    """
    only = [Build.family == family] if family is not None else []
    winner: tuple[float, float, int, BestResult] | None = None
    for problem in problems:
        row = s.execute(_verified_by_speed(problem.id, *only).limit(1)).first()
        if row is None:
            continue
        m, build = row
        assert m.median_ms is not None
        rank = (-problem_flops(problem) / m.median_ms, m.median_ms, m.id)
        if winner is None or rank < winner[:3]:
            result = _best_result(problem.gpu, problem, build, m, exact=exact, distance=distance)
            winner = (*rank, result)
    return winner[3] if winner is not None else None


def best(
    engine: Engine,
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
    family: str | None = None,
) -> BestResult | None:
    """:meth:`db.store.Store.best`: the problems asked for, then :func:`best_of`."""
    with session_scope(engine) as s:
        query = _problems_query(gpu, d, dtype, causal, nk, batch, heads, kv_heads)
        problems = s.scalars(query.where(Problem.n == n).order_by(Problem.id)).all()
        return best_of(s, problems, exact=True, family=family)


def best_or_nearest(
    engine: Engine,
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
    """:meth:`db.store.Store.best_or_nearest`: :func:`best`, else the nearest tuned N."""
    hit = best(engine, gpu, d, n, dtype, causal, nk=nk, batch=batch, heads=heads, kv_heads=kv_heads)
    if hit is not None or n <= 0:
        return hit
    with session_scope(engine) as s:
        query = _problems_query(gpu, d, dtype, causal, nk, batch, heads, kv_heads)
        has_ok = has_ok_measurement()
        tuned = s.scalars(query.where(has_ok).with_only_columns(Problem.n).distinct()).all()
        if not tuned:
            return None
        nearest = min(tuned, key=lambda t: (abs(math.log(t / n)), -t))
        problems = s.scalars(query.where(Problem.n == nearest).order_by(Problem.id)).all()
        found = best_of(s, problems, exact=False)
        if found is None:
            return None
        # The distance of the asked N x N at the winner's batch and heads, so that it reads
        # the same as best_for_shape's.
        winner = next(p for p in problems if p.id == found.problem_id)
        measured = problem_shape(winner)
        asked_nk = nk if nk is not None else n
        if measured is None or not 1 <= asked_nk <= MAX_DIM or n > MAX_DIM:
            return found
        asked = Shape(n, asked_nk, found.batch, found.heads, found.kv_heads)
        sm_count = gpu_sm_count(s, winner.gpu.name_key)
        return dataclasses.replace(found, distance=shape_distance(asked, measured, sm_count))


def gpu_sm_count(s: Session, name_key: str) -> int:
    """:func:`effective_sm_count` of every GPU row stored under ``name_key``."""
    return effective_sm_count(s.scalars(select(Gpu.sm_count).where(Gpu.name_key == name_key)))


@cache
def _fastest(packed: bool, family: str | None, local: bool) -> Any:
    """Every dense (or packed) problem of one GPU, D, dtype and mask (the ``gpu_key``, ``d``,
    ``dtype`` and ``causal`` bind parameters) with its fastest verified measurement (of ``family``'s
    builds when given) and that build, in problem-id order, each with its GPU loaded. Only
    problems of one set of variant switches: masked by a window or chunk when ``local``, with
    the ``softcap_on`` and ``sinks`` bind parameters; and of one KV-cache layout and length
    pattern (the ``kv_page`` bind parameter, :data:`db.models.NO_KV_PAGE` for dense problems,
    and ``kv_lengths``, :data:`db.models.FULL_KV_LENGTHS` for them).

    A select of (Problem, Measurement, Build) rows, built once per mode and family (typed
    Any: its generic form differs between the SQLAlchemy releases the project allows)."""
    ranked = (
        select(
            Measurement.id.label("mid"),
            func.row_number()
            .over(partition_by=Measurement.problem_id, order_by=(Measurement.median_ms,
                                                                  Measurement.id))
            .label("place"),
        )
        .join(Build, Build.id == Measurement.build_id)
        .join(Problem, Problem.id == Measurement.problem_id)
        .join(Gpu, Gpu.id == Problem.gpu_id)
        .where(
            # The GPU and mask pick applies, also in SQL: the window ranks only these rows.
            Gpu.name_key == bindparam("gpu_key"),
            Problem.causal == bindparam("causal"),
            Problem.d == bindparam("d"),
            Problem.dtype == bindparam("dtype"),
            Problem.seqlens != "" if packed else Problem.seqlens == "",
            local_problem() if local else ~local_problem(),
            Problem.softcap_on == bindparam("softcap_on"),
            Problem.sinks == bindparam("sinks"),
            Problem.kv_page == bindparam("kv_page"),
            Problem.kv_lengths == bindparam("kv_lengths"),
            Measurement.status == MeasureStatus.OK.value,
            Measurement.median_ms.is_not(None),
            *([Build.family == family] if family is not None else []),
        )
        .subquery()
    )  # fmt: skip
    return (
        select(Problem, Measurement, Build)
        .join(Gpu, Gpu.id == Problem.gpu_id)
        .join(Measurement, Measurement.problem_id == Problem.id)
        .join(ranked, ranked.c.mid == Measurement.id)
        .join(Build, Build.id == Measurement.build_id)
        .options(contains_eager(Problem.gpu))
        .where(ranked.c.place == 1)
        .order_by(Problem.id)
    )


class Match(NamedTuple):
    """A lookup's answer: the result, the shape it was measured at (a packed problem's count
    of sequences at their mean length) and, for a packed batch, its lengths."""

    result: BestResult
    measured: Shape
    seqlens: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class CandidateSet:
    """One group's candidates for :func:`core.lookup.pick`, read in one query: every problem
    of one GPU (name key), D, dtype, served mask, mode, set of variant switches, KV-cache
    layout and length pattern (``kv_lengths``: the group's, :func:`candidate_set`'s) with its
    fastest verified measurement (the rows, loaded: a winner becomes its
    :class:`~db.results.BestResult` when first matched, once). Matching a shape against it
    needs no database: the torch op reads a group once and answers every later shape of it
    from memory (a decode loop over growing lengths asks no store)."""

    candidates: tuple[Candidate, ...]
    rows: tuple[Any, ...]  # (Problem, Measurement, Build), detached and fully loaded
    sm_counts: dict[str, int]
    kv_lengths: str = FULL_KV_LENGTHS  # the pattern it was read for (a dense group's: full)
    _results: dict[int, BestResult] = dataclasses.field(default_factory=dict, compare=False)

    def match(
        self,
        gpu: str,
        causal: bool,
        shape: Shape,
        *,
        packed: Packed | None = None,
        exact: bool = False,
        variant: Variant = PLAIN,
        kv_page: int | None = None,
        kv_lengths: str | None = None,
    ) -> Match | None:
        """:func:`best_match`'s answer for this shape (the set must be the call's group:
        :func:`candidate_set` with the call's GPU, served mask, mode, switches, KV-cache
        layout and length pattern; ``kv_lengths`` None: the set's own pattern)."""
        lengths = self.kv_lengths if kv_lengths is None else kv_lengths
        found = pick(self.candidates, gpu, causal, shape, self.sm_counts, packed=packed,
                     exact=exact, variant=variant, kv_page=kv_page,
                     kv_lengths=lengths)  # fmt: skip
        if found is None:
            return None
        result = self._results.get(found.index)
        if result is None:  # racing threads may both build it: the same value either way
            p, m, b = self.rows[found.index]
            result = self._results[found.index] = _best_result(p.gpu, p, b, m, exact=True)
        result = dataclasses.replace(result, exact=found.exact, distance=found.distance)
        return Match(result, found.measured, found.seqlens)


def candidate_set(
    engine: Engine,
    gpu: str,
    d: int,
    dtype: str,
    served_causal: bool,
    *,
    packed: bool = False,
    family: str | None = None,
    needs: dict[str, bool] | None = None,
    kv_page: int | None = None,
    kv_lengths: str = FULL_KV_LENGTHS,
) -> CandidateSet:
    """The :class:`CandidateSet` of one group (``served_causal``: the mask as
    :func:`core.lookup.served_mask` serves the call; ``needs``: the variant's switches,
    :attr:`core.variant.Variant.needs`, none by default; ``kv_page``: the KV-cache layout,
    None for dense problems; ``kv_lengths``: the length pattern a cache group's problems were
    timed on, :mod:`core.kv_lengths`). A candidate whose build's switches or cache layout are
    not the group's (a store written by hand) is left out: a plain call never gets a variant
    config, nor a variant call a plain one, nor a dense call a cache kernel or back.

    Raises:
        ValueError: ``kv_lengths`` is not a pattern, or ``mixed`` with a dense group
            (``kv_page`` None: only a cache problem has a length pattern).
    """
    check_kv_lengths(kv_lengths, kv_page)
    needs = needs if needs is not None else PLAIN.needs
    with session_scope(engine) as s:
        query = _fastest(packed, family, needs["local"])
        bound = {
            "gpu_key": normalize_gpu_name(gpu),
            "causal": served_causal,
            "d": d,
            "dtype": dtype,
            "softcap_on": needs["softcap"],
            "sinks": needs["sinks"],
            "kv_page": kv_page_value(kv_page),
            "kv_lengths": kv_lengths,
        }
        rows = [
            r for r in s.execute(query, bound).all()
            if build_switches(r[2].params) == needs and build_kv_page(r[2].params) == kv_page
        ]  # fmt: skip
        counts: dict[str, list[int]] = {}
        for name_key, count in s.execute(select(Gpu.name_key, Gpu.sm_count)):
            counts.setdefault(name_key, []).append(count)
        sm_counts = {k: effective_sm_count(v) for k, v in counts.items()}
        # The throughput rank of best_of: a result's TFLOP/s is its problem's FLOPs over its
        # median.
        candidates = tuple(
            Candidate(p.id, p.gpu.name_key, p.causal, p.n, p.nk, p.batch, p.heads, p.kv_heads,
                      p.seqlens, (-_tflops(p, m), m.median_ms, m.id), row_variant(p),
                      row_kv_page(p), p.kv_lengths)
            for p, m, _ in rows
        )  # fmt: skip
    return CandidateSet(candidates, tuple(rows), sm_counts, kv_lengths=kv_lengths)


def best_match(
    engine: Engine,
    gpu: str,
    d: int,
    dtype: str,
    causal: bool,
    shape: Shape,
    *,
    packed: Packed | None = None,
    exact: bool = False,
    family: str | None = None,
    variant: Variant = PLAIN,
    kv_page: int | None = None,
    kv_lengths: str = FULL_KV_LENGTHS,
) -> Match | None:
    """The one lookup of both modes (:meth:`db.store.Store.best_match`): the candidates of
    this D, dtype, mode, variant switches, KV-cache layout and length pattern with their
    fastest verified measurements, read in one query (:func:`candidate_set`), and
    :func:`core.lookup.pick`'s rule among them (GPU, mask, the variant's window and chunk
    exact or nearest, exact shape or nearest). None when nothing qualifies.

    Raises:
        ValueError: a packed batch with ``kv_page`` (a cache call is a dense batch); a
            ``kv_lengths`` :func:`core.kv_lengths.check_kv_lengths` refuses.
    """
    if packed is not None and kv_page is not None:
        raise ValueError("a KV-cache lookup (kv_page) is of a dense batch, not a packed one")
    mask = served_mask(causal, shape, packed)
    group = candidate_set(engine, gpu, d, dtype, mask, packed=packed is not None, family=family,
                          needs=variant.needs, kv_page=kv_page,
                          kv_lengths=kv_lengths)  # fmt: skip
    return group.match(gpu, causal, shape, packed=packed, exact=exact, variant=variant,
                       kv_page=kv_page)  # fmt: skip


def best_for_shape(
    engine: Engine,
    gpu: str,
    d: int,
    dtype: str,
    causal: bool,
    shape: Shape,
    *,
    exact: bool = False,
    family: str | None = None,
    variant: Variant = PLAIN,
    kv_page: int | None = None,
    kv_lengths: str = FULL_KV_LENGTHS,
) -> BestResult | None:
    """:meth:`db.store.Store.best_for_shape`: :func:`best_match` of a dense shape."""
    found = best_match(engine, gpu, d, dtype, causal, shape, exact=exact, family=family,
                       variant=variant, kv_page=kv_page, kv_lengths=kv_lengths)  # fmt: skip
    return found.result if found is not None else None


def best_packed(
    engine: Engine,
    gpu: str,
    d: int,
    dtype: str,
    causal: bool,
    packed: Packed,
    heads: int,
    kv_heads: int,
    *,
    variant: Variant = PLAIN,
) -> tuple[BestResult, tuple[int, ...]] | None:
    """:meth:`db.store.Store.best_varlen` and ``best_varlen_shape``: :func:`best_match` of a
    packed batch, with the lengths the answer was measured on."""
    found = best_match(engine, gpu, d, dtype, causal, packed.shape(heads, kv_heads),
                       packed=packed, variant=variant)  # fmt: skip
    if found is None or found.seqlens is None:
        return None
    return found.result, found.seqlens


def shape_winners(engine: Engine) -> list[tuple[BestResult, int]]:
    """:meth:`db.store.Store.shape_winners`: one winner per tuned shape, with its SM count."""
    with session_scope(engine) as s:
        has_ok = has_ok_measurement()
        problems = s.scalars(
            select(Problem)
            .join(Gpu, Gpu.id == Problem.gpu_id)
            .options(contains_eager(Problem.gpu))
            # The header dispatches dense shapes of plain attention (no KV-cache problems).
            .where(has_ok, Problem.seqlens == "", plain_problem(), dense_problem())
            .order_by(Problem.id)
        ).all()
        sm_counts: dict[str, list[int]] = {}
        for name_key, count in s.execute(select(Gpu.name_key, Gpu.sm_count)):
            sm_counts.setdefault(name_key, []).append(count)
        groups: dict[tuple[str, int, str, bool, Shape], list[Problem]] = {}
        for p in problems:
            sh = problem_shape(p)
            if sh is not None:
                groups.setdefault((p.gpu.name_key, p.d, p.dtype, p.causal, sh), []).append(p)
        out: list[tuple[BestResult, int]] = []
        for key, group in groups.items():
            found = best_of(s, group, exact=True)
            if found is not None:
                out.append((found, effective_sm_count(sm_counts[key[0]])))
        return out


def varlen_winners(
    engine: Engine, gpu: str, families: Sequence[str] | None = None
) -> list[tuple[BestResult, tuple[int, ...]]]:
    """:meth:`db.store.Store.varlen_winners`: the fastest verified config of every varlen
    problem of one GPU (matched by its name key), among ``families`` when given, with the
    lengths it was measured on, in problem-id order (the order :func:`best_match` breaks
    ties between equal packed shapes in)."""
    with session_scope(engine) as s:
        rows = _tuned_problems(s, gpu, Problem.seqlens != "", plain_problem(), dense_problem())
        out: list[tuple[BestResult, tuple[int, ...]]] = []
        wanted: Sequence[str | None] = list(families) if families else [None]
        for p in rows:
            hits = [b for f in wanted if (b := best_of(s, [p], exact=True, family=f))]
            lens = parse_seqlens(p.seqlens)
            if hits and lens:
                out.append((min(hits, key=lambda b: b.median_ms), lens))
        return out


def variant_winners(
    engine: Engine,
    gpu: str,
    families: Sequence[str] | None = None,
    packed_families: Sequence[str] | None = None,
) -> list[tuple[BestResult, tuple[int, ...] | None]]:
    """:meth:`db.store.Store.variant_winners`: the fastest verified config of every problem
    of one GPU tuned with an attention variant (dense and packed), among the builds whose
    switches are the problem's (:func:`best_match`'s rule: a build of other switches, which
    only a store written by hand holds, is left out), with the lengths a packed problem was
    measured on (None for a dense one), in problem-id order. ``families`` /
    ``packed_families``: only these families' builds for dense / packed problems (None:
    any)."""
    with session_scope(engine) as s:
        # The header's variant tables: no KV-cache problems.
        problems = _tuned_problems(s, gpu, ~plain_problem(), dense_problem())
        out: list[tuple[BestResult, tuple[int, ...] | None]] = []
        for p in problems:
            lens = parse_seqlens(p.seqlens)
            needs = row_variant(p).needs
            wanted = packed_families if lens is not None else families
            found = _fastest_fitting(s, p, wanted, needs, kv_page=None)
            if found is not None:
                out.append((found, lens))
        return out


def _tuned_problems(s: Session, gpu: str, *where: ColumnElement[bool]) -> list[Problem]:
    """The problems of one GPU (by its name key) with a verified, timed measurement that
    ``where`` keeps, their GPU loaded, in problem-id order."""
    return list(
        s.scalars(
            select(Problem)
            .join(Gpu, Gpu.id == Problem.gpu_id)
            .options(contains_eager(Problem.gpu))
            .where(Gpu.name_key == normalize_gpu_name(gpu), *where, has_ok_measurement())
            .order_by(Problem.id)
        ).all()
    )


def _fastest_fitting(
    s: Session,
    p: Problem,
    families: Sequence[str] | None,
    needs: dict[str, bool],
    *,
    kv_page: int | None,
) -> BestResult | None:
    """Problem ``p``'s fastest verified measurement by a build of ``families`` (None: any)
    with the variant switches ``needs`` and the cache layout ``kv_page`` (None: not a cache
    kernel), as an exact answer; None when none has."""
    only = [Build.family.in_(list(families))] if families is not None else []
    rows = s.execute(_verified_by_speed(p.id, *only)).all()
    fit = next(
        (
            (m, b)
            for m, b in rows
            if build_switches(b.params) == needs and build_kv_page(b.params) == kv_page
        ),
        None,
    )
    return None if fit is None else _best_result(p.gpu, p, fit[1], fit[0], exact=True)


def cache_winners(
    engine: Engine, gpu: str, families: Sequence[str] | None = None
) -> list[BestResult]:
    """:meth:`db.store.Store.cache_winners`: the fastest verified config of every KV-cache
    problem (``kv_page`` set, either length pattern) of plain attention and one GPU, among the
    builds of the problem's cache layout and no variant switch (:func:`candidate_set`'s rule)
    of ``families`` when given, in problem-id order; each result carries its problem's
    ``kv_page`` and ``kv_lengths``."""
    with session_scope(engine) as s:
        problems = _tuned_problems(s, gpu, Problem.seqlens == "", plain_problem(),
                                   ~dense_problem())  # fmt: skip
        out: list[BestResult] = []
        for p in problems:
            page = row_kv_page(p)
            found = _fastest_fitting(s, p, families, PLAIN.needs, kv_page=page)
            if found is not None:
                out.append(found)
        return out


def has_ok_measurement() -> Any:
    """The clause "this problem has a verified, timed measurement" (correlated to Problem)."""
    return exists().where(
        Measurement.problem_id == Problem.id,
        Measurement.status == MeasureStatus.OK.value,
        Measurement.median_ms.is_not(None),
    )
