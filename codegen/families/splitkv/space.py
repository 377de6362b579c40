"""The split-KV (decode) family's space: which :class:`~core.splitkv_config.SplitKvConfig`
values are valid.

The rules restate the ``static_assert``\\s of ``splitkv::Traits``
(codegen/templates/splitkv_fwd.cuh) so that every config the space yields compiles, plus a
register estimate (the fp32 S and O accumulators of a warp's rows, and Q's fragments when
they stay in registers) that keeps ptxas from spilling. Spills are still measured per build.

The family is for calls whose packed query rows (GQA group x Nq) are few: decode and short
chunks. :func:`serves` says which problems a campaign searches it on; it is correct on every
shape (the GPU tests run it on long ones too).
"""

from __future__ import annotations

from dataclasses import replace

from codegen.families.declared import basic_reasons, outside, variant_reasons
from core.config import Dtype, tile_head_dim
from core.problem import MAX_KV_PAGE, Problem
from core.splitkv_config import SplitKvConfig

#: Head dims the template instantiates: every multiple of 8 up to 256. The tile's head dim is
#: rounded up to a multiple of 32 (:attr:`SplitKvConfig.tile_d`: whole groups of the 16-byte
#: chunks the XOR swizzle permutes); the rules below use the tile's.
HEAD_DIMS: tuple[int, ...] = tuple(range(8, 257, 8))
ROWS: tuple[int, ...] = (16, 32, 64)
BLOCK_N: tuple[int, ...] = (16, 32, 64)
WARPS: tuple[int, ...] = (1, 2, 4, 8)
STAGES: tuple[int, ...] = (2, 3, 4)
SPLITS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
MAX_SMEM_PER_BLOCK = 227 * 1024
#: fp32 accumulator and Q-fragment registers a thread may keep; the rest of the 255 is left
#: for addresses, softmax state and the fragments in flight.
MAX_ACC_REGS = 160
#: The campaign searches this family on problems with at most this many packed query rows
#: per (batch, KV head); past it the split-Q families' tiles do the same work better.
MAX_PACKED_ROWS = 256

#: The attention-variant switches this family's kernels are built with (core.variant). A
#: variant config follows the plain space rules (the tuner's ptxas check catches a spill).
VARIANT_SWITCHES: tuple[str, ...] = ("local", "softcap", "sinks")


#: Page sizes the cache kernels take: every power of two up to this (FlashAttention-3 and
#: FlashInfer take any page size; vLLM's default is 16; FlashAttention-2 needs multiples of 256).
#: The problem key's rule (core.problem.KV_PAGE_RULE) is the same domain.
MAX_PAGE_SIZE = MAX_KV_PAGE


def cache_reasons(config: SplitKvConfig) -> list[str]:
    """Why ``config``'s KV-cache parameters are out of their domain (empty when they are
    fine, or unused)."""
    why: list[str] = []
    p = config.page
    if p and not config.kvcache:
        why.append(f"page size {p} is set without the kvcache switch")
    if p < 0 or p > MAX_PAGE_SIZE or (p & (p - 1)) != 0:
        why.append(f"page size {p} is not a power of two up to {MAX_PAGE_SIZE}")
    if config.cap_split and not config.kvcache:
        why.append("capacity splits are set without the kvcache switch (a dense call's "
                   "length is its capacity)")  # fmt: skip
    if config.cap_split and config.local:
        why.append("capacity splits with a window: its key range keeps its own division")
    return why


def cache_twin(
    config: SplitKvConfig, page: int, smem_limit: int = MAX_SMEM_PER_BLOCK
) -> SplitKvConfig | None:
    """``config``'s KV-cache kernel for a cache of layout ``page`` (0: contiguous, ``_kvc``;
    P: pages of P tokens, ``_kvc_pg<P>``), or None when the space does not take it (a page
    size outside :data:`MAX_PAGE_SIZE`'s powers of two, or the tile itself invalid)."""
    twin = replace(config, kvcache=True, page=page)
    return None if invalid_reasons(twin, smem_limit) else twin


def enumerate_cache_space(
    d: int,
    dtype: Dtype = "fp16",
    causal: bool = False,
    page: int = 0,
    smem_limit: int = MAX_SMEM_PER_BLOCK,
) -> list[SplitKvConfig]:
    """The search space of a KV-cache problem of layout ``page``: every valid tile
    (:func:`enumerate_space`) as its cache kernel (:func:`cache_twin`), with its splits over
    each sequence's length and over the capacity (``cap_split``), sorted; empty for other
    head dims or a page size the kernels do not take. The cache kernels share the tile's
    shared memory and registers (docs/splitkv_kernel.md, "KV caches"), so the tiles are the
    same; what is fast is not (the paged loads' path depends on P, ``block_n`` and D)."""
    twins = (cache_twin(c, page, smem_limit) for c in enumerate_space(d, dtype, causal, smem_limit))
    out = [c for t in twins if t is not None for c in (t, replace(t, cap_split=True))]
    return sorted(c for c in out if not invalid_reasons(c, smem_limit))


