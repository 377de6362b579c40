"""The fa3 family: Hopper-native forward (wgmma, TMA, warp-specialised producer/consumers).

Its registry entry (:data:`FA3`): the space (:mod:`codegen.families.fa3.space`; sm_90a
only), the instantiation file and ``Traits`` derived from
:class:`~core.fa3_config.Fa3Config`'s declarations, the launch grid, the host preparation
(three TMA descriptors per launch, :func:`codegen.families.fa3.host.fa3_tensor_maps`) and
its part of the exported header.
"""

from __future__ import annotations

from codegen.families import declared
from codegen.families.fa3 import space
from codegen.families.fa3.host import (
    fa3_cache_tensor_maps,
    fa3_tensor_maps,
    fa3_varlen_tensor_maps,
)
from codegen.families.registry import Family, Grid, HeaderPart
from core.config import Dtype
from core.fa3_config import Fa3Config
from core.family import AnyConfig
from core.shape import DECODE_MAX_NQ, Shape


def _fa3(config: AnyConfig) -> Fa3Config:
    assert isinstance(config, Fa3Config)
    return config


def _grid(config: AnyConfig, shape: Shape) -> Grid:
    return (-(-shape.nq // _fa3(config).block_m), shape.heads, shape.batch)


def _space(d: int, dtype: Dtype, causal: bool, smem_limit: int, arch: str) -> list[AnyConfig]:
    if d not in space.HEAD_DIMS:
        return []  # head dims the family has no instantiation for: the other family serves
    return [c for c in space.enumerate_space(d, dtype, causal) if c.smem_bytes <= smem_limit]


def _check(config: AnyConfig, smem_limit: int) -> tuple[bool, str]:
    c = _fa3(config)
    ok, reason = space.is_valid(c)
    if ok and c.smem_bytes > smem_limit:
        return False, f"needs {c.smem_bytes} bytes of shared memory, over {smem_limit}"
    return ok, reason


def _seeds(d: int, dtype: Dtype, causal: bool) -> list[AnyConfig]:
    return list(space.seed_configs(d, dtype, causal)) if d in space.HEAD_DIMS else []


FA3 = Family(
    name="fa3",
    summary="Hopper-native FA forward: wgmma, TMA, warp-specialized producer/consumers (sm_90a)",
    templates=("fa3_fwd.cuh",),
    archs=(space.ARCH,),
    space=_space,
    check=_check,
    seeds=_seeds,
    default=space.default_config,
    render=lambda config: declared.instantiation(
        _fa3(config),
        "fa3_fwd.cuh",
        "FA3_DEFINE_KERNEL",
        "FA3_DEFINE_VARIANT_KERNEL",
        cache_macro="FA3_DEFINE_CACHE_KERNEL",
    ),
    grid=_grid,
    header=HeaderPart(
        template="fa3_launch.cuh",  # includes fa3_fwd.cuh
        traits=lambda config: declared.traits(_fa3(config), "fa3::Traits"),
        kernel="fa3::fwd_kernel",
        launcher="fa3::launch",
        kernel_params=", ".join(
            ["const FaParams"] + ["const __grid_constant__ CUtensorMap"] * 3
        ),  # p, tma_q, tma_k, tma_v (docs/fa3_kernel.md)
        guard="fa3::can_launch",
        varlen_kernel="fa3::fwd_varlen_kernel",
        varlen_launcher="fa3::launch_varlen",
        varlen_kernel_params=", ".join(
            ["const FaParams", "const fa3::VarlenArgs"]
            + ["const __grid_constant__ CUtensorMap"] * 3
        ),  # p, vl, tma_q, tma_k, tma_v over the packed tensors
        varlen_guard="fa3::can_launch_varlen",
        variant_kernel="fa3::fwd_variant_kernel",
        variant_launcher="fa3::launch_variant",
        variant_kernel_params=", ".join(
            ["const FaParams"] + ["const __grid_constant__ CUtensorMap"] * 3 + ["const FaVariant"]
        ),
        varlen_variant_kernel="fa3::fwd_varlen_variant_kernel",
        varlen_variant_launcher="fa3::launch_varlen_variant",
        varlen_variant_kernel_params=", ".join(
            ["const FaParams", "const fa3::VarlenArgs"]
            + ["const __grid_constant__ CUtensorMap"] * 3
            + ["const FaVariant"]
        ),
    ),
    host_prep=fa3_tensor_maps,  # imports torch / cuda-bindings when called
    varlen_host_prep=fa3_varlen_tensor_maps,
    cache_host_prep=fa3_cache_tensor_maps,
    # Chunked prefill: a decode step's few query rows would fill a 64-row warpgroup tile.
    serves_cache=lambda nq: nq > DECODE_MAX_NQ,
    head_dims=space.HEAD_DIMS,
    est_registers=lambda config: space.accumulator_regs(_fa3(config)) + space.REG_HEADROOM,
    variant_switches=space.VARIANT_SWITCHES,
)

__all__ = ["FA3", "space"]
