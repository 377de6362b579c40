"""The store's read side for packed variable-length (varlen) problems.

Holds the queries :class:`db.store.Store` exposes as ``best_varlen``, ``best_varlen_shape``
and ``varlen_winners`` (contracts on the ``Store``). A varlen problem is compared with a
request by :func:`core.shape.varlen_shape` (its count of sequences at their mean length)
under the dense distance; the shared helpers (the fastest verified measurement of a set of
problems, the "has an OK measurement" clause) are :mod:`db.queries`'. Same contract as
:mod:`db.queries`: read-only, one session per query, detached values.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, contains_eager

from core.gpu_name import normalize_gpu_name
from core.problem import parse_seqlens
from core.shape import Shape, nearest_key, shape_distance, varlen_shape
from db.models import Gpu, Problem
from db.queries import best_of, gpu_sm_count, has_ok_measurement
from db.results import BestResult
from db.session import session_scope

__all__ = ["best_varlen", "best_varlen_shape", "varlen_winners"]


def _varlen_problems(s: Session, gpu: str, d: int, dtype: str, causal: bool) -> list[Problem]:
    """The varlen problems of a GPU, D, dtype and mask with a verified, timed measurement,
    in problem-id order."""
    return list(
        s.scalars(
            select(Problem)
            .join(Gpu, Gpu.id == Problem.gpu_id)
            .options(contains_eager(Problem.gpu))
            .where(
                Gpu.name_key == normalize_gpu_name(gpu),
                Problem.d == d,
                Problem.dtype == dtype,
                Problem.causal == causal,
                Problem.seqlens != "",
                has_ok_measurement(),
            )
            .order_by(Problem.id)
        ).all()
    )


def _nearest_varlen(
    s: Session, gpu: str, rows: Sequence[Problem], asked: Shape
) -> tuple[BestResult, tuple[int, ...]] | None:
    """The fastest verified config of the varlen problem among ``rows`` whose
    :func:`varlen_shape` is nearest ``asked`` (ties: the lowest problem id), with its lengths."""
    measured = {p.id: parse_seqlens(p.seqlens) or () for p in rows}
    sm_count = gpu_sm_count(s, normalize_gpu_name(gpu))
    shapes = {p.id: varlen_shape(measured[p.id], p.heads, p.kv_heads) for p in rows}
    nearest = min(rows, key=lambda p: (*nearest_key(asked, shapes[p.id], sm_count), p.id))
    found = best_of(s, [nearest], exact=False,
                     distance=shape_distance(asked, shapes[nearest.id], sm_count))  # fmt: skip
    return (found, measured[nearest.id]) if found is not None else None


def best_varlen(
    engine: Engine,
    gpu: str,
    d: int,
    dtype: str,
    causal: bool,
    seqlens: Sequence[int],
    heads: int,
    kv_heads: int,
) -> tuple[BestResult, tuple[int, ...]] | None:
    """:meth:`db.store.Store.best_varlen`: the fastest verified config of the varlen problem
    with these lengths, else of the nearest tuned varlen problem (same GPU, D, dtype and mask)
    under :func:`core.shape.shape_distance` of their :func:`varlen_shape`\\ s; with the lengths
    it was measured on. None when no varlen problem is tuned there."""
    lens = tuple(int(x) for x in seqlens)
    asked = varlen_shape(lens, heads, kv_heads)
    with session_scope(engine) as s:
        rows = _varlen_problems(s, gpu, d, dtype, causal)
        if not rows:
            return None
        exact = [p for p in rows if parse_seqlens(p.seqlens) == lens and p.heads == heads
                 and p.kv_heads == kv_heads]  # fmt: skip
        if exact:
            found = best_of(s, exact, exact=True)
            return (found, lens) if found is not None else None
        return _nearest_varlen(s, gpu, rows, asked)


def best_varlen_shape(
    engine: Engine,
    gpu: str,
    d: int,
    dtype: str,
    causal: bool,
    count: int,
    mean: int,
    heads: int,
    kv_heads: int,
) -> tuple[BestResult, tuple[int, ...]] | None:
    """:meth:`db.store.Store.best_varlen_shape`: :func:`best_varlen`'s nearest rule for a
    packed batch known only as ``count`` sequences of ``mean`` rows on average (what a caller
    knows without reading its offsets): the fastest verified config of the tuned varlen
    problem whose :func:`varlen_shape` is nearest ``count`` x ``mean``. The result is never
    ``exact`` (the lengths themselves were not given); ``distance`` says how far it is. None
    when no varlen problem of this GPU, D, dtype and mask is tuned.

    Raises:
        ValueError: ``count`` or ``mean`` below 1.
    """
    if count < 1 or mean < 1:
        raise ValueError(f"a packed batch of {count} sequences of mean length {mean}")
    asked = Shape(mean, mean, count, heads, kv_heads)
    with session_scope(engine) as s:
        rows = _varlen_problems(s, gpu, d, dtype, causal)
        return _nearest_varlen(s, gpu, rows, asked) if rows else None


def _fastest(found: Iterable[BestResult | None]) -> BestResult | None:
    """The fastest of some answers (None when there is none)."""
    hits = [b for b in found if b is not None]
    return min(hits, key=lambda b: b.median_ms) if hits else None


def varlen_winners(
    engine: Engine, gpu: str, families: Sequence[str] | None = None
) -> list[tuple[BestResult, tuple[int, ...]]]:
    """:meth:`db.store.Store.varlen_winners`: the fastest verified config of every varlen
    problem of one GPU (matched by its name key), among ``families`` when given, with the
    lengths it was measured on, in problem-id order (the order :func:`best_varlen` breaks
    ties between equal shapes in)."""
    with session_scope(engine) as s:
        rows = s.scalars(
            select(Problem)
            .join(Gpu, Gpu.id == Problem.gpu_id)
            .options(contains_eager(Problem.gpu))
            .where(
                Gpu.name_key == normalize_gpu_name(gpu),
                Problem.seqlens != "",
                has_ok_measurement(),
            )
            .order_by(Problem.id)
        ).all()
        out: list[tuple[BestResult, tuple[int, ...]]] = []
        wanted: Sequence[str | None] = list(families) if families else [None]
        for p in rows:
            found = _fastest(best_of(s, [p], exact=True, family=f) for f in wanted)
            lens = parse_seqlens(p.seqlens)
            if found is not None and lens:
                out.append((found, lens))
        return out