def accumulator_regs(config: SplitKvConfig) -> int:
    """fp32 S and O accumulators per thread, plus Q's fragments when they stay in registers
    (for the tile's head dim; the kernel may use fewer when the head dim is not a multiple of
    32)."""
    d = config.tile_d
    q_in_regs = config.rows == 16 and d <= 128
    return config.rows * (d + config.block_n) // 32 + (d // 4 if q_in_regs else 0)


def invalid_reasons(config: SplitKvConfig, smem_limit: int = MAX_SMEM_PER_BLOCK) -> list[str]:
    """Why ``config`` is outside the space; empty when it is valid."""
    c = config
    why = basic_reasons(c, HEAD_DIMS) + outside(c, rows=ROWS)
    why += variant_reasons(c, VARIANT_SWITCHES)
    why += cache_reasons(c)
    if c.rows * c.tile_d > 4096:
        tile = f" (tile {c.tile_d})" if c.tile_d != c.d else ""
        why.append(f"{c.rows} rows x D={c.d}{tile} is over the 4096 the O accumulator allows")
    why += outside(c, block_n=BLOCK_N, warps=WARPS, stages=STAGES, splits=SPLITS)
    if accumulator_regs(c) > MAX_ACC_REGS:
        why.append(f"{accumulator_regs(c)} accumulator registers exceed {MAX_ACC_REGS}")
    limit = min(smem_limit, MAX_SMEM_PER_BLOCK)
    if c.smem_bytes > limit:
        why.append(f"needs {c.smem_bytes} bytes of shared memory, over {limit}")
    return why


def is_valid(config: SplitKvConfig, smem_limit: int = MAX_SMEM_PER_BLOCK) -> tuple[bool, str]:
    """``(True, "")`` for a config in the space, else ``(False, reasons)``."""
    why = invalid_reasons(config, smem_limit)
    return (not why, "; ".join(why))


def enumerate_space(
    d: int, dtype: Dtype = "fp16", causal: bool = False, smem_limit: int = MAX_SMEM_PER_BLOCK
) -> list[SplitKvConfig]:
    """Every valid config for one head dim, dtype and mask, sorted; empty for other head dims."""
    if d not in HEAD_DIMS:
        return []
    candidates = (
        SplitKvConfig(d, dtype, causal, r, n, w, s, k)
        for r in ROWS
        for n in BLOCK_N
        for w in WARPS
        for s in STAGES
        for k in SPLITS
    )
    return sorted({c for c in candidates if not invalid_reasons(c, smem_limit)})


def default_config(d: int, dtype: Dtype, causal: bool) -> SplitKvConfig:
    """16 packed rows, 4 warps of 32-key tiles (16 for a tile D over 128), 2 stages, up to 16
    splits.

    Raises:
        ValueError: for a head dim outside :data:`HEAD_DIMS`.
    """
    if d not in HEAD_DIMS:
        raise ValueError(f"head dim {d} is not one of {list(HEAD_DIMS)} for the splitkv family")
    return SplitKvConfig(d, dtype, causal, 16, 32 if tile_head_dim(d) <= 128 else 16, 4, 2, 16)


def fit_config(config: SplitKvConfig, smem_limit: int) -> SplitKvConfig | None:
    """``config`` made to fit ``smem_limit`` bytes of shared memory per block: fewer keys per
    warp tile first (the K/V rings shrink and the pipeline keeps its depth), then fewer warps
    (the splits then carry the keys in flight); None when even one warp of 16-key tiles does
    not fit. The default's tiles are sized for sm_90's 227 KB; a 99 KB GPU (sm_86/89/120/121)
    runs the fitted one.
    """
    fitted = config
    while invalid_reasons(fitted, smem_limit):
        if fitted.block_n > BLOCK_N[0]:
            fitted = replace(fitted, block_n=fitted.block_n // 2)
        elif fitted.warps > WARPS[0]:
            fitted = replace(fitted, warps=fitted.warps // 2)
        else:
            return None
    return fitted


def seed_configs(d: int, dtype: Dtype = "fp16", causal: bool = False) -> list[SplitKvConfig]:
    """The default and its neighbours in the two choices that matter most: splits and depth."""
    if d not in HEAD_DIMS:
        return []
    base = default_config(d, dtype, causal)
    found = [base, replace(base, splits=32), replace(base, splits=4), replace(base, stages=3)]
    found.append(replace(base, warps=8, block_n=16))
    return sorted({c for c in found if not invalid_reasons(c)})


def serves(problem: Problem) -> bool:
    """Whether a campaign searches this family on ``problem``: few packed query rows."""
    group = problem.heads // max(problem.n_kv_heads, 1)
    return group * problem.n <= MAX_PACKED_ROWS
