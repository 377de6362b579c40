"""Attention call shapes and the distance that picks the nearest tuned shape.

A tuned result is measured at one shape; users call many. When the exact shape was not tuned,
the store, the service and the exported header all answer with the tuned shape nearest under
:func:`shape_distance` (the C++ twin lives in ``codegen/templates/fa_shape.cuh``; a
compile-tier test holds the two to the same answers). The distance sums four log ratios, each
a property a kernel's best tile choice depends on:

* query length ``nq`` and key length ``nk`` (tile tails, causal work, pipeline depth);
* the grid fill: query blocks of a nominal :data:`NOMINAL_BLOCK_ROWS` rows x heads x batch
  over the GPU's SM count, clamped to [1/SMs, :data:`MAX_WAVES`] so that shapes which fill the
  GPU many times over count as alike (their best tiles stop depending on the grid);
* the GQA group ``q_heads / kv_heads`` (how many query heads share one K/V head).

For the campaign's square problems at one batch and head count the two length terms are
equal and the fill term grows with N, so the nearest shape is the nearest N on a log scale,
as it was before shapes were keys, up to the fill term's block rounding and clamp, which can
move the boundary a little off the geometric midpoint of two tuned Ns (``/v1/best?n=`` alone
keeps the exact per-N rule).

The nearest shape of a dense call is sought within its phase only (:func:`same_phase`): a decode
step (at most :data:`DECODE_MAX_NQ` query rows) is never answered by a prefill shape's
config, nor the reverse. Their best kernels differ in kind, not in degree (a prefill tile
spends a 128-row block per query head on one row; a decode kernel packs the GQA group and
splits the keys, and serves only a few rows), so with nothing tuned in the call's phase the
lookup finds nothing and the family default for the call serves: on the H200, a D=64
decode call answered by the nearest prefill tile ran at 7x the split-KV default's time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: Query rows of the nominal block the grid-fill term counts (the common FA2/FA3 tile height).
NOMINAL_BLOCK_ROWS = 128

#: Grid fills at or above this many waves count as equal.
MAX_WAVES = 8.0

#: Query rows per sequence up to which a call is a decode step: one new token, or the few of
#: speculative decoding. Tuned shapes answer only calls of their own phase (:func:`same_phase`).
DECODE_MAX_NQ = 16

#: The kernels' int32 limit on lengths, batch and heads.
MAX_DIM = 2**31 - 1


class ShapeError(ValueError):
    """A shape no kernel can run: a zero length, or heads not a multiple of KV heads."""


@dataclass(frozen=True, order=True)
class Shape:
    """One attention call's shape (head dim, dtype and mask are keys of their own).

    Attributes:
        nq: query rows per (batch, head).
        nk: key rows per (batch, KV head).
        batch: batch size.
        heads: query heads.
        kv_heads: key/value heads; ``heads`` is a multiple of it (GQA/MQA when smaller).
    """

    nq: int
    nk: int
    batch: int
    heads: int
    kv_heads: int

    def __post_init__(self) -> None:
        for name in ("nq", "nk", "batch", "heads", "kv_heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ShapeError(f"{name} must be an integer, got {value!r}")
            if not 1 <= value <= MAX_DIM:
                raise ShapeError(f"{name} must be between 1 and {MAX_DIM}, got {value}")
        if self.heads % self.kv_heads:
            raise ShapeError(
                f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.heads // self.kv_heads

    def describe(self) -> str:
        gqa = f"/{self.kv_heads}kv" if self.kv_heads != self.heads else ""
        return f"B={self.batch} H={self.heads}{gqa} Nq={self.nq} Nk={self.nk}"


def grid_fill(shape: Shape, sm_count: int) -> float:
    """Waves of nominal query blocks the shape launches on ``sm_count`` SMs, clamped."""
    blocks = -(-shape.nq // NOMINAL_BLOCK_ROWS) * shape.heads * shape.batch
    sms = max(sm_count, 1)
    return min(max(blocks / sms, 1.0 / sms), MAX_WAVES)


def shape_distance(asked: Shape, tuned: Shape, sm_count: int) -> float:
    """How far a tuned shape's best config is from serving ``asked`` well (0 = same shape).

    The sum of |log ratio| of Nq, Nk, :func:`grid_fill` and the GQA group.
    """
    return (
        abs(math.log(asked.nq / tuned.nq))
        + abs(math.log(asked.nk / tuned.nk))
        + abs(math.log(grid_fill(asked, sm_count) / grid_fill(tuned, sm_count)))
        + abs(math.log(asked.group / tuned.group))
    )


def nearest_key(asked: Shape, tuned: Shape, sm_count: int) -> tuple[float, int, int, int, int]:
    """Sort key of a tuned shape: distance first, then the larger shape (longer, bigger) wins.

    The tie-break keeps the old rule for square problems (equal log distance: the larger N).
    """
    return (shape_distance(asked, tuned, sm_count), *tie_key(tuned))


def tie_key(tuned: Shape) -> tuple[int, int, int, int]:
    """:func:`nearest_key`'s tie-break among tuned shapes at one distance: the longer, then
    the bigger (the exported header's ``nearer`` in fa_shape.cuh is the same)."""
    return (-tuned.nq, -tuned.nk, -tuned.batch * tuned.heads, tuned.kv_heads)


def is_decode(shape: Shape) -> bool:
    """Whether a call of this shape is a decode step (at most :data:`DECODE_MAX_NQ` query
    rows per sequence)."""
    return shape.nq <= DECODE_MAX_NQ


def phase_of(shape: Shape) -> str:
    """``"decode"`` or ``"prefill"`` (:func:`is_decode`), as messages name a call's phase."""
    return "decode" if is_decode(shape) else "prefill"


#: How messages say where the phases part.
PHASE_RULE = f"Nq <= {DECODE_MAX_NQ} is decode"


def same_phase(asked: Shape, tuned: Shape) -> bool:
    """Whether a tuned shape may answer ``asked``: both decode steps or both prefill
    (:func:`is_decode`). The store's lookup, the service's index and the exported header
    (``fa_shape.cuh``'s twin) leave out every tuned shape of the other phase."""
    return is_decode(asked) == is_decode(tuned)


def nearest_shape(
    asked: Shape, tuned: list[Shape], sm_count: int, *, phased: bool = True
) -> Shape | None:
    """The tuned shape nearest to ``asked`` (``asked`` itself when tuned) among those of its
    phase (:func:`same_phase`; all of them with ``phased`` false: a packed batch's mean
    length counts queries and keys alike, so a batch of short sequences is a short prefill,
    not a decode step); None when there is none."""
    alike = [t for t in tuned if not phased or same_phase(asked, t)]
    if not alike:
        return None
    return min(alike, key=lambda t: nearest_key(asked, t, sm_count))


def effective_causal(causal: bool, nq: int) -> bool:
    """The mask a call is answered (and served) as: a causal call with one query row counts
    as unmasked.

    The causal mask is bottom-right aligned, so one query row sees every key and the two
    compute the same thing; models pass ``causal=True`` to every call, decode steps
    included, and decode is tuned unmasked. The store, the service's index, the exported
    header and ``fa2tune.torch`` all apply this one rule, so they agree.
    """
    return causal and nq != 1


def varlen_shape(seqlens: Sequence[int], heads: int, kv_heads: int) -> Shape:
    """The dense shape a packed batch is compared by: its count of sequences at their mean
    length (the work per sequence of the mean one, the grid of the whole batch). The store,
    the service, the exported header (fa_shape.cuh's twin) and ``fa2tune.torch`` use it."""
    mean = max(1, round(sum(seqlens) / len(seqlens)))
    return Shape(mean, mean, len(seqlens), heads, kv_heads)
