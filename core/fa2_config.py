"""The fa2 family's config: one instantiation of ``FA2_DEFINE_KERNEL`` (mma.sync template).

A :class:`Fa2Config` is frozen, has a readable :attr:`~Fa2Config.name` that carries every
parameter (it is also the extern "C" kernel symbol and the build directory name) and a stable
:attr:`~Fa2Config.key` (short hash of the name) for caches and the database. Its parameters
are declared once (:func:`core.config_common.param`); name, parsing, dict form, stored and
search parameters are derived from the declarations.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.config import ELEMENT_BYTES, tile_head_dim
from core.config_common import FamilyConfigBase, family_config, param, variant_switch


def _layout(config: Fa2Config) -> str:
    return "swz" if config.swizzle else f"pad{config.pad}"


# strict_ints=False: its dict form has always taken int()'s wider input; flat_params: its
# parameters were answers' top-level fields before there were other families.
@family_config(
    "fa2", example="fa2_d128_fp16_full_br128_bc64_w4_s1_pad8", strict_ints=False, flat_params=True
)
@dataclass(frozen=True, order=True)
class Fa2Config(FamilyConfigBase):
    """Compile-time parameters of one FA2 forward kernel instantiation.

    After the common ``d``, ``dtype`` and ``causal`` (see ``FamilyConfigBase``):

    Attributes:
        br: query rows per thread block (block_m).
        bc: key/value rows per pipeline tile (block_n).
        warps: warps per block; each warp owns ``br // warps`` query rows (split-Q).
        stages: K/V shared-memory buffers each (1 = load next tile while computing this one).
        pad: halfs of padding per shared-memory row (0, 8 or 16); 0 when ``swizzle``.
        swizzle: XOR-swizzled shared-memory layout instead of padding.
        varlen: takes packed variable-length sequences (cumulative offsets, a second kernel
            argument) instead of a dense batch; name suffix ``_vl``.
        local, softcap, sinks: attention-variant switches (:func:`variant_switch`, semantics
            in :mod:`core.variant`); name suffixes ``_loc``, ``_cap``, ``_snk``.
    """

    br: int = param("br{}", search="br")
    bc: int = param("bc{}", search="bc")
    #: The search draws rows per warp (16 or 32) rather than warps (see tuner.space).
    warps: int = param("w{}", search="rows_per_warp", search_as=lambda c: c.rows_per_warp)
    stages: int = param("s{}", search="stages")
    pad: int = param(
        "pad{}", default=0, missing_ok=True, search="layout", search_as=_layout,
        search_order=("pad0", "pad8", "pad16", "swz"),
    )  # fmt: skip
    swizzle: bool = param("swz", default=False, missing_ok=True, instead_of="pad")
    varlen: bool = param(
        "vl", default=False, optional=True, suffix=True, macro="FA2_DEFINE_VARLEN_KERNEL"
    )
    local: bool = variant_switch("local")
    softcap: bool = variant_switch("softcap")
    sinks: bool = variant_switch("sinks")

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def rows_per_warp(self) -> int:
        return self.br // self.warps

    @property
    def tile_d(self) -> int:
        """The head dim of the kernel's tiles (:func:`tile_head_dim`)."""
        return tile_head_dim(self.d)

    @property
    def smem_row_elems(self) -> int:
        """Elements per shared-memory row (the tile's head dim plus padding)."""
        return self.tile_d + self.pad

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory: the Q tile plus ``stages`` K and V tiles each."""
        rows = self.br + 2 * self.stages * self.bc
        return rows * self.smem_row_elems * ELEMENT_BYTES

    @property
    def tile(self) -> str:
        """Short tile description, e.g. ``128x64/4w``."""
        return f"{self.br}x{self.bc}/{self.warps}w"

    def describe(self) -> str:
        """One line for people: tile, stages and shared-memory layout."""
        layout = "swizzle" if self.swizzle else f"pad {self.pad}"
        packed = ", packed sequences" if self.varlen else ""
        return f"{self.tile}, {self.stages} stage(s), {layout}{packed}"
