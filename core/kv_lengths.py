"""The length pattern a KV-cache problem is timed on (:attr:`core.problem.Problem.kv_lengths`).

A cache kernel reads each sequence's length on the device, so one compiled config serves every
length mix; what is fast is not the same for every mix. A split-KV config cuts each sequence
into its fixed number of splits: when every sequence is at the capacity, few splits fill the
GPU; when the lengths differ (a serving batch), the longest sequence runs on its few blocks
while the GPU idles. So the pattern is part of a cache problem's key:

* ``full`` (the default): every sequence holds the capacity (``nk``) keys;
* ``mixed``: a fixed spread of lengths, log-uniform over ``[nk / 128, nk]`` (at least one
  key) in a seeded order, one sequence at the capacity, so the longest sequence is the
  problem's ``nk``. The spread depends on the batch and ``nk`` only (Python's ``random``
  with a fixed seed: the same lengths on every machine and release), so every stage (the
  worker's cache, the FLOP count, the store) sees the same problem.

A decode call's lengths are not known on the host, so the op, the service (``/v1/best`` without
``kv_lengths``) and the exported header answer it from both patterns' problems alike: the
nearest tuned shape of either, a tie going to ``mixed`` (:func:`answering_pattern`; a serving
batch's lengths differ). A shape tuned only ``full`` (batch 1, where no mix exists) keeps its
exact answer (docs/splitkv_kernel.md, "Cache problems tuned on a length mix").
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from functools import lru_cache
from typing import Literal

from core.shape import Shape, tie_key

KvLengths = Literal["full", "mixed"]
#: Every pattern, the default first.
KV_LENGTHS: tuple[KvLengths, ...] = ("full", "mixed")
#: The patterns a cache call is answered from, in the order a tie goes.
CALL_ORDER: tuple[KvLengths, ...] = ("mixed", "full")
#: The shortest length of a ``mixed`` spread is the capacity over this.
MIXED_SPREAD = 128
#: The seed of the ``mixed`` draws (fixed: the pattern is part of a problem's identity).
MIXED_SEED = 2024


def kv_lengths_error(value: object) -> str | None:
    """Why ``value`` is not a length pattern; None when it is one."""
    if value not in KV_LENGTHS:
        return f"kv_lengths must be one of {', '.join(KV_LENGTHS)}, got {value!r}"
    return None


def check_kv_lengths(value: object, kv_page: int | None) -> None:
    """Refuse a length pattern no problem (or lookup) of layout ``kv_page`` can have.

    Raises:
        ValueError: ``value`` is not one of :data:`KV_LENGTHS`, or it is not ``full`` while
            ``kv_page`` is None (only a KV-cache problem is timed on a length pattern).
    """
    why = kv_lengths_error(value)
    if why is not None:
        raise ValueError(why)
    if value != "full" and kv_page is None:
        raise ValueError(
            f"kv_lengths {value!r} is a KV-cache problem's length pattern: it needs kv_page "
            "(0 for a contiguous cache)"
        )


def kv_lengths_text(value: str) -> str:
    """The pattern's part of a study name: ``""`` for ``full`` (names stay as they were),
    ``_mix`` for ``mixed``."""
    return "_mix" if value == "mixed" else ""


def describe_kv_lengths(value: str) -> str:
    """The pattern in words, for tables and messages."""
    if value == "mixed":
        return f"lengths mixed over [capacity/{MIXED_SPREAD}, capacity]"
    return "every sequence at the capacity"


@lru_cache(maxsize=256)
def mixed_lengths(batch: int, capacity: int) -> tuple[int, ...]:
    """The ``mixed`` pattern's lengths of ``batch`` sequences over ``capacity`` keys (see the
    module docstring): each in ``[max(1, capacity // MIXED_SPREAD), capacity]``, one of them
    ``capacity``.

    Raises:
        ValueError: a batch or capacity below 1.
    """
    if batch < 1 or capacity < 1:
        raise ValueError(
            f"a length mix needs batch >= 1 and capacity >= 1, got {batch}, {capacity}"
        )
    rng = random.Random(MIXED_SEED)
    low = max(1, capacity // MIXED_SPREAD)
    span = math.log(capacity / low)
    lengths = [min(capacity, max(low, int(low * math.exp(span * rng.random()))))
               for _ in range(batch)]  # fmt: skip
    lengths[rng.randrange(batch)] = capacity
    return tuple(lengths)


def pattern_lengths(pattern: str, batch: int, capacity: int) -> tuple[int, ...]:
    """Each sequence's length under ``pattern``: ``capacity`` each for ``full``."""
    if pattern == "mixed":
        return mixed_lengths(batch, capacity)
    return (capacity,) * batch


def answering_pattern(nearest: Mapping[str, tuple[float, Shape] | None]) -> KvLengths | None:
    """The pattern whose tuned problem answers a cache call, given each pattern's nearest
    tuned problem to the call (its distance and shape; None or absent: none of it tuned):
    the nearer one, a tie on the distance and the shape's tie-break
    (:func:`core.shape.nearest_key`) going to the earlier of :data:`CALL_ORDER`. None when
    neither is tuned."""
    best: tuple[tuple[float, int, int, int, int], KvLengths] | None = None
    for pattern in CALL_ORDER:
        found = nearest.get(pattern)
        if found is None:
            continue
        key = (found[0], *tie_key(found[1]))
        if best is None or key < best[0]:
            best = (key, pattern)
    return None if best is None else best[1]
