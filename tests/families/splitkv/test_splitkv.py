"""The split-KV (decode) family on the CPU: config, space, registry, geometry, search, campaign."""

from __future__ import annotations

import pytest

from codegen.families import SPLITKV, family, family_of
from codegen.families.splitkv.space import (
    HEAD_DIMS,
    MAX_PACKED_ROWS,
    accumulator_regs,
    default_config,
    enumerate_space,
    invalid_reasons,
    seed_configs,
    serves,
)
from core.family import config_from_name, config_from_params
from core.problem import Problem
from core.shape import Shape
from core.splitkv_config import SplitKvConfig
from tuner.search import SearchSpace, params_of

CFG = SplitKvConfig(128, "bf16", True, rows=32, block_n=16, warps=8, stages=3, splits=32)


def test_name_round_trips_and_names_every_parameter() -> None:
    assert CFG.name == "splitkv_d128_bf16_causal_r32_n16_w8_s3_k32"
    assert config_from_name(CFG.name) == CFG
    assert family_of(CFG) is SPLITKV and family("splitkv") is SPLITKV
    assert CFG.params() == {"rows": 32, "block_n": 16, "warps": 8, "stages": 3, "splits": 32}
    assert config_from_params("splitkv", 128, "bf16", True, CFG.params()) == CFG
    with pytest.raises(ValueError, match=r"expected e\.g\. splitkv_d128"):
        SplitKvConfig.from_name("splitkv_d128_fp16_full_r16")


def test_shared_memory_is_q_plus_the_larger_of_rings_and_merge_plus_stats() -> None:
    c = SplitKvConfig(128, "fp16", False, rows=16, block_n=32, warps=4, stages=2, splits=16)
    q, rings, merge, stats = 16 * 128 * 2, 4 * 2 * 2 * 32 * 128 * 2, 4 * 16 * 128 * 4, 10 * 16 * 4
    assert c.smem_bytes == q + max(rings, merge) + stats
    assert c.threads == 128


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_space_is_valid_sorted_and_holds_seeds_and_default(d: int) -> None:
    space = enumerate_space(d, "fp16", False)
    assert space and space == sorted(set(space))
    assert all(invalid_reasons(c) == [] for c in space)
    assert default_config(d, "fp16", False) in space
    assert set(seed_configs(d, "fp16", False)) <= set(space)


def test_space_rules_name_what_is_wrong() -> None:
    bad = SplitKvConfig(84, "fp16", False, rows=64, block_n=24, warps=3, stages=5, splits=3)
    why = " | ".join(invalid_reasons(bad))
    for part in ("head dim 84", "64 rows x D=84 (tile 96)", "block_n 24", "warps 3", "stages 5"):
        assert part in why
    assert "splits 3" in why
    for d in (0, 4, 84, 264):
        assert enumerate_space(d, "fp16", False) == [] and seed_configs(d, "fp16", False) == []
    with pytest.raises(ValueError, match="head dim 84"):
        default_config(84, "fp16", False)
    big = SplitKvConfig(256, "fp16", False, rows=16, block_n=64, warps=8, stages=4, splits=1)
    assert any("shared memory" in w or "accumulator" in w for w in invalid_reasons(big))


def test_head_dims_are_every_multiple_of_8_and_tiles_round_up_to_32() -> None:
    assert list(HEAD_DIMS) == list(range(8, 257, 8))
    tiles = {d: SplitKvConfig(d, "fp16", False).tile_d for d in (8, 32, 40, 80, 160, 192, 200)}
    assert tiles == {8: 32, 32: 32, 40: 64, 80: 96, 160: 160, 192: 192, 200: 224}
    # The name keeps the tensors' head dim; the render passes it to the template (which
    # rounds its tile itself).
    c = SplitKvConfig(40, "bf16", True, rows=32, block_n=16, warps=2, stages=2, splits=8)
    assert c.name == "splitkv_d40_bf16_causal_r32_n16_w2_s2_k8"
    assert config_from_name(c.name) == c
    assert f"SPLITKV_DEFINE_KERNEL({c.name}, 40, __nv_bfloat16, true, 32, 16, 2, 2, 8)" in (
        SPLITKV.render(c)
    )
    assert SPLITKV.header.traits(c) == "splitkv::Traits<40, __nv_bfloat16, true, 32, 16, 2, 2, 8>"


@pytest.mark.parametrize(("d", "tile"), [(40, 64), (80, 96), (160, 160), (192, 192), (200, 224)])
def test_sizes_use_the_tile_d_for_shared_memory_and_the_head_dim_for_the_workspace(
    d: int, tile: int
) -> None:
    c = SplitKvConfig(d, "fp16", False, rows=16, block_n=32, warps=4, stages=3, splits=16)
    assert c.tile_d == tile
    q, rings, merge = 16 * tile * 2, 4 * 3 * 2 * 32 * tile * 2, 4 * 16 * tile * 4
    assert c.smem_bytes == q + max(rings, merge) + 10 * 16 * 4
    # GQA 32:8 decode, B=3: 4 packed rows per KV head, one 16-row tile each; 16 splits.
    tiles, partial = 8 * 3, 8 * 3 * 16 * 16
    assert c.workspace_bytes(1, 32, 8, 3, 8192) == partial * (d + 1) * 4 + tiles * 4
    assert c.workspace_bytes(1, 32, 8, 3, 32) == 0


