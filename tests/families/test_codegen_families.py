"""The kernel-family registry and the family registry of config types (CPU only)."""

from __future__ import annotations

import pytest

from codegen.families import FA2, FA3, FAMILIES, SPLITKV, families_for, family, family_of
from codegen.families.fa2.space import fa2_default_config
from core.fa2_config import Fa2Config
from core.family import (
    UnknownFamilyError,
    config_from_name,
    config_from_params,
    family_of_name,
)
from core.shape import Shape

CFG = Fa2Config(d=128, dtype="bf16", causal=True, br=128, bc=64, warps=4, stages=2, pad=8)


def test_the_mma_sync_template_is_family_fa2() -> None:
    assert list(FAMILIES) == ["fa2", "fa3", "splitkv"] and family("fa2") is FA2
    assert family_of(CFG) is FA2 and FA2.config_type is Fa2Config
    assert CFG.name.startswith("fa2_") and family_of_name(CFG.name) == "fa2"
    assert FA2.templates == ("fa2_fwd.cuh",)


def test_config_round_trips_through_name_and_stored_params() -> None:
    assert config_from_name(CFG.name) == CFG
    assert CFG.params() == {
        "br": 128,
        "bc": 64,
        "warps": 4,
        "stages": 2,
        "pad": 8,
        "swizzle": False,
    }
    assert config_from_params("fa2", 128, "bf16", True, CFG.params()) == CFG


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: family("fa9"), "unknown kernel family 'fa9'"),
        (lambda: config_from_name("fa9_d128"), "its prefix names no kernel family"),
        (lambda: config_from_params("fa2", 64, "fp16", False, {"br": 64}), "missing: bc"),
        (lambda: config_from_params("fa3", 64, "fp16", False, {"block_m": 64}), "block_n"),
        (
            lambda: config_from_params("fa2", 64, "fp16", False, {**CFG.params(), "tile": 1}),
            "no parameter",
        ),
    ],
)
def test_unknown_families_and_parameters_are_named(call: object, message: str) -> None:
    with pytest.raises((UnknownFamilyError, ValueError), match=message):
        call()  # type: ignore[operator]


@pytest.mark.parametrize(
    ("cc", "fa2_arch", "fa3_arch"),
    [
        ("9.0", "sm_90", "sm_90a"),
        ("8.9", "sm_89", None),
        ("8.7", "sm_87", None),
        ("8.8", "sm_87", None),  # no sm_88 target: the newest of its major version it runs
        ("8.0", "sm_80", None),
        ("10.0", "sm_100", None),
        ("10.3", "sm_103", None),
        ("11.0", "sm_110", None),
        ("12.0", "sm_120", None),
        ("12.1", "sm_121", None),
        ("12.9", "sm_121", None),
        ("13.0", None, None),  # cubins only: no target of its major version runs there
        ("7.5", None, None),
    ],
)
def test_each_family_builds_for_the_newest_target_the_gpu_runs(
    cc: str, fa2_arch: str | None, fa3_arch: str | None
) -> None:
    assert (FA2.arch_for(cc), FA3.arch_for(cc)) == (fa2_arch, fa3_arch)
    assert SPLITKV.arch_for(cc) == fa2_arch  # the same portable targets as fa2
    pairs = ((FA2, fa2_arch), (FA3, fa3_arch), (SPLITKV, fa2_arch))
    assert families_for(cc) == [f for f, a in pairs if a is not None]


def test_fa2_launch_geometry() -> None:
    assert FA2.grid(CFG, Shape(1000, 1000, 2, 16, 16)) == (8, 16, 2)  # ceil(1000 / 128)
    assert FA2.grid(CFG, Shape(1, 7, 5, 3, 1)) == (1, 3, 5)
    assert FA2.block(CFG) == (128, 1, 1)


def test_fa2_space_seeds_default_and_render_come_from_the_registry() -> None:
    space = FA2.space(64, "fp16", False, 227 * 1024, "sm_90")
    assert space and all(c.family == "fa2" and c.d == 64 for c in space)
    assert set(FA2.seeds(64, "fp16", False)) <= set(space)
    assert FA2.default(64, "fp16", False) == fa2_default_config(64, "fp16", False)
    assert f"FA2_DEFINE_KERNEL({CFG.name}, 128, __nv_bfloat16, true," in FA2.render(CFG)


def test_fa2_header_part() -> None:
    header = FA2.header
    assert header.traits(CFG) == "fa2::Traits<128, __nv_bfloat16, true, 128, 64, 4, 2, 8, false>"
    kernel, launcher = header.instantiations("A")
    assert kernel == "template __global__ void fa2::fwd_kernel<A>(const FaParams);"
    assert launcher == "template cudaError_t fa2::launch<A>(const FaParams&, cudaStream_t);"
