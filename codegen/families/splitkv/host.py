"""Workspace for the split-KV family's launches (the ``splitkv`` family's ``host_prep``).

A splitkv kernel (codegen/templates/splitkv_fwd.cuh) takes, after its
:class:`~measure.params.FaParams`, three pointers: float32 partial O (``d`` floats a row:
the head dim, not the kernel's tile D) and LSE per (row tile, split), and one int counter per
row tile that the last block of a row tile resets to zero.
The partials are poisoned with NaN, so a merge that read a partial no block wrote shows up as
a wrong result; the counters start at zero and stay zero between launches.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

from core.family import AnyConfig
from core.shape import Shape
from core.splitkv_config import SplitKvConfig

if TYPE_CHECKING:
    import torch


class DevicePointer(ctypes.c_void_p):
    """A pointer kernel argument that keeps the tensor it points into alive."""

    owner: object


def _pointer(t: torch.Tensor) -> DevicePointer:
    ptr = DevicePointer(t.data_ptr())
    ptr.owner = t
    return ptr


def splitkv_workspace(
    config: AnyConfig,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: str,
) -> tuple[DevicePointer, DevicePointer, DevicePointer]:
    """The splitkv family's ``host_prep``: ``(ws_o, ws_lse, ws_count)`` for one launch shape.

    The signature every family's ``host_prep`` has (see :func:`measure.loader.extra_args`).
    The buffers live as long as the returned values; a launcher bound to them may be called
    any number of times on one stream (the counters reset themselves).

    Raises:
        TypeError: ``config`` is not a splitkv config.
    """
    import torch

    if not isinstance(config, SplitKvConfig):
        raise TypeError(f"splitkv_workspace takes a splitkv config, got {config.name}")
    if layout == "bnhd":
        batch, nq, heads, _ = (int(x) for x in q.shape)
        nk, kv_heads = int(k.shape[1]), int(k.shape[2])
    else:
        batch, heads, nq, _ = (int(x) for x in q.shape)
        kv_heads, nk = int(k.shape[1]), int(k.shape[2])
    splits = config.splits_for(nk)
    tiles = -(-(heads // kv_heads) * nq // config.rows) * kv_heads * batch
    partial = tiles * splits * config.rows if splits > 1 else 1  # 1: a valid, unused pointer
    ws_o = torch.full((partial * config.d,), float("nan"), dtype=torch.float32, device=q.device)
    ws_lse = torch.full((partial,), float("nan"), dtype=torch.float32, device=q.device)
    ws_count = torch.zeros((max(tiles, 1),), dtype=torch.int32, device=q.device)
    return _pointer(ws_o), _pointer(ws_lse), _pointer(ws_count)


def splitkv_workspace_sizes(config: AnyConfig, shape: Shape) -> tuple[int, int]:
    """``(counters, partial rows)`` of a split-KV launch's workspace: one int32 counter per
    row tile and ``tiles * splits * rows`` float32 rows of partial O (``d`` each) and LSE (1
    each); ``(0, 0)`` with one split (the kernel then touches no workspace).

    From :meth:`SplitKvConfig.workspace_bytes`, so the formula lives in one place: with
    ``splits`` and ``rows`` known, ``bytes = tiles * 4 * (splits * rows * (d + 1) + 1)``.
    """
    assert isinstance(config, SplitKvConfig)  # the family's own config type
    total = config.workspace_bytes(shape.nq, shape.heads, shape.kv_heads, shape.batch, shape.nk)
    splits = config.splits_for(shape.nk)
    per_tile = 4 * (splits * config.rows * (config.d + 1) + 1)
    tiles, rest = divmod(total, per_tile)
    if rest:  # pragma: no cover - workspace_bytes changed its layout
        raise AssertionError(f"{config.name}: {total} workspace bytes are not whole row tiles")
    return tiles, tiles * splits * config.rows
