"""The fa2 family: portable FlashAttention-2 forward (mma.sync, ldmatrix, cp.async; sm_80+).

Its registry entry (:data:`FA2`): the space (:mod:`codegen.families.fa2.space`), the
instantiation file and ``Traits`` derived from :class:`~core.fa2_config.Fa2Config`'s
declarations, the launch grid and its part of the exported header. The kernel takes only
its ``FaParams`` (no host preparation).
"""

from __future__ import annotations

from codegen.families import declared
from codegen.families.fa2 import space
from codegen.families.registry import Family, Grid, HeaderPart
from core.config import Dtype
from core.fa2_config import Fa2Config
from core.family import AnyConfig
from core.shape import Shape

#: The family's template (the header the instantiation files include).
TEMPLATE = "fa2_fwd.cuh"


def _fa2(config: AnyConfig) -> Fa2Config:
    assert isinstance(config, Fa2Config)
    return config


def render_instantiation(config: Fa2Config) -> str:
    """The ``.cu`` text that instantiates ``config`` as an ``extern "C"`` kernel:
    ``#include "fa2_fwd.cuh"`` and one ``FA2_DEFINE_KERNEL(...)`` line (a varlen config:
    ``FA2_DEFINE_VARLEN_KERNEL(...)``; a config with a variant switch set:
    ``FA2_DEFINE_VARIANT_KERNEL(...)`` over every Traits argument, whose kernel takes
    ``FaVariant`` last), newline-terminated."""
    return declared.instantiation(
        config, TEMPLATE, "FA2_DEFINE_KERNEL", variant_macro="FA2_DEFINE_VARIANT_KERNEL"
    )


def _grid(config: AnyConfig, shape: Shape) -> Grid:
    return (-(-shape.nq // _fa2(config).br), shape.heads, shape.batch)  # ceil(nq / br) tiles


def _space(d: int, dtype: Dtype, causal: bool, smem_limit: int, arch: str) -> list[AnyConfig]:
    return list(space.enumerate_space(d, dtype, causal, smem_limit=smem_limit, arch=arch))


def _seeds(d: int, dtype: Dtype, causal: bool) -> list[AnyConfig]:
    return list(space.seed_configs(d, dtype, causal))


FA2 = Family(
    name="fa2",
    summary="portable FlashAttention-2 forward: mma.sync m16n8k16, ldmatrix, cp.async (sm_80+)",
    templates=(TEMPLATE,),
    archs=tuple(reversed(space.SUPPORTED_ARCHS)),  # newest first (the table is oldest first)
    space=_space,
    check=lambda config, smem_limit: space.is_valid(_fa2(config), smem_limit),
    seeds=_seeds,
    default=space.fa2_default_config,
    render=lambda config: render_instantiation(_fa2(config)),
    grid=_grid,
    header=HeaderPart(
        template=TEMPLATE,
        traits=lambda config: declared.traits(_fa2(config), "fa2::Traits"),
        kernel="fa2::fwd_kernel",
        launcher="fa2::launch",
        varlen_kernel="fa2::fwd_varlen_kernel",
        varlen_launcher="fa2::launch_varlen",
        variant_kernel="fa2::fwd_variant_kernel",
        variant_launcher="fa2::launch_variant",
        varlen_variant_kernel="fa2::fwd_varlen_variant_kernel",
        varlen_variant_launcher="fa2::launch_varlen_variant",
    ),
    head_dims=space.VALID_HEAD_DIMS,
    est_registers=lambda config: space.estimate_registers(_fa2(config)),
    columns=lambda config: {"layout": space.layout_text(_fa2(config))},
    variant_switches=space.VARIANT_SWITCHES,
)

__all__ = ["FA2", "TEMPLATE", "Fa2Config", "render_instantiation", "space"]
