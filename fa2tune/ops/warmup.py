"""Ahead-of-time builds of the kernels a workload will run: ``fa2tune warmup``.

The torch op compiles a config the first time a call needs it (seconds per config with nvcc
or NVRTC), which a serving engine sees as a stall of its first requests. Warmup makes the
same decisions the op would make for each call of a workload file (:mod:`tuner.workload`:
the store's tuned answer, exact or nearest, else the default fitted to the GPU) and builds
them into the build cache the op reads (``settings.cache_dir``), so first calls find their
cubins there. Nothing is launched: it needs no GPU when the GPU is named (``--gpu`` and
``--arch``), and the cache can be built on one machine and copied to others of the same
target (the cache key holds the target, the template, the flags and the compiler).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from codegen.build import BuildBatch, build_batch
from core.family import AnyConfig
from core.lookup import Packed
from core.shape import effective_causal
from db.store import Store
from fa2tune.ops.cache_choice import cache_choice
from fa2tune.ops.choice import (
    Call,
    Choice,
    Unsupported,
    choose,
    effective_varlen_causal,
    mean_bucket,
)
from tuner.workload import Target

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuTarget:
    """The GPU the warmup decides for: its name (the store's key), SM count (the nearest-shape
    rule and the decode default use it) and compute capability."""

    name: str
    sm_count: int
    compute_capability: str


@dataclass(frozen=True)
class Planned:
    """One workload call and what it will run: a choice, or why the op would fall back."""

    target: Target
    choice: Choice | None
    reason: str = ""


def call_of(target: Target, gpu: GpuTarget) -> Call:
    """The torch op's view of one workload call (its effective mask, its packed descriptor)."""
    if target.seqlens is None:
        causal = effective_causal(target.causal, target.shape.nq)
        return Call(0, gpu.name, gpu.sm_count, gpu.compute_capability, target.shape,
                    target.dtype, causal, target.d, variant=target.variant)  # fmt: skip
    lens = target.seqlens
    packed = Packed(len(lens), mean_bucket(sum(lens), len(lens)))
    shape = packed.shape(target.shape.heads, target.shape.kv_heads)
    causal = effective_varlen_causal(target.causal, max(lens))
    return Call(0, gpu.name, gpu.sm_count, gpu.compute_capability, shape, target.dtype,
                causal, target.d, packed=packed, variant=target.variant)  # fmt: skip


def plan(store: Store | None, targets: Sequence[Target], gpu: GpuTarget) -> list[Planned]:
    """The choice of each target's call, as the op makes it: :func:`fa2tune.ops.choice.choose`
    for a dense call, :func:`fa2tune.ops.cache_choice.cache_choice` (the cache kernel of the
    entry's layout, ``kv_page``) for a call over a KV cache."""
    out = []
    for target in targets:
        call = call_of(target, gpu)
        try:
            if target.kv_page is None:
                out.append(Planned(target, choose(store, call)))
            else:
                out.append(Planned(target, cache_choice(store, call, target.kv_page)))
        except Unsupported as exc:
            out.append(Planned(target, None, exc.reason))
    return out


def build_planned(planned: Sequence[Planned], arch: str, jobs: int | None = None) -> BuildBatch:
    """Build every planned config once (cached ones are not rebuilt) for a GPU of ``arch``.

    Raises:
        codegen.build.NvccNotFoundError: neither nvcc nor NVRTC can be run.
    """
    configs: list[AnyConfig] = list(
        dict.fromkeys(p.choice.config for p in planned if p.choice is not None)
    )
    log.info("warmup: %d calls need %d configs for %s", len(planned), len(configs), arch)
    return build_batch(configs, arch=arch, jobs=jobs)
