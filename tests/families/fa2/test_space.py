"""The config space: its rules, the known-good configs it must hold, and is_valid's reasons."""

from __future__ import annotations

import pytest

from codegen.families.fa2.space import (
    FA2_TILES,
    MAX_EST_REGISTERS,
    VALID_BC,
    VALID_BR,
    VALID_HEAD_DIMS,
    VALID_LAYOUTS,
    VALID_ROWS_PER_WARP,
    VALID_STAGES,
    VALID_WARPS,
    enumerate_space,
    estimate_registers,
    fa2_default_config,
    is_valid,
    seed_configs,
)
from codegen.targets import ARCH_SMEM_LIMIT
from core.config import HEAD_DIMS, tile_head_dim
from core.fa2_config import Fa2Config


def cfg(
    d: int,
    br: int,
    bc: int,
    warps: int,
    stages: int = 1,
    pad: int = 8,
    swz: bool = False,
    dtype: str = "fp16",
    causal: bool = False,
) -> Fa2Config:
    return Fa2Config(d, dtype, causal, br, bc, warps, stages, pad=pad, swizzle=swz)  # type: ignore[arg-type]


@pytest.mark.parametrize("d", VALID_HEAD_DIMS)
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_every_config_satisfies_the_rules(d: int, dtype: str, causal: bool) -> None:
    space = enumerate_space(d, dtype, causal)  # type: ignore[arg-type]
    assert space, "the space is never empty"
    for c in space:
        assert (c.d, c.dtype, c.causal) == (d, dtype, causal)
        assert c.warps in VALID_WARPS
        assert c.br in VALID_BR and c.br % (16 * c.warps) == 0
        assert c.rows_per_warp in VALID_ROWS_PER_WARP
        assert c.bc in VALID_BC and c.bc % 16 == 0
        assert c.stages in VALID_STAGES
        assert (c.pad, c.swizzle) in VALID_LAYOUTS
        assert c.smem_bytes <= 227 * 1024
        assert estimate_registers(c) <= MAX_EST_REGISTERS
        assert is_valid(c) == (True, "")


def test_space_is_sorted_unique_and_deterministic() -> None:
    a = enumerate_space(128)
    assert a == sorted(a)
    assert len(set(a)) == len(a)
    assert a == enumerate_space(128)


@pytest.mark.parametrize(
    ("d", "br", "bc", "warps"),
    [(64, 128, 128, 4), (128, 128, 64, 4), (32, 128, 128, 4), (96, 128, 64, 4), (256, 64, 64, 4)],
)
def test_space_contains_fa2_choices(d: int, br: int, bc: int, warps: int) -> None:
    space = set(enumerate_space(d))
    assert cfg(d, br, bc, warps, pad=8) in space
    assert cfg(d, br, bc, warps, pad=0, swz=True) in space


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize(("br", "bc", "warps"), [(64, 64, 4), (128, 64, 4), (128, 64, 8)])
@pytest.mark.parametrize("stages", [1, 2])
def test_space_contains_seed_kernel_tiles(
    d: int, br: int, bc: int, warps: int, stages: int
) -> None:
    assert cfg(d, br, bc, warps, stages) in set(enumerate_space(d))


def test_64x64_with_8_warps_is_rejected_as_less_than_one_mma_tile() -> None:
    ok, reason = is_valid(cfg(64, 64, 64, 8))
    assert not ok
    assert "16 * warps" in reason


def test_both_pad16_and_swizzle_are_kept() -> None:
    space = set(enumerate_space(128))
    assert cfg(128, 128, 64, 4, pad=16) in space
    assert cfg(128, 128, 64, 4, pad=0, swz=True) in space
    assert cfg(128, 128, 64, 4, pad=0) in space


def test_smem_limit_is_respected() -> None:
    limit = 64 * 1024
    space = enumerate_space(128, smem_limit=limit)
    assert space and all(c.smem_bytes <= limit for c in space)
    assert len(space) < len(enumerate_space(128))


