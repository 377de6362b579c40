"""The split-KV (decode) family's config: one instantiation of ``SPLITKV_DEFINE_KERNEL``.

Like the other families' configs, a :class:`SplitKvConfig` is frozen, its
:attr:`~SplitKvConfig.name` carries every parameter (it is the extern "C" symbol and starts
with the family, ``splitkv_``) and its :attr:`~SplitKvConfig.key` hashes the name. The space
rules live in :mod:`codegen.families.splitkv.space`; the kernel is codegen/templates/splitkv_fwd.cuh
and docs/splitkv_kernel.md describes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.config import ELEMENT_BYTES, tile_head_dim
from core.config_common import (
    FamilyConfigBase,
    family_config,
    kvcache_switch,
    page_size_param,
    param,
    variant_switch,
)

#: Bytes of float32.
_F32 = 4


@family_config("splitkv", example="splitkv_d128_fp16_full_r16_n32_w4_s2_k16")
@dataclass(frozen=True, order=True)
class SplitKvConfig(FamilyConfigBase):
    """Compile-time parameters of one split-KV forward kernel.

    After the common ``d``, ``dtype`` and ``causal`` (see ``FamilyConfigBase``):

    Attributes:
        d: head dimension of the tensors (any multiple of 8 up to 256); the kernel's tiles
            use :attr:`tile_d`, ``d`` rounded up to a multiple of 32.
        rows: packed query rows per block: the query heads of one GQA group times their
            query rows (16, 32 or 64).
        block_n: keys per warp tile.
        warps: warps per block; each streams its own key tiles.
        stages: depth of each warp's cp.async K/V ring.
        splits: most blocks that share one row tile's keys (a launch uses fewer when there
            are fewer key tiles); their partial results are merged by the last to finish.
        local, softcap, sinks: attention-variant switches
            (:func:`~core.config_common.variant_switch`, semantics in :mod:`core.variant`).
        kvcache: a KV-cache kernel (``_kvc``): lengths on the device, K/V from a cache
            (:func:`~core.config_common.kvcache_switch`; docs/splitkv_kernel.md).
        page: the cache's page size (``_pg<P>``, a power of two), 0 for a contiguous cache.
        cap_split: a cache kernel whose splits divide the cache's capacity rather than each
            sequence's length (``_cs``): a short sequence then runs on its first few splits
            and the rest see no key, so in a batch of mixed lengths the blocks go to the long
            sequences. Searched on cache problems (:func:`core.family.cache_twins`); a
            window keeps its own division, so never with ``local``.
    """

    rows: int = param("r{}", default=16, search="skv_rows")
    block_n: int = param("n{}", default=32, search="skv_block_n")
    warps: int = param("w{}", default=4, search="skv_warps")
    stages: int = param("s{}", default=2, search="skv_stages")
    splits: int = param("k{}", default=16, search="skv_splits")
    local: bool = variant_switch("local")
    softcap: bool = variant_switch("softcap")
    sinks: bool = variant_switch("sinks")
    kvcache: bool = kvcache_switch()
    page: int = page_size_param()
    cap_split: bool = param(
        "cs", default=False, optional=True, suffix=True, cache=True, search="skv_span",
        search_as=("capacity", "length"),
    )  # fmt: skip

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def tile_d(self) -> int:
        """The head dim of the kernel's tiles (``Traits::D``): :attr:`d` rounded up to a
        multiple of 32 (:func:`core.config.tile_head_dim`; 40 -> 64, 200 -> 224)."""
        return tile_head_dim(self.d)

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory: the traits' ``kSmemBytes`` (a compile test checks both agree).

        The Q tile, then an area that holds every warp's K/V ring during the loop and every
        warp's float32 O while the warps merge, then the per-warp and merged row statistics;
        rows of :attr:`tile_d` elements.
        """
        d = self.tile_d
        q = self.rows * d * ELEMENT_BYTES
        rings = self.warps * self.stages * 2 * self.block_n * d * ELEMENT_BYTES
        merge = self.warps * self.rows * d * _F32
        stats = (2 * self.warps + 2) * self.rows * _F32
        return q + max(rings, merge) + stats

    def splits_for(self, nk: int) -> int:
        """Blocks per row tile a launch on ``nk`` keys uses: never more than its key tiles."""
        tiles = -(-nk // self.block_n)
        return max(1, min(self.splits, tiles))

    def workspace_bytes(self, nq: int, heads: int, kv_heads: int, batch: int, nk: int) -> int:
        """Float32 workspace a launch needs (partial O and LSE, a counter per row tile).

        Partial O rows are :attr:`d` floats (the head dim, not :attr:`tile_d`), as in
        splitkv_fwd.cuh's ``workspace_bytes`` and splitkv_launch.cuh's layout.
        """
        splits = self.splits_for(nk)
        if splits == 1:
            return 0
        tiles = -(-(heads // kv_heads) * nq // self.rows) * kv_heads * batch
        return tiles * splits * self.rows * (self.d + 1) * _F32 + tiles * _F32

    @property
    def tile(self) -> str:
        return f"{self.rows}x{self.block_n}/{self.warps}w"

    def describe(self) -> str:
        """One line for people."""
        span = ", splits over the capacity" if self.cap_split else ""
        return (
            f"{self.rows} packed rows, {self.warps} warps x {self.block_n} keys, "
            f"{self.stages} stages, up to {self.splits} splits{span}"
        )
