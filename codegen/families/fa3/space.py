"""The Hopper family's space: which :class:`~core.fa3_config.Fa3Config` values are valid.

The rules restate the ``static_assert``\\s of ``fa3::Traits`` (codegen/templates/fa3_fwd.cuh)
so that every config the space yields compiles: shared memory within the 227 KB a block may
opt into, the register split that ``setmaxnreg`` can make (the launch bound gives every
thread ``65536 / threads`` registers; consumers take ``consumer_regs``, the producer keeps
the rest, at least 24), and the fp32 accumulators a consumer thread keeps live (S, O and,
with overlap in registers, the next tile's packed P) with headroom for addresses and softmax
state. ptxas still has the last word: spills are measured per build like the other family's.

Enumerated values (issue 12's space): block_m 64/128/192 (one consumer warpgroup per 64 rows),
block_n 64..192 in steps of 16, 2-4 stages, P·V from registers or shared memory, overlap and
ping-pong on or off (ping-pong only with two consumer warpgroups), and the consumer register
counts that fill the register file for each warpgroup count. Causal dense configs come in
both launch orders (``longest_first``, the ``_lf`` twins).
"""

from __future__ import annotations

from dataclasses import replace

from codegen.families.declared import basic_reasons, outside, variant_reasons
from codegen.families.splitkv.space import MAX_PAGE_SIZE
from core.config import Dtype
from core.fa3_config import Fa3Config

#: Head dims with verified instantiations on the H200. D must be a multiple of 64 for whole
#: 128-byte TMA boxes; 96 works by zero-filling half of the second box. 32 (one 64-byte box)
#: would need another swizzle mode and descriptors; 192 passes the rules but is not verified.
HEAD_DIMS: tuple[int, ...] = (64, 96, 128, 256)
BLOCK_M: tuple[int, ...] = (64, 128, 192)
BLOCK_N: tuple[int, ...] = tuple(range(64, 193, 16))
STAGES: tuple[int, ...] = (2, 3, 4)
#: Consumer registers by consumer warpgroups: 2 -> 240 (producer keeps 24) or 232 (40);
#: 3 -> 160 (producer 32). With one consumer warpgroup there is no split (the value is unused
#: and fixed so that equal kernels have equal names).
CONSUMER_REGS: dict[int, tuple[int, ...]] = {1: (240,), 2: (240, 232), 3: (160,)}

ARCH = "sm_90a"  # wgmma and setmaxnreg are sm_90a features
MAX_SMEM_PER_BLOCK = 227 * 1024
REGS_PER_SM = 65536
REG_HEADROOM = 32  # addresses, loop state, softmax row max/sum beside the accumulators
MAX_REGS = 255

#: The attention-variant switches this family's kernels are built with (core.variant).
#: Every one, alone or together, dense or varlen, in either launch order (a causal config's
#: longest-first twin with softcap or sinks still has unequal blocks; with a window the
#: blocks are near equal, and the order is left to the search like any other choice).
VARIANT_SWITCHES: tuple[str, ...] = ("local", "softcap", "sinks")


def launch_regs(config: Fa3Config) -> int:
    """Registers per thread that the launch bound ``(threads, 1)`` gives (multiple of 8)."""
    per = REGS_PER_SM // config.threads
    return 248 if per > MAX_REGS else per & ~7


