"""The splitkv family: split-KV decode forward (packed GQA rows; warps and blocks split keys).

Its registry entry (:data:`SPLITKV`): the space (:mod:`codegen.families.splitkv.space`,
with :func:`~codegen.families.splitkv.space.serves`: the problems a campaign searches it on),
the instantiation file and ``Traits`` derived from
:class:`~core.splitkv_config.SplitKvConfig`'s declarations, the launch grid, the host
preparation (the float32 workspace, :func:`codegen.families.splitkv.host.splitkv_workspace`)
and its part of the exported header.
"""

from __future__ import annotations

from codegen.families import declared
from codegen.families.fa2 import FA2
from codegen.families.registry import Family, Grid, HeaderPart
from codegen.families.splitkv import space
from codegen.families.splitkv.host import splitkv_workspace, splitkv_workspace_sizes
from core.config import Dtype
from core.family import AnyConfig
from core.shape import Shape
from core.splitkv_config import SplitKvConfig

#: The family's kernel template.
TEMPLATE = "splitkv_fwd.cuh"


def _skv(config: AnyConfig) -> SplitKvConfig:
    assert isinstance(config, SplitKvConfig)
    return config


def _grid(config: AnyConfig, shape: Shape) -> Grid:
    # (row tiles x KV heads x batch, splits): batch x heads in x, whose limit is 2^31 - 1.
    c = _skv(config)
    row_tiles = -(-shape.group * shape.nq // c.rows)
    return (row_tiles * shape.kv_heads * shape.batch, c.splits_for(shape.nk), 1)


def render_instantiation(config: SplitKvConfig) -> str:
    """The ``.cu`` text of ``config``: ``SPLITKV_DEFINE_KERNEL(...)``, or with a variant switch
    set ``SPLITKV_DEFINE_VARIANT_KERNEL(...)`` (every Traits argument, switches last; its
    kernel takes ``FaVariant`` after the workspace pointers; a KV-cache config
    ``SPLITKV_DEFINE_CACHE_KERNEL(...)``, whose kernel takes ``FaVariant`` and ``FaKvCache``)."""
    return declared.instantiation(
        config, TEMPLATE, "SPLITKV_DEFINE_KERNEL", variant_macro="SPLITKV_DEFINE_VARIANT_KERNEL",
        cache_macro="SPLITKV_DEFINE_CACHE_KERNEL",
    )  # fmt: skip


def traits(config: SplitKvConfig) -> str:
    """The C++ type naming ``config``: ``splitkv::Traits<...>``, a variant config's
    ``splitkv::VariantTraits<...>`` (the plain kernels' Traits keep their eight parameters:
    the PTX names a block's merge flag by them)."""
    if config.has_cache:
        return declared.traits(config, "splitkv::CacheTraits")
    return declared.traits(
        config, "splitkv::VariantTraits" if config.has_variant else "splitkv::Traits"
    )


def _space(d: int, dtype: Dtype, causal: bool, smem_limit: int, arch: str) -> list[AnyConfig]:
    return list(space.enumerate_space(d, dtype, causal, smem_limit))


def _seeds(d: int, dtype: Dtype, causal: bool) -> list[AnyConfig]:
    return list(space.seed_configs(d, dtype, causal))


SPLITKV = Family(
    name="splitkv",
    summary="split-KV decode forward: packed GQA rows, warps and blocks split the keys (sm_80+)",
    templates=(TEMPLATE,),
    archs=FA2.archs,
    space=_space,
    check=lambda config, smem_limit: space.is_valid(_skv(config), smem_limit),
    seeds=_seeds,
    default=space.default_config,
    render=lambda config: render_instantiation(_skv(config)),
    grid=_grid,
    header=HeaderPart(
        template="splitkv_launch.cuh",  # includes splitkv_fwd.cuh
        traits=lambda config: traits(_skv(config)),
        kernel="splitkv::fwd_kernel",
        launcher="splitkv::launch",
        kernel_params="const FaParams, float*, float*, int*",  # p, ws_o, ws_lse, ws_count
        variant_kernel="splitkv::fwd_variant_kernel",
        variant_launcher="splitkv::launch_variant",
        variant_kernel_params="const FaParams, float*, float*, int*, const FaVariant",
        cache_kernel="splitkv::fwd_cache_kernel",
        cache_launcher="splitkv::launch_cache",
        cache_workspace_launcher="splitkv::launch_cache_with_workspace",
        cache_workspace_size="splitkv::workspace_size",
        cache_kernel_params=(
            "const FaParams, float*, float*, int*, const FaVariant, const FaKvCache"
        ),
        append_kernel="splitkv::append_kernel",
        append_launcher="splitkv::launch_append",
    ),
    host_prep=splitkv_workspace,  # imports torch / cuda-bindings when called
    serves=space.serves,
    head_dims=space.HEAD_DIMS,
    est_registers=lambda config: space.accumulator_regs(_skv(config)),
    variant_switches=space.VARIANT_SWITCHES,
    workspace_sizes=splitkv_workspace_sizes,
    fit=lambda config, smem_limit: space.fit_config(_skv(config), smem_limit),
)

__all__ = ["SPLITKV", "TEMPLATE", "render_instantiation", "space", "traits"]
