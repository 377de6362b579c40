"""The store's one lookup, as a rule on plain values: the packed-batch descriptor and the pick.

:class:`Packed` is the sequence descriptor every stage carries for a packed variable-length
batch (``cu_seqlens``): a request (:mod:`core.shape_request`), the choice of
``fa2tune.torch``, the store's lookup (:func:`db.queries.best_match`) and the exported header
take it where a dense call has none (``packed=None``), so a packed batch is a mode of the one
path, not a path of its own.

:func:`pick` is the lookup's rule for both modes, applied to the store's candidates
(:class:`Candidate`, plain values of its rows): the GPU by name key, the mask, the exact shape
(a packed batch: its very lengths) else the nearest by :func:`core.shape.nearest_key`, then
the fastest. The store reads, this module decides; it imports only the floor below it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from core.gpu_name import normalize_gpu_name
from core.problem import parse_seqlens
from core.shape import (
    Shape,
    ShapeError,
    effective_causal,
    nearest_key,
    shape_distance,
    varlen_shape,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Packed:
    """A packed variable-length batch as the choice, the store and the header see it.

    Attributes:
        count: number of sequences (``len(cu_seqlens) - 1``).
        mean: their mean query length (at least 1).
        seqlens: each sequence's length when known (a request, a tuned problem); None where
            only count and mean are (``fa2tune.torch`` never reads the offsets on the host),
            and such a batch is never an exact match of a tuned one.
    """

    count: int
    mean: int
    seqlens: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.count < 1 or self.mean < 1:
            raise ValueError(f"a packed batch of {self.count} sequences of mean length {self.mean}")

    @classmethod
    def of(cls, seqlens: Sequence[int]) -> Packed:
        """The batch of these lengths (mean rounded, as :func:`core.shape.varlen_shape`)."""
        lens = tuple(int(n) for n in seqlens)
        if not lens:
            raise ValueError("a packed batch needs at least one sequence")
        return cls(len(lens), max(1, round(sum(lens) / len(lens))), lens)

    def shape(self, heads: int, kv_heads: int) -> Shape:
        """The dense shape a packed batch is compared by: ``count`` sequences of ``mean`` rows
        (:func:`core.shape.varlen_shape`'s rule)."""
        return Shape(self.mean, self.mean, self.count, heads, kv_heads)


@dataclass(frozen=True)
class Candidate:
    """A tuned problem as the store's one lookup compares it: plain values of its row and the
    rank of its fastest verified measurement.

    Attributes:
        problem_id: the row's id (ties between packed problems go to the first tuned).
        name_key: its GPU's :func:`~core.gpu_name.normalize_gpu_name` key.
        causal, n, nk, batch, heads, kv_heads: the problem's.
        seqlens: the row's comma list of lengths, ``""`` for a dense problem.
        rank: ``(-throughput, median, measurement id)`` of its fastest verified measurement
            (the lowest wins among problems of one shape).
    """

    problem_id: int
    name_key: str
    causal: bool
    n: int
    nk: int
    batch: int
    heads: int
    kv_heads: int
    seqlens: str
    rank: tuple[float, float, int]


@dataclass(frozen=True)
class Pick:
    """The lookup's answer among its candidates: which one, and how it relates to the ask."""

    index: int
    exact: bool
    distance: float
    measured: Shape
    seqlens: tuple[int, ...] | None


def served_mask(causal: bool, shape: Shape, packed: Packed | None = None) -> bool:
    """The mask a lookup serves: a dense call's effective one
    (:func:`core.shape.effective_causal`: one query row is served unmasked), a packed
    batch's as given."""
    return causal if packed is not None else effective_causal(causal, shape.nq)


def pick(
    candidates: Sequence[Candidate],
    gpu: str,
    causal: bool,
    shape: Shape,
    sm_counts: Mapping[str, int],
    *,
    packed: Packed | None = None,
    exact: bool = False,
) -> Pick | None:
    """The rule of the store's one lookup, for a dense shape or a packed batch.

    Among the candidates of this GPU (by name key), the mask (a dense call's effective one,
    :func:`core.shape.effective_causal`; a packed batch's as given) and the mode: a problem
    measured at the asked shape (a packed batch: on its very lengths and heads) wins, else,
    unless ``exact``, the nearest under :func:`core.shape.nearest_key` with the GPU's SM
    count from ``sm_counts`` (ties: the lower shape for dense problems, as the header's sorted
    tables break them; the first tuned problem for packed ones). Among the dense problems of
    the chosen shape the best ``rank`` wins. A packed problem is compared as its count of
    sequences at their mean length (:func:`core.shape.varlen_shape`). None when nothing
    qualifies.
    """
    key = normalize_gpu_name(gpu)
    mask = served_mask(causal, shape, packed)
    lens = packed.seqlens if packed is not None else None
    compared: list[tuple[int, Shape, tuple[int, ...] | None]] = []
    for i, c in enumerate(candidates):
        if c.name_key != key or c.causal != mask or bool(c.seqlens) != (packed is not None):
            continue
        measured = parse_seqlens(c.seqlens)
        try:
            sh = (Shape(c.n, c.nk, c.batch, c.heads, c.kv_heads) if measured is None
                  else varlen_shape(measured, c.heads, c.kv_heads))  # fmt: skip
        except ShapeError as exc:  # a store is not trusted to hold only runnable problems
            log.warning("problem %d skipped for shape lookups: %s", c.problem_id, exc)
            continue
        compared.append((i, sh, measured))
    hits = [t for t in compared if t[1] == shape and t[2] == lens]
    if hits and (packed is None or lens is not None):
        best = min(hits, key=lambda t: candidates[t[0]].rank)
        return Pick(best[0], True, 0.0, shape, lens)
    if exact or not compared:
        return None
    sm_count = sm_counts[key]
    first = min(
        compared,
        key=lambda t: (*nearest_key(shape, t[1], sm_count),
                       candidates[t[0]].problem_id if packed is not None else t[1]),
    )  # fmt: skip
    chosen = [first] if packed is not None else [t for t in compared if t[1] == first[1]]
    best = min(chosen, key=lambda t: candidates[t[0]].rank)
    return Pick(best[0], False, shape_distance(shape, first[1], sm_count), first[1], best[2])
