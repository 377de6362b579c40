"""What every family's config agrees on: element types, head dims, element bytes.

Part of the shared floor (:mod:`core`). Each family's config type is in its own module
(:mod:`core.fa2_config`, :mod:`core.fa3_config`, :mod:`core.splitkv_config`), declared with
:mod:`core.config_common`; :mod:`core.family` maps names to them.
"""

from __future__ import annotations

from typing import Literal

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