def test_register_and_row_rules_use_the_tile_d() -> None:
    # 64 rows x D=72 is under 4096, but its tile (96) is not.
    assert any("(tile 96)" in w for w in invalid_reasons(SplitKvConfig(72, "fp16", False, 64)))
    assert not any("rows x D" in w for w in invalid_reasons(SplitKvConfig(64, "fp16", False, 64)))
    # d=40 takes exactly what d=64 takes (the same tile), d=8 what d=32 takes.
    for d, same in ((40, 64), (80, 96), (200, 224), (8, 32)):
        a, b = enumerate_space(d, "bf16", True), enumerate_space(same, "bf16", True)
        assert [c.params() for c in a] == [c.params() for c in b], d
        assert accumulator_regs(a[0]) == accumulator_regs(b[0])
    assert default_config(136, "fp16", False).block_n == 16  # tile 160
    assert default_config(120, "fp16", False).block_n == 32  # tile 128


def test_splits_never_exceed_key_tiles_and_workspace_follows() -> None:
    c = SplitKvConfig(128, "fp16", False, rows=16, block_n=32, warps=4, stages=2, splits=16)
    assert [c.splits_for(nk) for nk in (1, 32, 33, 300, 512, 100_000)] == [1, 1, 2, 10, 16, 16]
    assert c.workspace_bytes(nq=1, heads=32, kv_heads=8, batch=1, nk=32) == 0  # one split
    # 4 packed rows per KV head -> one 16-row tile per (batch, KV head): 8 tiles, 16 splits.
    tiles, partial = 8, 8 * 16 * 16
    assert c.workspace_bytes(1, 32, 8, 1, 8192) == partial * 129 * 4 + tiles * 4


def test_grid_packs_gqa_rows_and_puts_batch_times_heads_in_x() -> None:
    c = SplitKvConfig(128, "fp16", False, rows=16, block_n=32, warps=4, stages=2, splits=16)
    assert SPLITKV.grid(c, Shape(1, 8192, 1, 32, 8)) == (8, 16, 1)  # 4 rows per KV head
    assert SPLITKV.grid(c, Shape(5, 100, 2, 32, 8)) == (2 * 8 * 2, 4, 1)  # 20 rows: 2 tiles
    assert SPLITKV.grid(c, Shape(1, 64, 70_000, 1, 1)) == (70_000, 2, 1)  # past 65535
    assert SPLITKV.block(c) == (128, 1, 1)


def test_render_and_header_traits_spell_the_same_parameters() -> None:
    text = SPLITKV.render(CFG)
    assert text.startswith('#include "splitkv_fwd.cuh"')
    assert f"SPLITKV_DEFINE_KERNEL({CFG.name}, 128, __nv_bfloat16, true, 32, 16, 8, 3, 32)" in text
    assert (
        SPLITKV.header.traits(CFG) == "splitkv::Traits<128, __nv_bfloat16, true, 32, 16, 8, 3, 32>"
    )


def test_the_family_serves_problems_with_few_packed_rows() -> None:
    decode = Problem(gpu="g", d=128, n=1, nk=8192, batch=8, heads=32, kv_heads=8)
    chunk = Problem(gpu="g", d=128, n=MAX_PACKED_ROWS // 4, batch=1, heads=32, kv_heads=8)
    prefill = Problem(gpu="g", d=128, n=4096)
    assert serves(decode) and serves(chunk) and not serves(prefill)
    assert SPLITKV.serves(decode) and not SPLITKV.serves(prefill)


def test_search_space_over_three_families_looks_every_config_up() -> None:
    from codegen.families import FA2, FA3

    configs = [
        *FA2.seeds(128, "fp16", False),
        *FA3.seeds(128, "fp16", False),
        *enumerate_space(128, "fp16", False)[:40],
    ]
    space = SearchSpace.from_configs(configs)
    assert space.families == ("fa2", "fa3", "splitkv")
    assert set(params_of(CFG)) == {
        "skv_rows",
        "skv_block_n",
        "skv_warps",
        "skv_stages",
        "skv_splits",
        "skv_span",
    }
    for c in configs:
        assert c in space and space.lookup(space.params_for(c)) == c


def test_default_space_holds_the_family_only_where_it_serves_and_families_restrict() -> None:
    from tests.support.factories import H200
    from tuner.campaign import _defaults

    decode = Problem(gpu="g", d=128, n=1, nk=8192, batch=8, heads=32, kv_heads=8)
    prefill = Problem(gpu="g", d=128, n=4096)
    space, seeds, _ = _defaults("sm_90", H200, None, None, None)
    assert {c.family for c in space(decode)} == {"fa2", "fa3", "splitkv"}
    assert {c.family for c in space(prefill)} == {"fa2", "fa3"}
    assert [c.family for c in seeds(decode)][:3] == ["fa2", "fa3", "splitkv"]  # round-robin
    only, only_seeds, _ = _defaults("sm_90", H200, None, None, None, ("splitkv",))
    assert {c.family for c in only(decode)} == {"splitkv"} and only(prefill) == []
    assert {c.family for c in only_seeds(decode)} == {"splitkv"}
    with pytest.raises(ValueError, match="none of the families fa3 runs on sm_80"):
        _defaults("sm_80", H200, None, None, None, ("fa3",))
