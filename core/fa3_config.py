"""The Hopper-native family's config (``fa3``): one instantiation of ``FA3_DEFINE_KERNEL``.

Like :class:`core.config.Fa2Config` for the mma.sync family, a :class:`Fa3Config` is
frozen, its :attr:`~Fa3Config.name` carries every parameter (it is the extern "C" symbol and
starts with the family, ``fa3_``), and its :attr:`~Fa3Config.key` hashes the name. The space
rules (which configs compile, register budgets) live in :mod:`codegen.fa3_space`; the kernel
is codegen/templates/fa3_fwd.cuh and its ABI is in docs/fa3_kernel.md.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from core.config import ELEMENT_BYTES, Dtype
from core.config_common import int_value, name_key

#: Columns of one 128-byte-swizzled TMA box of 2-byte elements; a tile row of D columns
#: takes ceil(D / 64) boxes (D=96 zero-fills half of its second box).
BOX_COLS = 64
#: Rows of query one consumer warpgroup owns (the M of wgmma.m64nNk16).
WARPGROUP_ROWS = 64

_NAME_RE = re.compile(
    r"^fa3_d(?P<d>\d+)_(?P<dtype>fp16|bf16)_(?P<causal>causal|full)"
    r"_m(?P<block_m>\d+)_n(?P<block_n>\d+)_s(?P<stages>\d+)"
    r"_(?P<pv>rs|ss)(?P<ov>_ov)?(?P<pp>_pp)?_r(?P<regs>\d+)(?P<lf>_lf)?(?P<vl>_vl)?$"
)


@dataclass(frozen=True, order=True)
class Fa3Config:
    """Compile-time parameters of one Hopper (sm_90a) FA forward kernel.

    Attributes:
        d: head dimension.
        dtype: element type of Q, K, V and O.
        causal: bottom-right aligned causal mask.
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
    """

    family: ClassVar[str] = "fa3"
    #: Parameters :meth:`params` leaves out at their default (added after results were
    #: stored; a dense config's stored parameters and name stay what they were).
    optional_params: ClassVar[frozenset[str]] = frozenset({"varlen", "longest_first"})

    d: int
    dtype: Dtype
    causal: bool
    block_m: int = 128
    block_n: int = 128
    stages: int = 2
    pv_regs: bool = True
    overlap: bool = True
    pingpong: bool = True
    consumer_regs: int = 240
    varlen: bool = False
    longest_first: bool = False

    @property
    def name(self) -> str:
        """Readable identifier, also the kernel's extern "C" symbol."""
        mask = "causal" if self.causal else "full"
        flags = ("rs" if self.pv_regs else "ss") + ("_ov" if self.overlap else "")
        flags += "_pp" if self.pingpong else ""
        tail = ("_lf" if self.longest_first else "") + ("_vl" if self.varlen else "")
        return (
            f"fa3_d{self.d}_{self.dtype}_{mask}_m{self.block_m}_n{self.block_n}"
            f"_s{self.stages}_{flags}_r{self.consumer_regs}{tail}"
        )

    @property
    def key(self) -> str:
        """Stable 16-hex-digit key derived from the name."""
        return name_key(self.name)

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

    def params(self) -> dict[str, Any]:
        """The family's own parameters: every field but ``d``, ``dtype`` and ``causal``
        (the :attr:`optional_params` only when set)."""
        own = {k: v for k, v in asdict(self).items() if k not in ("d", "dtype", "causal")}
        for name in self.optional_params:
            if not own[name]:
                del own[name]
        return own

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Fa3Config:
        def num(key: str) -> int:
            return int_value(data, key)

        return cls(
            d=num("d"),
            dtype=str(data["dtype"]),  # type: ignore[arg-type]
            causal=bool(data["causal"]),
            block_m=num("block_m"),
            block_n=num("block_n"),
            stages=num("stages"),
            pv_regs=bool(data["pv_regs"]),
            overlap=bool(data["overlap"]),
            pingpong=bool(data["pingpong"]),
            consumer_regs=num("consumer_regs"),
            varlen=bool(data.get("varlen", False)),
            longest_first=bool(data.get("longest_first", False)),
        )

    @classmethod
    def from_name(cls, name: str) -> Fa3Config:
        """Parse a name produced by :attr:`name`.

        Raises:
            ValueError: when ``name`` is not an fa3 config name.
        """
        m = _NAME_RE.match(name)
        if m is None:
            raise ValueError(
                f"not a kernel config name: {name!r} "
                "(expected e.g. fa3_d128_fp16_full_m128_n128_s2_rs_ov_pp_r240)"
            )
        return cls(
            d=int(m["d"]),
            dtype=m["dtype"],  # type: ignore[arg-type]
            causal=m["causal"] == "causal",
            block_m=int(m["block_m"]),
            block_n=int(m["block_n"]),
            stages=int(m["stages"]),
            pv_regs=m["pv"] == "rs",
            overlap=m["ov"] is not None,
            pingpong=m["pp"] is not None,
            consumer_regs=int(m["regs"]),
            varlen=m["vl"] is not None,
            longest_first=m["lf"] is not None,
        )
