"""What a launch of a config takes besides its ``FaParams``: its family's geometry and extra
arguments.

Grid and block come from the family registry (:mod:`codegen.families`: ``fa2`` launches
``(ceil(nq / br), q_heads, batch)`` blocks of ``32 * warps`` threads), the extra kernel
arguments from the family's ``host_prep`` (the Hopper family: three ``CUtensorMap``
descriptors, :mod:`codegen.families.fa3.host`; split-KV: its workspace), its registry
entry's callables. A packed launch's extra arguments follow its ``FaVarlen``: the family's
``varlen_host_prep`` (:func:`packed_extra_args`). :mod:`measure.loader` binds launches with
these; nothing here imports torch or cuda-bindings at import.

A config built with an attention-variant switch takes a
:class:`~measure.params.FaVariant` last, after everything above (:func:`variant_args`); a
config whose switches are not the ones its call's variant needs is refused
(:func:`variant_mismatch`), never launched with the wrong mask.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

from codegen.families.registry import HostPrep as RegistryHostPrep
from core.family import AnyConfig
from core.problem import Problem
from core.shape import Shape
from core.variant import PLAIN, SWITCHES, Variant
from measure.params import FaVariant, Layout, variant_params

if TYPE_CHECKING:
    import torch

Dim3: TypeAlias = tuple[int, int, int]

#: A family's ``host_prep`` (:data:`codegen.families.HostPrep`, its registry entry's).
HostPrep: TypeAlias = RegistryHostPrep


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


def host_prep(family: str) -> HostPrep | None:
    """The host preparation of ``family`` (its registry entry's callable); None when it has none.

    Raises:
        UnknownFamilyError: no such family.
    """
    from codegen.families import family as family_named

    return family_named(family).host_prep


def extra_args(
    config: AnyConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Layout
) -> tuple[Any, ...]:
    """The kernel arguments after ``FaParams`` for one launch of ``config`` on these tensors.

    Empty for a family without ``host_prep`` (``fa2``); otherwise what the family's
    ``host_prep(config, q, k, v, layout)`` returns (``fa3``: the TMA descriptors of Q, K and
    V, :func:`codegen.families.fa3.host.fa3_tensor_maps`).
    """
    prep = host_prep(config.family)
    return () if prep is None else tuple(prep(config, q, k, v, layout))


def packed_extra_args(
    config: AnyConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[Any, ...]:
    """The kernel arguments after ``FaVarlen`` of a packed launch of ``config``: what its
    family's ``varlen_host_prep`` makes of the packed ``[total, heads, D]`` tensors (the
    Hopper family's: the TMA descriptors over the packed rows, whose kernel adds each
    sequence's offset to the row coordinate); empty for a family without one (fa2).

    Raises:
        ValueError: a tensor that is not 3-d, or what the family's ``varlen_host_prep`` refuses.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"{name} must be packed [total, heads, D], got shape {tuple(t.shape)}")
    from codegen.families import family as family_named

    prep = family_named(config.family).varlen_host_prep
    return () if prep is None else tuple(prep(config, q, k, v))


def variant_mismatch(config: AnyConfig, variant: Variant) -> str | None:
    """Why ``config``'s kernel cannot compute ``variant``, or None when it can.

    A kernel computes a variant when its switches are exactly the ones the variant needs
    (:attr:`core.variant.Variant.needs`): a missing switch would compute another attention; an
    extra one is another kernel than the one being measured (its cost is not the plain
    kernel's), so both are refused.
    """
    have = config.variant_switches
    need = variant.needs
    wrong = [
        f"{name}={bool(have.get(name, False))} (the variant needs {need[name]})"
        for name in SWITCHES
        if bool(have.get(name, False)) != need[name]
    ]
    if not wrong:
        return None
    return (
        f"{config.name}'s variant switches do not fit the call's variant "
        f"({variant.describe()}): " + ", ".join(wrong)
    )


def variant_args(
    config: AnyConfig,
    variant: Variant | None,
    sinks: torch.Tensor | None,
    *,
    nq: int | None,
    nk: int | None,
    q_heads: int | None,
) -> tuple[FaVariant, ...]:
    """The kernel arguments a variant adds at the end of a launch of ``config``: its
    :class:`~measure.params.FaVariant` (normalised with the call's ``nq``, ``nk`` and the
    config's causality; ``None`` lengths for a packed batch), or nothing for a plain config.

    Raises:
        ValueError: the config's switches do not fit ``variant`` (:func:`variant_mismatch`;
            ``None`` is plain), or what :func:`~measure.params.variant_params` refuses of
            ``sinks``.
    """
    variant = PLAIN if variant is None else variant
    why = variant_mismatch(config, variant)
    if why is not None:
        raise ValueError(why)
    if not config.has_variant:
        if sinks is not None:
            raise ValueError("a sinks tensor was given for a variant without sinks")
        return ()
    arg = variant_params(variant, sinks, causal=config.causal, nq=nq, nk=nk, q_heads=q_heads)
    return (arg,)