def test_arch_clamps_the_smem_limit() -> None:
    space = enumerate_space(128, arch="sm_86")
    assert all(c.smem_bytes <= ARCH_SMEM_LIMIT["sm_86"] for c in space)
    assert len(space) < len(enumerate_space(128, arch="sm_90"))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"d": 12}, "head dim 12 is not a multiple of 8 from 8 to 256"),
        ({"d": 64, "dtype": "fp32"}, "dtype"),
        ({"d": 64, "arch": "sm_70"}, "architecture"),
    ],
)
def test_enumerate_rejects_bad_input(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        enumerate_space(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        (cfg(12, 128, 64, 4), "head dim 12 is not a multiple of 8 from 8 to 256"),
        (cfg(64, 128, 64, 3), "warps 3"),
        (cfg(64, 96, 64, 2), "br 96"),
        (cfg(64, 32, 64, 4), "multiple of 16 * warps"),
        (cfg(64, 256, 64, 4), "rows per warp br/warps = 64"),
        (cfg(64, 128, 48, 4), "bc 48"),
        (cfg(64, 128, 64, 4, stages=5), "stages 5"),
        (cfg(64, 128, 64, 4, pad=4), "pad 4"),
        (cfg(64, 128, 64, 4, pad=8, swz=True), "alternatives"),
        (cfg(256, 128, 128, 4, stages=2), "shared memory"),
        (cfg(128, 128, 256, 4, pad=0, swz=True), "registers"),
    ],
)
def test_is_valid_names_the_broken_rule(config: Fa2Config, fragment: str) -> None:
    ok, reason = is_valid(config)
    assert not ok
    assert fragment in reason


def test_is_valid_uses_the_given_smem_limit() -> None:
    c = cfg(128, 128, 64, 4, stages=2)
    assert is_valid(c)[0]
    ok, reason = is_valid(c, smem_limit=c.smem_bytes - 1)
    assert not ok and str(c.smem_bytes) in reason


def test_register_estimate_follows_the_accumulators() -> None:
    # O (32 rows x 128) + S (32 rows x 64) fp32 over 32 lanes, 2 m-tiles of max/sum state,
    # Q fragments (64 regs) re-read from smem, plus the base.
    c = cfg(128, 128, 64, 4)
    assert estimate_registers(c) == 32 * (128 + 64) // 32 + 8 + 32
    # Larger tiles never estimate fewer registers.
    assert estimate_registers(cfg(128, 128, 128, 4)) > estimate_registers(c)


@pytest.mark.parametrize("d", VALID_HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
def test_seed_configs_are_valid_and_in_the_space(d: int, causal: bool) -> None:
    seeds = seed_configs(d, "bf16", causal)
    space = set(enumerate_space(d, "bf16", causal))
    assert seeds == sorted(set(seeds))
    assert all(s in space for s in seeds)
    br, bc, warps = FA2_TILES[tile_head_dim(d)]
    assert Fa2Config(d, "bf16", causal, br, bc, warps, 1, pad=8) in seeds
    assert Fa2Config(d, "bf16", causal, br, bc, warps, 1, pad=0, swizzle=True) in seeds


def test_fa2_default_config_is_fa2s() -> None:
    # Head dims that are not a multiple of 32 take the tile of the next one (40 -> 64).
    expected = {
        32: (128, 128, 4),
        40: (128, 128, 4),
        64: (128, 128, 4),
        80: (128, 64, 4),
        96: (128, 64, 4),
        128: (128, 64, 4),
        160: (128, 32, 4),
        192: (128, 64, 8),
        256: (64, 64, 4),
    }
    assert set(FA2_TILES) == {tile_head_dim(d) for d in HEAD_DIMS}
    for d, tile in expected.items():
        c = fa2_default_config(d, "fp16", False)
        assert (c.br, c.bc, c.warps, c.stages, c.pad, c.swizzle) == (*tile, 1, 0, True)
    for bad in (0, 7, 12, 264, 512):
        with pytest.raises(ValueError, match="unsupported head dim"):
            fa2_default_config(bad, "fp16", False)


def test_accepted_head_dims_are_the_multiples_of_8_up_to_256() -> None:
    assert tuple(range(8, 257, 8)) == HEAD_DIMS
    for d in (40, 80, 160, 192):
        assert enumerate_space(d)
        assert is_valid(fa2_default_config(d, "bf16", True)) == (True, "")
    for bad in (0, 7, 12, 264, 512):
        with pytest.raises(ValueError, match=f"head dim {bad} is not a multiple of 8 from 8"):
            enumerate_space(bad)


def test_seed_configs_hold_fa2_and_seed_kernel_tiles() -> None:
    names = {c.name for c in seed_configs(128)}
    assert names == {
        "fa2_d128_fp16_full_br128_bc64_w4_s1_pad8",
        "fa2_d128_fp16_full_br128_bc64_w4_s1_swz",
        "fa2_d128_fp16_full_br64_bc64_w4_s1_pad8",
        "fa2_d128_fp16_full_br64_bc64_w4_s2_pad8",
        "fa2_d128_fp16_full_br128_bc64_w4_s2_pad8",
        "fa2_d128_fp16_full_br128_bc64_w8_s1_pad8",
        "fa2_d128_fp16_full_br128_bc64_w8_s2_pad8",
    }
