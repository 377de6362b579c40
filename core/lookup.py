"""The store's one lookup, as a rule on plain values: the packed-batch descriptor and the pick.

:class:`Packed` is the sequence descriptor every stage carries for a packed variable-length
batch (``cu_seqlens``): a request (:mod:`core.shape_request`), the choice of
``fa2tune.torch``, the store's lookup (:func:`db.queries.best_match`) and the exported header
take it where a dense call has none (``packed=None``), so a packed batch is a mode of the one
path, not a path of its own.

:func:`pick` is the lookup's rule for both modes, applied to the store's candidates
(:class:`Candidate`, plain values of its rows): the GPU by name key, the mask, the KV-cache
layout and length pattern (a cache call sees only cache problems of its very layout and
pattern, a dense call only dense ones), the attention variant's switches
(:attr:`core.variant.Variant.needs`) and then its window and chunk (the same, else the
nearest: :func:`variant_distance`), the exact shape (a packed batch: its very lengths) else
the nearest by :func:`core.shape.nearest_key`, then the fastest. The store reads, this
module decides; it imports only the floor below it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from core.gpu_name import normalize_gpu_name
from core.problem import parse_seqlens
from core.shape import (
    Shape,
    ShapeError,
    effective_causal,
    nearest_key,
    same_phase,
    shape_distance,
    varlen_shape,
)
from core.variant import PLAIN, Variant

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
        variant: the attention variant it was tuned for (plain for rows stored before).
        kv_page: its KV-cache layout (:attr:`core.problem.Problem.kv_page`; None: dense).
        kv_lengths: the length pattern it was timed on
            (:attr:`core.problem.Problem.kv_lengths`; ``full`` for a dense problem).
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
    variant: Variant = PLAIN
    kv_page: int | None = None
    kv_lengths: str = "full"


def _bound_term(asked: int, stored: int, none: int, shift: int) -> tuple[int, float]:
    """One window bound's (or the chunk's) part of :func:`variant_distance`."""
    if asked == stored:
        return (0, 0.0)
    if none in (asked, stored):
        return (1, 0.0)  # a bound on one side only
    return (0, abs(math.log2((asked + shift) / (stored + shift))))


def variant_distance(asked: Variant, stored: Variant) -> tuple[int, float]:
    """How far a stored problem's window and chunk are from the asked ones (``(0, 0.0)``:
    the same), compared as a key: first the number of bounds (left, right, chunk) that one
    side has and the other has not, then the sum of ``|log2|`` of the ratios of the others
    (a window bound counted from 1, so that a right bound 0, the causal one, compares).
    The softcap's value and the sinks are not compared: the switches equal (:func:`pick`
    asks that first), a config serves every value."""
    terms = (
        _bound_term(asked.window_left, stored.window_left, -1, 1),
        _bound_term(asked.window_right, stored.window_right, -1, 1),
        _bound_term(asked.chunk, stored.chunk, 0, 0),
    )
    return (sum(t[0] for t in terms), sum(t[1] for t in terms))


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
    variant: Variant = PLAIN,
    kv_page: int | None = None,
    kv_lengths: str = "full",
) -> Pick | None:
    """The rule of the store's one lookup, for a dense shape or a packed batch.

    Among the candidates of this GPU (by name key), the mask (a dense call's effective one,
    :func:`core.shape.effective_causal`; a packed batch's as given), the mode, the KV-cache
    layout (``kv_page``: a cache call's answer is a cache problem of the same layout, contiguous
    or of the same page size, and timed on the same length pattern ``kv_lengths``; a dense
    call's, None, a dense problem), the phase of a dense call
    (:func:`core.shape.same_phase`: decode steps and prefill never answer each other)
    and the variant's switches (a plain ask sees only plain problems, a windowed one only
    problems tuned with a window, ...): those whose window and chunk are the asked ones, else
    those nearest to them under :func:`variant_distance` (not exact then, and refused when
    ``exact``). The variant comes before the shape: a window tuned at another shape beats
    another window at this shape. Among them a problem measured at the asked shape (a packed
    batch: on its very lengths and heads) wins, else, unless ``exact``, the nearest under
    :func:`core.shape.nearest_key` with the GPU's SM count from ``sm_counts`` (ties: the lower
    shape for dense problems, as the header's sorted tables break them; the first tuned problem
    for packed ones). Among the dense problems of the chosen shape the best ``rank`` wins. A
    packed problem is compared as its count of sequences at their mean length
    (:func:`core.shape.varlen_shape`). None when nothing qualifies.
    """
    key = normalize_gpu_name(gpu)
    mask = served_mask(causal, shape, packed)
    lens = packed.seqlens if packed is not None else None
    compared: list[tuple[int, Shape, tuple[int, ...] | None]] = []
    needs = variant.needs
    for i, c in enumerate(candidates):
        if c.name_key != key or c.causal != mask or bool(c.seqlens) != (packed is not None):
            continue
        if c.variant.needs != needs or (c.kv_page, c.kv_lengths) != (kv_page, kv_lengths):
            continue
        measured = parse_seqlens(c.seqlens)
        try:
            sh = (Shape(c.n, c.nk, c.batch, c.heads, c.kv_heads) if measured is None
                  else varlen_shape(measured, c.heads, c.kv_heads))  # fmt: skip
        except ShapeError as exc:  # a store is not trusted to hold only runnable problems
            log.warning("problem %d skipped for shape lookups: %s", c.problem_id, exc)
            continue
        if packed is None and not same_phase(shape, sh):  # prefill never answers decode
            continue
        compared.append((i, sh, measured))
    if not compared:
        return None
    if not variant.plain:  # the same window and chunk, else the nearest tuned ones
        near = {i: variant_distance(variant, candidates[i].variant) for i, _, _ in compared}
        closest = min(near.values())
        if exact and closest != (0, 0.0):
            return None
        compared = [t for t in compared if near[t[0]] == closest]
        same_variant = closest == (0, 0.0)
    else:
        same_variant = True
    hits = [t for t in compared if t[1] == shape and t[2] == lens]
    if hits and (packed is None or lens is not None):
        best = min(hits, key=lambda t: candidates[t[0]].rank)
        return Pick(best[0], same_variant, 0.0, shape, lens)
    if exact:
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