def producer_regs(config: Fa3Config) -> int:
    """Registers the producer warpgroup keeps after ``setmaxnreg.dec`` (at most 56)."""
    consumers = config.consumer_warpgroups * 128 * config.consumer_regs
    return min(56, ((config.threads * launch_regs(config) - consumers) // 128) & ~7)


def accumulator_regs(config: Fa3Config) -> int:
    """fp32 registers a consumer thread keeps live: S, O and with RS overlap the packed P."""
    extra = config.block_n // 4 if (config.overlap and config.pv_regs) else 0
    return config.block_n // 2 + config.d // 2 + extra


def cache_reasons(config: Fa3Config) -> list[str]:
    """Why ``config``'s KV-cache parameters are outside the space (fa3_fwd.cuh's "KV caches"):
    a page size without the switch, or not a power of two up to :data:`MAX_PAGE_SIZE`; a
    cache kernel that is varlen or longest-first; pages that neither hold whole key tiles nor
    whole 8-row swizzle atoms of one (the K/V boxes load a tile page by page then)."""
    c, p = config, config.page
    why: list[str] = []
    if p and not c.kvcache:
        why.append(f"page size {p} is set without the kvcache switch")
    if not c.kvcache:
        return why
    if p < 0 or p > MAX_PAGE_SIZE or p & (p - 1):
        why.append(f"page size {p} is not a power of two up to {MAX_PAGE_SIZE}")
    elif p and p % c.block_n and (c.block_n % p or p < 8):
        why.append(f"pages of {p} keys neither hold whole {c.block_n}-key tiles nor tile them "
                   "in 8-row steps")  # fmt: skip
    if c.varlen or c.longest_first:
        why.append("a KV-cache kernel is dense and in tile order (no _vl, no _lf)")
    return why


def invalid_reasons(config: Fa3Config) -> list[str]:
    """Why ``config`` is outside the space; empty when it is valid."""
    c = config
    why = basic_reasons(c, HEAD_DIMS) + outside(c, block_m=BLOCK_M)
    why += variant_reasons(c, VARIANT_SWITCHES)
    if c.block_n not in BLOCK_N:
        why.append(f"block_n {c.block_n} is not a multiple of 16 in 64..192")
    why += outside(c, stages=STAGES)
    if c.longest_first and not c.causal:
        why.append("longest-first order is for causal configs (full blocks do equal work)")
    if c.longest_first and c.varlen:
        why.append("longest-first order is for dense configs (a varlen grid is per sequence)")
    why += cache_reasons(c)
    if c.pingpong and c.consumer_warpgroups != 2:
        why.append("ping-pong needs exactly 2 consumer warpgroups (block_m = 128)")
    if c.smem_bytes > MAX_SMEM_PER_BLOCK:
        why.append(f"needs {c.smem_bytes} bytes of shared memory, over {MAX_SMEM_PER_BLOCK}")
    allowed = CONSUMER_REGS.get(c.consumer_warpgroups, ())
    if c.consumer_regs not in allowed:
        why.append(f"consumer_regs {c.consumer_regs} is not one of {list(allowed)}")
    split = c.consumer_warpgroups > 1
    if split and producer_regs(c) < 24:
        why.append("the register split leaves the producer fewer than 24 registers")
    budget = c.consumer_regs if split else MAX_REGS
    if accumulator_regs(c) + REG_HEADROOM > budget:
        why.append(
            f"{accumulator_regs(c)} accumulator registers + {REG_HEADROOM} headroom exceed "
            f"the {budget} a consumer thread has"
        )
    return why


def is_valid(config: Fa3Config) -> tuple[bool, str]:
    """``(True, "")`` for a config in the space, else ``(False, reasons)``."""
    why = invalid_reasons(config)
    return (not why, "; ".join(why))


def enumerate_space(
    d: int, dtype: Dtype = "fp16", causal: bool = False, *, varlen: bool = False
) -> list[Fa3Config]:
    """Every valid config for one head dim, dtype and mask, sorted, without duplicates.

    With ``varlen``, the packed-sequence twins (``_vl``) of the same configs: the varlen
    kernel has the dense one's tiles, shared memory and register budget, so the rules are
    the same. Dense causal spaces also hold every config's longest-first twin (``_lf``).

    Raises:
        ValueError: for a head dim outside :data:`HEAD_DIMS`.
    """
    if d not in HEAD_DIMS:
        raise ValueError(f"head dim {d} is not one of {list(HEAD_DIMS)} for the fa3 family")
    candidates = (
        Fa3Config(d, dtype, causal, bm, bn, st, pv, ov, pp, regs)
        for bm in BLOCK_M
        for bn in BLOCK_N
        for st in STAGES
        for pv in (True, False)
        for ov in (True, False)
        for pp in (True, False)
        for regs in CONSUMER_REGS[bm // 64]
    )
    if varlen:
        candidates = (replace(c, varlen=True) for c in candidates)
    elif causal:
        candidates = (replace(c, longest_first=lf) for c in candidates for lf in (False, True))
    return sorted({c for c in candidates if not invalid_reasons(c)})


def default_config(d: int, dtype: Dtype, causal: bool) -> Fa3Config:
    """FlashAttention-3's choice for the head dim where the space has it, else the nearest.

    D <= 64: 192 x 128 (FA3's non-causal 192 x 192 does not fit this template's register
    budget), D = 96 and 128: 128 x 128 with P in registers, overlap and ping-pong; D = 256:
    128 x 80.

    Raises:
        ValueError: for a head dim outside :data:`HEAD_DIMS`.
    """
    if d not in HEAD_DIMS:
        raise ValueError(f"head dim {d} is not one of {list(HEAD_DIMS)} for the fa3 family")
    if d == 64:
        return Fa3Config(d, dtype, causal, 192, 128, 2, False, True, False, 160)
    if d == 256:
        return Fa3Config(d, dtype, causal, 128, 80, 2, True, True, True, 240)
    return Fa3Config(d, dtype, causal, 128, 128, 2, True, True, True, 240)


def seed_configs(
    d: int, dtype: Dtype = "fp16", causal: bool = False, *, varlen: bool = False
) -> list[Fa3Config]:
    """Known-good starting points: FA3's tiles for the head dim and those measured best on
    the H200 while the template was written (docs/fa3_kernel.md); with ``varlen``, their
    packed-sequence twins."""
    base = default_config(d, dtype, causal)
    found = [base]
    if d in (96, 128):
        found += [replace(base, block_n=n) for n in (176, 192)]
        found.append(replace(base, block_m=192, pv_regs=False, pingpong=False, consumer_regs=160))
    if d == 64:
        found += [
            replace(base, block_m=128, pingpong=True, pv_regs=True, consumer_regs=240, block_n=n)
            for n in (128, 192)
        ]
    if d == 256:
        found.append(replace(base, block_n=64, pv_regs=False))
    if causal and not varlen:  # the default in both launch orders (faster at long N)
        found.append(replace(base, longest_first=True))
    return sorted({replace(c, varlen=varlen) for c in found if not invalid_reasons(c)})
