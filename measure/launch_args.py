"""What a launch of a config takes besides its ``FaParams``: its family's geometry and extra
arguments.

Grid and block come from the family registry (:mod:`codegen.families`: ``fa2`` launches
``(ceil(nq / br), q_heads, batch)`` blocks of ``32 * warps`` threads), the extra kernel
arguments from the family's ``host_prep`` (the Hopper family: three ``CUtensorMap``
descriptors, :mod:`measure.tma`; split-KV: its workspace, :mod:`measure.splitkv`), resolved
by name on first use. A packed launch's extra arguments follow its ``FaVarlen``
(:func:`packed_extra_args`). :mod:`measure.loader` binds launches with these; nothing here
imports torch, cuda-bindings or a ``host_prep`` module at import.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, TypeAlias

from core.family import AnyConfig
from core.problem import Problem
from core.shape import Shape
from measure.params import Layout

if TYPE_CHECKING:
    import torch

Dim3: TypeAlias = tuple[int, int, int]

#: A family's ``host_prep`` (named by ``codegen.families.Family.host_prep``):
#: ``(config, q, k, v, layout)`` -> the kernel's arguments after its ``FaParams``, in order,
#: each a ctypes value whose bytes are the argument (e.g. :class:`measure.tma.TensorMap`).
HostPrep: TypeAlias = Callable[..., Sequence[Any]]


def launch_geometry(
    config: AnyConfig,
    nq: int,
    q_heads: int,
    batch: int,
    *,
    nk: int | None = None,
    kv_heads: int | None = None,
) -> tuple[Dim3, Dim3]:
    """``(grid, block)`` of ``config``'s kernel on a call's shape: its family's geometry.

    ``fa2``: grid ``(ceil(nq / br), q_heads, batch)``, block ``(32 * warps, 1, 1)``;
    ``fa3``: grid ``(ceil(nq / block_m), q_heads, batch)``, block ``((block_m/64 + 1) * 128,
    1, 1)``; ``splitkv``: grid ``(row tiles * kv_heads * batch, splits)`` (it needs ``nk`` and
    ``kv_heads``, which default to ``nq`` and ``q_heads``).
    """
    from codegen.families import family_of

    fam = family_of(config)
    shape = Shape(
        nq, nq if nk is None else nk, batch, q_heads, q_heads if kv_heads is None else kv_heads
    )
    return fam.grid(config, shape), fam.block(config)


def grid_for(config: AnyConfig, problem: Problem) -> tuple[Dim3, Dim3]:
    """Launch geometry of ``config`` on ``problem``: ``(grid, block)`` (:func:`launch_geometry`)."""
    return launch_geometry(
        config, problem.n, problem.heads, problem.batch, nk=problem.n_keys,
        kv_heads=problem.n_kv_heads,
    )  # fmt: skip


@cache
def host_prep(family: str) -> HostPrep | None:
    """The ``host_prep`` function of ``family``, imported on first use; None when it has none.

    The registry names it as ``"module:function"``; it is resolved once per family and
    process.

    Raises:
        UnknownFamilyError: no such family.
        ImportError, AttributeError: the registry names a function that does not exist.
    """
    from codegen.families import family as family_named

    dotted = family_named(family).host_prep
    if dotted is None:
        return None
    module, _, attr = dotted.partition(":")
    fn = getattr(importlib.import_module(module), attr)
    if not callable(fn):
        raise TypeError(f"host_prep {dotted!r} of family {family} is not callable")
    return fn  # type: ignore[no-any-return]


def extra_args(
    config: AnyConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Layout
) -> tuple[Any, ...]:
    """The kernel arguments after ``FaParams`` for one launch of ``config`` on these tensors.

    Empty for a family without ``host_prep`` (``fa2``); otherwise what the family's
    ``host_prep(config, q, k, v, layout)`` returns (``fa3``: the TMA descriptors of Q, K and
    V, :func:`measure.tma.fa3_tensor_maps`).
    """
    prep = host_prep(config.family)
    return () if prep is None else tuple(prep(config, q, k, v, layout))


def packed_extra_args(
    config: AnyConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[Any, ...]:
    """The kernel arguments after ``FaVarlen`` of a packed launch of ``config``: what its
    family's ``host_prep`` makes of the packed tensors seen as one ``[1, total, heads, D]``
    batch (``bnhd``), asked of the config's dense twin (the same tiles; a ``host_prep`` takes
    dense configs). The Hopper family's: the TMA descriptors over the packed rows, whose
    kernel adds each sequence's offset to the row coordinate (:mod:`measure.tma`).

    Raises:
        ValueError: a tensor that is not 3-d, or what the family's ``host_prep`` refuses.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"{name} must be packed [total, heads, D], got shape {tuple(t.shape)}")
    if host_prep(config.family) is None:
        return ()
    # Only a varlen config gets here (SplitKvConfig, which has no such field, never does).
    dense = dataclasses.replace(config, varlen=False)  # type: ignore[arg-type]
    return extra_args(dense, q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), "bnhd")
