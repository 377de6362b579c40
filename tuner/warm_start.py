"""Warm starts: a results file's fastest configs per problem, measured first.

After the kernel templates change (a new fa2tune), results measured with the old builds no
longer describe what the current templates compile to. ``fa2tune tune --warm-start FILE``
re-measures the configs that were fastest in ``FILE`` first (for every problem of the campaign
that the file has), ahead of the families' seeds, so a short campaign (``--trials`` a little
above ``--warm-start-top``) re-verifies and re-times the earlier winners on the new builds.
The file is a results file (``fa2tune dump``); problems match on their shape, dtype and mask
(the GPU is the one tuned now, whatever the file's was).

``--warm-start-other-dtype`` also lets a problem start from the other 16-bit type's winners of
the same shape and mask, their dtype swapped (after its own, when the file has both): the
tile that wins one of fp16 and bf16 is a strong first guess for the other (the same MMA
shapes and shared-memory footprint; on the H200 the two dtypes' picks are mostly the same
tile), so a problem tuned in one dtype only gets a short campaign in the other.

A KV-cache problem (``kv_page`` set) starts from its own layout's winners, then from the
dense problem's of the same shape, as their cache twins (``kvcache=True``, the problem's page
size; a launch order a cache kernel does not take, fa3's longest-first, dropped): the tile
that wins over dense K/V is a strong first guess over the same keys in a cache. Twins the
family's space does not take are left out by the campaign, as any seed outside the space.

A cache problem's length pattern (``kv_lengths``: ``full`` or ``mixed``) is part of the key:
it starts from its own pattern's winners, then from the other pattern's of the same shape and
layout (the same cache kernels: one build serves every length mix, so they are queued as they
are; what wins differs, the split count most), then from the dense problem's twins.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from core.config import Dtype
from core.family import AnyConfig, cache_twin
from core.kv_lengths import kv_lengths_text
from core.problem import Problem, kv_page_text
from core.records import MeasureStatus
from db.dump_format import TransferError, load_dump

log = logging.getLogger(__name__)

#: Configs per problem a warm start queues when not told otherwise.
DEFAULT_TOP = 5

#: (d, nq, nk, batch, heads, kv_heads, dtype, causal, the variant's key text, the KV-cache
#: layout's, the length pattern's): a variant's winners warm only a problem of the same
#: variant (they are built with its switches), a cache layout's only a problem of that layout
#: (they are its cache kernels; :meth:`WarmStart.configs_for` also reaches across patterns).
ShapeKey = tuple[int, int, int, int, int, int, str, bool, str, str, str]


def shape_key(problem: Problem) -> ShapeKey:
    p = problem
    return (p.d, p.n, p.n_keys, p.batch, p.heads, p.n_kv_heads, p.dtype, p.causal,
            p.variant.key_text(), kv_page_text(p.kv_page),
            kv_lengths_text(p.kv_lengths))  # fmt: skip


@dataclass(frozen=True)
class WarmStart:
    """Per problem shape, earlier results' fastest verified configs, fastest first."""

    source: str
    configs: dict[ShapeKey, tuple[AnyConfig, ...]]

    def configs_for(self, problem: Problem) -> tuple[AnyConfig, ...]:
        """``problem``'s configs to measure first: its own key's; for a cache problem then
        the other length pattern's of its layout, then the dense problem's cache twins (the
        module docstring), each config once."""
        own = self.configs.get(shape_key(problem), ())
        if problem.kv_page is None:
            return own
        other = "full" if problem.kv_lengths == "mixed" else "mixed"
        across = self.configs.get(shape_key(replace(problem, kv_lengths=other)), ())
        dense = self.configs.get(shape_key(replace(problem, kv_page=None, kv_lengths="full")), ())
        twins = [t for c in dense if (t := cache_twin(c, problem.kv_page)) is not None]
        return tuple(dict.fromkeys((*own, *across, *twins)))


#: Each 16-bit element type and the one whose winners it may start from.
OTHER_DTYPE: dict[str, Dtype] = {"fp16": "bf16", "bf16": "fp16"}


def _with_other_dtype(
    chosen: dict[ShapeKey, tuple[AnyConfig, ...]], top: int
) -> dict[ShapeKey, tuple[AnyConfig, ...]]:
    """``chosen`` with every key also warmed by its other dtype's configs, re-typed: after
    the key's own (which keep their order), up to ``top`` in all, without repeats."""
    out = dict(chosen)
    for key, configs in chosen.items():
        other = OTHER_DTYPE.get(key[6])
        if other is None:
            continue
        twin: ShapeKey = (*key[:6], other, *key[7:])
        own = out.get(twin, ())
        typed = [replace(c, dtype=other) for c in configs]
        out[twin] = (*own, *[c for c in typed if c not in own])[: max(top, len(own))]
    return out


def load_warm_start(path: Path, top: int = DEFAULT_TOP, other_dtype: bool = False) -> WarmStart:
    """The ``top`` fastest verified configs of every problem in the results file ``path``;
    with ``other_dtype``, each problem also gets the other 16-bit dtype's, re-typed (see the
    module docstring).

    Raises:
        ValueError: ``top`` below 1.
        TransferError: the file is missing or not a valid results file (one line).
    """
    if top < 1:
        raise ValueError(f"top must be at least 1, got {top}")
    dump = load_dump(path)
    configs = {b.key: b.config.to_config() for b in dump.builds}
    timed: dict[ShapeKey, dict[str, tuple[float, AnyConfig]]] = {}
    for m in dump.measurements:
        if m.status != MeasureStatus.OK or m.median_ms is None:
            continue
        p = m.problem
        key: ShapeKey = (p.d, p.n, p.nk, p.batch, p.heads, p.kv_heads, p.dtype, p.causal,
                         p.variant.key_text(), kv_page_text(p.kv_page),
                         kv_lengths_text(p.kv_lengths))  # fmt: skip
        config = configs[m.build.key]
        seen = timed.setdefault(key, {})
        best = seen.get(config.name)
        if best is None or m.median_ms < best[0]:
            seen[config.name] = (m.median_ms, config)
    chosen = {
        key: tuple(c for _, c in sorted(by_name.values(), key=lambda t: t[0])[:top])
        for key, by_name in timed.items()
    }
    if other_dtype:
        chosen = _with_other_dtype(chosen, top)
    log.info("warm start from %s: %d problems, up to %d configs each", path, len(chosen), top)
    return WarmStart(str(path), chosen)


def with_warm_start(
    warm: WarmStart | None, seeds: Sequence[AnyConfig], problem: Problem
) -> list[AnyConfig]:
    """``problem``'s warm-start configs, then ``seeds`` not among them."""
    first = list(warm.configs_for(problem)) if warm is not None else []
    return first + [c for c in seeds if c not in first]


__all__ = [
    "DEFAULT_TOP",
    "OTHER_DTYPE",
    "TransferError",
    "WarmStart",
    "load_warm_start",
    "shape_key",
    "with_warm_start",
]
