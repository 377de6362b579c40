"""The tuning space: every template instantiation worth compiling for one (D, dtype, mask).

The rules mirror the ``static_assert``\\ s and the code structure of
``codegen/templates/fa2_fwd.cuh``: each warp owns whole 16-row ``mma.m16n8k16`` tiles of the
query block (split-Q), key tiles are consumed 16 keys per k-step, the swizzle permutes 16-byte
chunks in groups of 4, and the dynamic shared memory is ``Fa2Config.smem_bytes``. On top of
what the template accepts, two budgets prune configs that cannot be good: rows per warp are kept
at 16 or 32 (64 would need ~2x the accumulator registers of the largest useful tile) and a
per-thread register estimate must stay under :data:`MAX_EST_REGISTERS`. Configs estimated
between :data:`SPILL_RISK_REGISTERS` and :data:`MAX_EST_REGISTERS` may spill; they are kept
because whether ptxas spills them is exactly what a build measures.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

# The targets the family builds for (re-exported: the fa2 space is where they were).
from codegen.families.declared import variant_reasons
from codegen.targets import ARCH_SMEM_LIMIT as ARCH_SMEM_LIMIT
from codegen.targets import DEFAULT_SMEM_LIMIT as DEFAULT_SMEM_LIMIT
from codegen.targets import SUPPORTED_ARCHS as SUPPORTED_ARCHS
from codegen.targets import check_arch
from core.config import DTYPES, HEAD_DIMS, HEAD_DIMS_RULE, Dtype, tile_head_dim
from core.fa2_config import Fa2Config

VALID_HEAD_DIMS: tuple[int, ...] = HEAD_DIMS
VALID_DTYPES: tuple[Dtype, ...] = DTYPES
VALID_WARPS: tuple[int, ...] = (2, 4, 8)
VALID_BR: tuple[int, ...] = (32, 64, 128, 256)
VALID_BC: tuple[int, ...] = (32, 64, 128, 256)
VALID_STAGES: tuple[int, ...] = (1, 2, 3, 4)
VALID_PADS: tuple[int, ...] = (0, 8, 16)
VALID_ROWS_PER_WARP: tuple[int, ...] = (16, 32)
#: ``(pad, swizzle)`` shared-memory layouts; padding and swizzling are alternatives.
VALID_LAYOUTS: tuple[tuple[int, bool], ...] = ((0, False), (8, False), (16, False), (0, True))

MMA_M = 16  # rows of one mma.m16n8k16 tile: the unit a warp's query rows come in
MMA_K = 16  # keys per k-step of the P·V product
SWIZZLE_CHUNK_GROUP = 4  # the swizzle permutes 16-byte chunks in groups of 4 (D % 32 == 0)


#: Registers the estimate adds for addresses, loop counters, smem offsets and the transient
#: ldmatrix/packed-P fragments. Calibrated on 113 pad-8, 1-stage tiles of the template (sm_90,
#: nvcc 13.0): estimates up to ~200 mostly compile without spills, 200-300 spill up to ~750
#: bytes per thread (e.g. FA2's D=64 128x128 tile, estimated 232, spills ~120 bytes), and
#: every tile estimated over 300 spills more than 1000 bytes.
BASE_REGISTERS = 32
#: Above this estimate a config is rejected: it would spill hundreds of bytes per thread.
MAX_EST_REGISTERS = 300
#: Above this estimate ptxas may spill; such configs stay in the space (spilling is data).
SPILL_RISK_REGISTERS = 200
#: The template keeps Q's mma fragments in registers when they take at most this many ...
Q_IN_REGS_MAX = 32
#: ... and the fp32 accumulators plus those fragments stay within this many (``kQInRegs``).
Q_IN_REGS_MAX_TOTAL = 160

#: FlashAttention-2's forward tile choices per tile head dim (:func:`core.config.tile_head_dim`;
#: a head dim of 40 runs the 64 tile): (br, bc, warps). 160, 192 and 224 as FA2 takes them on
#: sm_80 (192 with 8 warps: 16 rows each keeps the O accumulator in registers).
FA2_TILES: dict[int, tuple[int, int, int]] = {
    32: (128, 128, 4),
    64: (128, 128, 4),
    96: (128, 64, 4),
    128: (128, 64, 4),
    160: (128, 32, 4),
    192: (128, 64, 8),
    224: (128, 32, 4),
    256: (64, 64, 4),
}
#: FlashAttention-2's pipeline depth and shared-memory layout that go with :data:`FA2_TILES`:
#: one K/V stage and a swizzled (XOR) layout, no padding, as FA2's CUTLASS layouts are. On the
#: H200 (2026-11-30 campaign) the swizzled FA2 tile is at least as fast as the padded one in
#: 15 of the 24 problems where both were timed (median 0.3% faster, up to 3%; at worst 0.7%
#: slower), and for causal D=128 the padded one spills 132 B and is 7% slower.
FA2_STAGES = 1
FA2_SWIZZLE = True
#: The hand-written seed kernels' tiles: (br, bc, warps) with these stage counts.
SEED_TILES: tuple[tuple[int, int, int], ...] = (
    (64, 64, 4),
    (64, 64, 8),
    (128, 64, 4),
    (128, 64, 8),
)
SEED_STAGES: tuple[int, ...] = (1, 2)

#: The attention-variant switches this family's kernels are built with (core.variant). A
#: variant config follows the plain space rules: its registers may differ from the plain
#: tile's, and the tuner's ptxas check catches a spill.
VARIANT_SWITCHES: tuple[str, ...] = ("local", "softcap", "sinks")


def estimate_registers(config: Fa2Config) -> int:
    """Rough registers per thread of an instantiation, following the template's arrays.

    Per thread a warp's fp32 accumulators take ``rows_per_warp * (D + bc) / 32`` registers
    (O is rows x D, S is rows x bc, spread over 32 lanes); the running max and sum take 2 each
    per 16-row tile; Q's fragments add ``m_tiles * D / 16 * 4`` when the template keeps them
    in registers (its ``kQInRegs`` rule); :data:`BASE_REGISTERS` covers the rest. It
    undershoots ptxas by a few tens of registers on small tiles and is only used to prune,
    never to rank.

    Args:
        config: the kernel configuration.

    Returns:
        The estimated 32-bit registers per thread.
    """
    rows = config.rows_per_warp
    m_tiles = max(rows // MMA_M, 1)
    accumulators = rows * (config.tile_d + config.bc) // 32
    softmax_state = 4 * m_tiles  # row max and row sum, two rows per lane per m-tile
    q_frag = m_tiles * (config.tile_d // 16) * 4
    q_in_regs = q_frag <= Q_IN_REGS_MAX and accumulators + q_frag <= Q_IN_REGS_MAX_TOTAL
    q_regs = q_frag if q_in_regs else 0
    return accumulators + softmax_state + q_regs + BASE_REGISTERS


def fa2_default_config(d: int, dtype: Dtype, causal: bool) -> Fa2Config:
    """FlashAttention-2's config for a head dim: the fallback for untuned GPUs and shapes.

    Its tile is :data:`FA2_TILES`'s for ``d``'s tile head dim, with :data:`FA2_STAGES` stages
    and the swizzled shared-memory layout (:data:`FA2_SWIZZLE`).

    Raises:
        ValueError: when ``d`` is not a supported head dim.
    """
    if d not in HEAD_DIMS:
        raise ValueError(f"unsupported head dim {d}: not {HEAD_DIMS_RULE}")
    br, bc, warps = FA2_TILES[tile_head_dim(d)]
    return Fa2Config(
        d=d, dtype=dtype, causal=causal, br=br, bc=bc, warps=warps,
        stages=FA2_STAGES, pad=0, swizzle=FA2_SWIZZLE,
    )  # fmt: skip


def is_valid(config: Fa2Config, smem_limit: int = DEFAULT_SMEM_LIMIT) -> tuple[bool, str]:
    """Check one config against the space's rules.

    Args:
        config: the kernel configuration, e.g. parsed from a user-given name.
        smem_limit: dynamic shared memory available per block, in bytes.

    Returns:
        ``(True, "")`` when the config is in the space, else ``(False, reason)`` with a
        sentence that names the broken rule and the offending values.
    """
    c = config
    if c.d not in VALID_HEAD_DIMS:
        return False, f"head dim {c.d} is not {HEAD_DIMS_RULE}"
    variant = variant_reasons(c, VARIANT_SWITCHES)
    if variant:
        return False, "; ".join(variant)
    if c.dtype not in VALID_DTYPES:
        return False, f"dtype {c.dtype!r} is not one of {list(VALID_DTYPES)}"
    if c.warps not in VALID_WARPS:
        return False, f"warps {c.warps} is not one of {list(VALID_WARPS)}"
    if c.br not in VALID_BR:
        return False, f"br {c.br} is not one of {list(VALID_BR)}"
    if c.br % (MMA_M * c.warps) != 0:
        return False, (
            f"br {c.br} is not a multiple of 16 * warps = {MMA_M * c.warps}: "
            "each warp needs whole 16-row mma tiles"
        )
    if c.rows_per_warp not in VALID_ROWS_PER_WARP:
        return False, (
            f"rows per warp br/warps = {c.rows_per_warp} is not one of {list(VALID_ROWS_PER_WARP)}"
        )
    if c.bc not in VALID_BC:
        return False, f"bc {c.bc} is not one of {list(VALID_BC)}"
    if c.bc % MMA_K != 0:
        return False, f"bc {c.bc} is not a multiple of {MMA_K}"
    if c.stages not in VALID_STAGES:
        return False, f"stages {c.stages} is not one of {list(VALID_STAGES)}"
    if c.swizzle and c.pad != 0:
        return False, f"swizzle and pad {c.pad} are alternatives: a swizzled layout has pad 0"
    if c.pad not in VALID_PADS:
        return False, f"pad {c.pad} is not one of {list(VALID_PADS)}"
    if c.swizzle and (c.tile_d // 8) % SWIZZLE_CHUNK_GROUP != 0:
        return False, f"swizzle needs D/8 to be a multiple of {SWIZZLE_CHUNK_GROUP}"
    if c.smem_bytes > smem_limit:
        return False, (
            f"needs {c.smem_bytes} bytes of shared memory (Q {c.br} rows + {c.stages} x 2 x "
            f"{c.bc} K/V rows of {c.smem_row_elems} elements), over the limit of {smem_limit}"
        )
    est = estimate_registers(c)
    if est > MAX_EST_REGISTERS:
        return False, (
            f"estimated {est} registers per thread (rows per warp {c.rows_per_warp}, "
            f"D {c.tile_d} + bc {c.bc} fp32 accumulators), over the budget of {MAX_EST_REGISTERS}"
        )
    return True, ""


def enumerate_space(
    d: int,
    dtype: Dtype = "fp16",
    causal: bool = False,
    smem_limit: int = DEFAULT_SMEM_LIMIT,
    arch: str = "sm_90",
    *,
    varlen: bool = False,
) -> list[Fa2Config]:
    """Every valid config for one head dim, dtype and mask, in a deterministic order.

    Args:
        d: head dimension, one of :data:`VALID_HEAD_DIMS`.
        dtype: ``"fp16"`` or ``"bf16"``.
        causal: causal mask.
        smem_limit: dynamic shared memory per block in bytes; clamped to the architecture's
            opt-in maximum (:data:`ARCH_SMEM_LIMIT`).
        arch: target architecture, one of :data:`SUPPORTED_ARCHS`.
        varlen: the packed-sequence kernels (``_vl``) instead of the dense ones.

    Returns:
        The valid configs sorted by ``Fa2Config`` order (d, dtype, causal, br, bc, warps,
        stages, pad, swizzle), without duplicates.

    Raises:
        ValueError: for an unknown head dim, dtype or architecture.
    """
    check_arch(arch)
    if d not in VALID_HEAD_DIMS:
        raise ValueError(f"head dim {d} is not {HEAD_DIMS_RULE}")
    if dtype not in VALID_DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {list(VALID_DTYPES)}")
    limit = min(smem_limit, ARCH_SMEM_LIMIT[arch])
    candidates = (
        Fa2Config(
            d=d,
            dtype=dtype,
            causal=causal,
            br=br,
            bc=bc,
            warps=warps,
            stages=stages,
            pad=pad,
            swizzle=swizzle,
            varlen=varlen,
        )
        for warps in VALID_WARPS
        for br in VALID_BR
        for bc in VALID_BC
        for stages in VALID_STAGES
        for pad, swizzle in VALID_LAYOUTS
    )
    return _sorted_unique(c for c in candidates if is_valid(c, limit)[0])


def seed_configs(
    d: int, dtype: Dtype = "fp16", causal: bool = False, *, varlen: bool = False
) -> list[Fa2Config]:
    """Known-good starting points: FlashAttention-2's tile and the seed kernels' tiles.

    FA2's config for ``d`` (:func:`fa2_default_config`: 1 stage, swizzled) comes also in the
    padded layout (pad 8); the seed kernels' tiles (:data:`SEED_TILES`) with :data:`SEED_STAGES`
    and pad 8. Configs the space rejects (e.g. 64x64 with 8 warps: 8 rows per warp is less
    than one mma tile) are dropped.

    Args:
        d: head dimension.
        dtype: ``"fp16"`` or ``"bf16"``.
        causal: causal mask.
        varlen: the packed-sequence kernels.

    Returns:
        Valid seed configs, sorted and without duplicates.
    """
    found: list[Fa2Config] = []
    if d in VALID_HEAD_DIMS:
        fa2 = fa2_default_config(d, dtype, causal)
        found += [fa2, replace(fa2, pad=8, swizzle=False)]
    for br, bc, warps in SEED_TILES:
        for stages in SEED_STAGES:
            found.append(Fa2Config(d, dtype, causal, br, bc, warps, stages, pad=8))
    return _sorted_unique(replace(c, varlen=varlen) for c in found if is_valid(c)[0])


def _sorted_unique(configs: Iterable[Fa2Config]) -> list[Fa2Config]:
    return sorted(set(configs))


def layout_text(config: Fa2Config) -> str:
    """The shared-memory layout for people: ``swizzle`` or ``pad <N>``."""
    return "swizzle" if config.swizzle else f"pad {config.pad}"
