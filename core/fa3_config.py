"""The Hopper-native family's config (``fa3``): one instantiation of ``FA3_DEFINE_KERNEL``.

Like :class:`core.fa2_config.Fa2Config` for the mma.sync family, a :class:`Fa3Config` is
frozen, its :attr:`~Fa3Config.name` carries every parameter (it is the extern "C" symbol and
starts with the family, ``fa3_``), and its :attr:`~Fa3Config.key` hashes the name. The space
rules (which configs compile, register budgets) live in :mod:`codegen.families.fa3.space`;
the kernel is codegen/templates/fa3_fwd.cuh and its ABI is in docs/fa3_kernel.md. Its
parameters are declared once (:func:`core.config_common.param`).
"""

from __future__ import annotations

from dataclasses import dataclass

from core.config import ELEMENT_BYTES
from core.config_common import (
    FamilyConfigBase,
    family_config,
    kvcache_switch,
    page_size_param,
    param,
    variant_switch,
)

#: Columns of one 128-byte-swizzled TMA box of 2-byte elements; a tile row of D columns
#: takes ceil(D / 64) boxes (D=96 zero-fills half of its second box).
BOX_COLS = 64
#: Rows of query one consumer warpgroup owns (the M of wgmma.m64nNk16).
WARPGROUP_ROWS = 64


@family_config("fa3", example="fa3_d128_fp16_full_m128_n128_s2_rs_ov_pp_r240")
@dataclass(frozen=True, order=True)
class Fa3Config(FamilyConfigBase):
    """Compile-time parameters of one Hopper (sm_90a) FA forward kernel.

    After the common ``d``, ``dtype`` and ``causal`` (see ``FamilyConfigBase``):

    Attributes:
        block_m: query rows per block; one consumer warpgroup per 64 rows.
        block_n: keys per K/V tile (the N of the Q·Kᵀ wgmma).
        stages: depth of the K/V shared-memory ring the producer fills with TMA.
        pv_regs: the P operand of P·V from registers (RS) rather than shared memory (SS).
        overlap: intra-warpgroup overlap: the next tile's Q·Kᵀ is issued before this
            tile's softmax.
        pingpong: the two consumer warpgroups take turns on the tensor cores (named
            barriers), so one's softmax overlaps the other's GEMMs; needs block_m = 128.
        consumer_regs: registers per consumer thread after ``setmaxnreg.inc`` (the
            producer gives its surplus back); unused with one consumer warpgroup.
        varlen: takes packed variable-length sequences (cumulative offsets, a second kernel
            argument before the descriptors) instead of a dense batch; name suffix ``_vl``.
        longest_first: causal blocks start longest first across heads (over chunks of heads
            whose K/V fit in L2) rather than within each head; dense causal configs only;
            name suffix ``_lf`` (codegen/templates/fa3_fwd.cuh, "Launch order").
        local, softcap, sinks: attention-variant switches
            (:func:`~core.config_common.variant_switch`, semantics in :mod:`core.variant`).
        kvcache: a KV-cache kernel (``_kvc``): dense queries over keys read from a cache,
            each sequence's length on the device (:func:`~core.config_common.kvcache_switch`;
            codegen/templates/fa3_fwd.cuh, "KV caches").
        page: the cache's page size (``_pg<P>``, a power of two), 0 for a contiguous cache.
    """

    block_m: int = param("m{}", default=128, search="fa3_block_m")
    block_n: int = param("n{}", default=128, search="fa3_block_n")
    stages: int = param("s{}", default=2, search="fa3_stages")
    pv_regs: bool = param("rs|ss", default=True, search="fa3_pv")
    overlap: bool = param("ov", default=True, search="fa3_overlap")
    pingpong: bool = param("pp", default=True, search="fa3_pingpong")
    consumer_regs: int = param("r{}", default=240, search="fa3_regs")
    varlen: bool = param(
        "vl", default=False, optional=True, suffix=True, macro="FA3_DEFINE_VARLEN_KERNEL"
    )
    longest_first: bool = param(
        "lf", default=False, optional=True, macro="FA3_DEFINE_LONGEST_FIRST_KERNEL",
        search="fa3_order", search_as=("longest_first", "per_head"),
    )  # fmt: skip
    local: bool = variant_switch("local")
    softcap: bool = variant_switch("softcap")
    sinks: bool = variant_switch("sinks")
    kvcache: bool = kvcache_switch()
    page: int = page_size_param()

    @property
    def kv_box_rows(self) -> int:
        """Rows of one K/V TMA box (the traits' ``kKVBoxRows``): a tile's, or a page's where
        a page holds less than a tile (a cache kernel then loads a tile in several boxes)."""
        return self.page if 0 < self.page < self.block_n else self.block_n

    @property
    def consumer_warpgroups(self) -> int:
        return self.block_m // WARPGROUP_ROWS

    @property
    def threads(self) -> int:
        """One producer warpgroup plus the consumers, 128 threads each."""
        return (self.consumer_warpgroups + 1) * 128

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory: the traits' ``kSmemBytes`` (a compile test checks both agree).

        1 KB of alignment slack (128-byte swizzled tiles sit on 1 KB boundaries), Q and
        ``stages`` K and V tiles of ceil(D/64) boxes of 128-byte rows, P per consumer
        warpgroup when it goes through shared memory (SS), and 256 bytes of mbarriers.
        """
        boxes = -(-self.d // BOX_COLS)
        row_bytes = BOX_COLS * ELEMENT_BYTES
        tiles = row_bytes * boxes * (self.block_m + 2 * self.stages * self.block_n)
        p_boxes = -(-self.block_n // BOX_COLS)
        p_bytes = 0 if self.pv_regs else self.consumer_warpgroups * p_boxes * 8192
        return 1024 + tiles + p_bytes + 256

    @property
    def tile(self) -> str:
        """Short tile description, e.g. ``128x128/2wg``."""
        return f"{self.block_m}x{self.block_n}/{self.consumer_warpgroups}wg"

    def describe(self) -> str:
        """One line for people: tile, stages and the switches."""
        switches = [
            "P in registers" if self.pv_regs else "P in smem",
            "overlap" if self.overlap else "no overlap",
            "ping-pong" if self.pingpong else "no ping-pong",
        ]
        if self.varlen:
            switches.append("packed sequences")
        if self.longest_first:
            switches.append("longest first across heads")
        return f"{self.tile}, {self.stages} stages, {', '.join(switches)}"
