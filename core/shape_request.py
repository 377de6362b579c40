"""What a ``best`` request asks for, from its parameters: a dense shape or a packed batch.

``/v1/best`` and ``fa2tune best`` take the same parameters (``n`` and ``nq``, ``nk``,
``batch``, ``heads``, ``kv_heads``) and resolve them here, by one rule, into a
:class:`core.shape.Shape`, or into None for an old-style request that gives ``n`` alone (which
keeps the nearest-N answer it always had). ``/v1/best/varlen`` and ``fa2tune best --seqlens``
add ``seqlens`` (a comma list): :func:`resolve_varlen` makes a :class:`VarlenRequest` of it,
with the same error messages on both.

:class:`Packed` is the sequence descriptor every stage carries for a packed variable-length
batch (``cu_seqlens``): the choice of ``fa2tune.torch``, the store's lookup
(:mod:`db.queries`) and the exported header's tables take it where a dense call has none
(``packed=None``), so a packed batch is a mode of the one path, not a path of its own.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from core.gpu_name import normalize_gpu_name
from core.problem import parse_seqlens
from core.shape import (
    MAX_DIM,
    Shape,
    ShapeError,
    effective_causal,
    nearest_key,
    shape_distance,
    varlen_shape,
)

log = logging.getLogger(__name__)

#: The campaign's batch size and head count (:class:`core.problem.Problem`'s defaults): a
#: shape that leaves them out is asked at what the shipped results were tuned on.
DEFAULT_BATCH = 2
DEFAULT_HEADS = 16


class ShapeParamError(ShapeError):
    """One parameter of a request makes no shape; ``param`` names it (e.g. ``"kv_heads"``)."""

    def __init__(self, param: str, message: str, value: int | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.value = value


def resolve_shape(
    n: int | None,
    *,
    nq: int | None = None,
    nk: int | None = None,
    batch: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
) -> Shape | None:
    """The asked shape, or None when only ``n`` is given (the per-N answer).

    With any of the shape parameters: ``nq`` is ``nq`` or ``n``, ``nk`` defaults to ``nq``,
    ``batch`` to :data:`DEFAULT_BATCH`, ``heads`` to :data:`DEFAULT_HEADS` and ``kv_heads`` to
    ``heads``.

    Raises:
        ShapeParamError: neither ``n`` nor ``nq``; ``n`` and ``nq`` differ; a value outside
            1..2^31-1; ``heads`` not a multiple of ``kv_heads``.
    """
    given = {"n": n, "nq": nq, "nk": nk, "batch": batch, "heads": heads, "kv_heads": kv_heads}
    for name, value in given.items():
        if value is not None and not 1 <= value <= MAX_DIM:
            raise ShapeParamError(name, f"must be between 1 and {MAX_DIM}", value)
    if n is None and nq is None:
        raise ShapeParamError("n", "required: give n, or nq for a whole shape")
    if n is not None and nq is not None and n != nq:
        raise ShapeParamError("nq", f"differs from n ({n}); give one of them", nq)
    if nq is None and nk is None and batch is None and heads is None and kv_heads is None:
        return None
    q = nq if nq is not None else n
    assert q is not None  # one of the two, checked above
    h = heads if heads is not None else DEFAULT_HEADS
    kv = kv_heads if kv_heads is not None else h
    if h % kv:
        raise ShapeParamError("kv_heads", f"heads ({h}) must be a multiple of kv_heads", kv)
    return Shape(
        nq=q,
        nk=nk if nk is not None else q,
        batch=batch if batch is not None else DEFAULT_BATCH,
        heads=h,
        kv_heads=kv,
    )


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
    mask = causal if packed is not None else effective_causal(causal, shape.nq)
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


#: Most sequences one request may name (the query string stays a few hundred KB at most).
MAX_SEQUENCES = 65536
#: Positive integers without leading zeros, comma-separated; at most 10 digits each (the
#: int32 limit is checked after parsing).
SEQLENS_PATTERN = r"^[1-9][0-9]{0,9}(,[1-9][0-9]{0,9})*$"
_SEQLENS_RE = re.compile(SEQLENS_PATTERN)
#: Query heads when a varlen request leaves them out (the campaign's, as for dense shapes).
DEFAULT_VARLEN_HEADS = DEFAULT_HEADS


@dataclass(frozen=True)
class VarlenRequest:
    """A resolved varlen request: each sequence's length and the head counts."""

    seqlens: tuple[int, ...]
    heads: int
    kv_heads: int

    @property
    def packed(self) -> Packed:
        """The asked batch as the store's lookup takes it."""
        return Packed.of(self.seqlens)


def parse_seqlens_param(text: str) -> list[int]:
    """``"100,4000,7"`` -> ``[100, 4000, 7]``.

    Raises:
        ValueError: not a comma list of positive integers, a length or their total past
            int32, or more than :data:`MAX_SEQUENCES` of them.
    """
    if not _SEQLENS_RE.fullmatch(text):
        raise ValueError("must be positive integers separated by commas, e.g. 100,4000,7")
    lens = [int(x) for x in text.split(",")]
    if len(lens) > MAX_SEQUENCES:
        raise ValueError(f"at most {MAX_SEQUENCES} lengths, got {len(lens)}")
    too_long = next((n for n in lens if n > MAX_DIM), None)
    if too_long is not None:
        raise ValueError(f"each length must be between 1 and {MAX_DIM}, got {too_long}")
    if sum(lens) > MAX_DIM:
        raise ValueError(f"the lengths add up to {sum(lens)}, past {MAX_DIM}")
    return lens


def resolve_varlen(seqlens: str, heads: int | None, kv_heads: int | None) -> VarlenRequest:
    """The asked packed batch: ``seqlens`` parsed (:func:`parse_seqlens_param`), ``heads``
    defaulting to :data:`DEFAULT_VARLEN_HEADS` and ``kv_heads`` to ``heads``.

    Raises:
        ShapeParamError: ``param`` ``"seqlens"`` for bad lengths; ``"heads"`` or
            ``"kv_heads"`` outside 1..2^31-1; ``"kv_heads"`` when ``heads`` is not a
            multiple of it.
    """
    for name, value in (("heads", heads), ("kv_heads", kv_heads)):
        if value is not None and not 1 <= value <= MAX_DIM:
            raise ShapeParamError(name, f"must be between 1 and {MAX_DIM}", value)
    try:
        lens = parse_seqlens_param(seqlens)
    except ValueError as exc:
        raise ShapeParamError("seqlens", str(exc)) from None
    q_heads = heads if heads is not None else DEFAULT_VARLEN_HEADS
    kv = kv_heads if kv_heads is not None else q_heads
    if q_heads % kv:
        raise ShapeParamError(
            "kv_heads", f"heads ({q_heads}) must be a multiple of kv_heads ({kv})", kv
        )
    return VarlenRequest(tuple(lens), q_heads, kv)


def no_varlen_results(gpu: str, d: int, dtype: str, causal: bool) -> str:
    """Why a varlen request has no answer: no varlen problem of this GPU, D, dtype and mask
    has a verified, timed measurement."""
    mask = "causal" if causal else "full"
    return f"no varlen results for {gpu!r}, D={d}, {dtype}, {mask}"
