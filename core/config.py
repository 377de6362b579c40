"""The kernel configuration: one point of the template's compile-time parameter space.

A :class:`Fa2Config` is frozen, has a readable :attr:`~Fa2Config.name` that carries every
parameter (it is also the extern "C" kernel symbol and the build directory name) and a stable
:attr:`~Fa2Config.key` (short hash of the name) for caches and the database.

Part of the shared floor (:mod:`core`), with the element types and head dims every stage
agrees on.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Literal

from core.config_common import name_key

Dtype = Literal["fp16", "bf16"]
DTYPES: tuple[Dtype, ...] = ("fp16", "bf16")
#: Every head dim the product takes: multiples of 8 up to 256 (40, 80, 160 and 192 are in
#: widely used models). The fa2 template rounds its tile up to a multiple of 32
#: (:attr:`Fa2Config.tile_d`) and masks the extra columns, as FlashAttention-2 does.
HEAD_DIMS: tuple[int, ...] = tuple(range(8, 257, 8))
#: The head dims headers export default kernels for when none are asked for (FlashAttention-2's
#: own instantiations; other dims come with their tuned results or when asked for).
COMMON_HEAD_DIMS: tuple[int, ...] = (32, 64, 96, 128, 256)
#: :data:`HEAD_DIMS` in words, for messages ("head dim 12 is not a multiple of 8 from 8 to 256").
HEAD_DIMS_RULE = "a multiple of 8 from 8 to 256"
#: The granule the fa2 tile's head dim is rounded up to (the swizzle's 4 chunks of 8 halfs).
TILE_D_GRANULE = 32


def tile_head_dim(d: int) -> int:
    """The head dim of the kernel's tile for tensors of head dim ``d``: ``d`` rounded up to a
    multiple of :data:`TILE_D_GRANULE` (40 -> 64, 80 -> 96, 128 -> 128)."""
    return -(-d // TILE_D_GRANULE) * TILE_D_GRANULE


ELEMENT_BYTES = 2  # fp16 and bf16

_NAME_RE = re.compile(
    r"^fa2_d(?P<d>\d+)_(?P<dtype>fp16|bf16)_(?P<causal>causal|full)"
    r"_br(?P<br>\d+)_bc(?P<bc>\d+)_w(?P<warps>\d+)_s(?P<stages>\d+)"
    r"_(?:pad(?P<pad>\d+)|(?P<swz>swz))(?P<vl>_vl)?$"
)


@dataclass(frozen=True, order=True)
class Fa2Config:
    """Compile-time parameters of one FA2 forward kernel instantiation.

    Attributes:
        d: head dimension.
        dtype: element type of Q, K, V and O.
        causal: bottom-right aligned causal mask.
        br: query rows per thread block (block_m).
        bc: key/value rows per pipeline tile (block_n).
        warps: warps per block; each warp owns ``br // warps`` query rows (split-Q).
        stages: K/V shared-memory buffers each (1 = load next tile while computing this one).
        pad: halfs of padding per shared-memory row (0, 8 or 16); 0 when ``swizzle``.
        swizzle: XOR-swizzled shared-memory layout instead of padding.
        varlen: takes packed variable-length sequences (cumulative offsets, a second kernel
            argument) instead of a dense batch; name suffix ``_vl``.
    """

    #: The kernel family this config type belongs to (the name's prefix; see core.family).
    family: ClassVar[str] = "fa2"
    #: Parameters :meth:`params` leaves out at their default (added after results were
    #: stored; a dense config's stored parameters stay what they were).
    optional_params: ClassVar[frozenset[str]] = frozenset({"varlen"})

    d: int
    dtype: Dtype
    causal: bool
    br: int
    bc: int
    warps: int
    stages: int
    pad: int = 0
    swizzle: bool = False
    varlen: bool = False

    @property
    def name(self) -> str:
        """Readable identifier, also the kernel's extern "C" symbol."""
        layout = "swz" if self.swizzle else f"pad{self.pad}"
        mask = "causal" if self.causal else "full"
        tail = "_vl" if self.varlen else ""
        return (
            f"fa2_d{self.d}_{self.dtype}_{mask}_br{self.br}_bc{self.bc}"
            f"_w{self.warps}_s{self.stages}_{layout}{tail}"
        )

    @property
    def key(self) -> str:
        """Stable 16-hex-digit key derived from the name."""
        return name_key(self.name)

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

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def params(self) -> dict[str, Any]:
        """The family's own parameters: every field but ``d``, ``dtype`` and ``causal``
        (``varlen`` only when set, see :attr:`optional_params`)."""
        own = {k: v for k, v in asdict(self).items() if k not in ("d", "dtype", "causal")}
        if not self.varlen:
            del own["varlen"]
        return own

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Fa2Config:
        return cls(
            d=int(data["d"]),  # type: ignore[call-overload]
            dtype=str(data["dtype"]),  # type: ignore[arg-type]
            causal=bool(data["causal"]),
            br=int(data["br"]),  # type: ignore[call-overload]
            bc=int(data["bc"]),  # type: ignore[call-overload]
            warps=int(data["warps"]),  # type: ignore[call-overload]
            stages=int(data["stages"]),  # type: ignore[call-overload]
            pad=int(data.get("pad", 0)),  # type: ignore[call-overload]
            swizzle=bool(data.get("swizzle", False)),
            varlen=bool(data.get("varlen", False)),
        )

    @classmethod
    def from_name(cls, name: str) -> Fa2Config:
        """Parse a name produced by :attr:`name`.

        Raises:
            ValueError: when ``name`` is not a config name.
        """
        m = _NAME_RE.match(name)
        if m is None:
            raise ValueError(
                f"not a kernel config name: {name!r} "
                "(expected e.g. fa2_d128_fp16_full_br128_bc64_w4_s1_pad8)"
            )
        return cls(
            d=int(m["d"]),
            dtype=m["dtype"],  # type: ignore[arg-type]
            causal=m["causal"] == "causal",
            br=int(m["br"]),
            bc=int(m["bc"]),
            warps=int(m["warps"]),
            stages=int(m["stages"]),
            pad=int(m["pad"] or 0),
            swizzle=m["swz"] is not None,
            varlen=m["vl"] is not None,
        )
