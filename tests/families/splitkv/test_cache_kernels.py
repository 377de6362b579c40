"""The split-KV family's KV-cache kernels (``_kvc``, paged ``_kvc_pg<P>``): config, text, builds.

* CPU: a cache config's name, parse, dict form and stored parameters (a plain or variant
  config's forms stay what they were: no ``page`` or ``kvcache`` key, no suffix); its
  instantiation is ``SPLITKV_DEFINE_CACHE_KERNEL`` over every Traits argument with the
  variant switches, the page size and the capacity-split switch, and its type
  ``splitkv::CacheTraits<...>``; the space refuses a page size that is not a power of two (up
  to 4096) or one without the switch, and capacity splits without a cache or with a window;
  a cache problem's space holds each tile's twin with its splits over the sequence's length
  and over the capacity.
* Compile (sm_90, nvcc): cache kernels of the default tile at page sizes 0 (contiguous), 1,
  4, 16 (smaller than a key tile: one table lookup per row), 64 and 256 (whole tiles per
  page), with and without variant switches, with capacity splits (contiguous, 16), D
  64/96/128/256, build; their registers,
  spills and shared memory are logged beside the plain tile's, the dynamic shared memory
  is the plain tile's (a cache kernel adds no buffer), and contiguous and whole-tile paged
  kernels spill no more than the plain tile does plus 8 bytes (ptxas, CUDA 13.0).
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from codegen.families.splitkv import SPLITKV, render_instantiation, traits
from codegen.families.splitkv.space import (
    default_config,
    enumerate_cache_space,
    enumerate_space,
    invalid_reasons,
)
from core.family import cache_twins
from core.settings import get_settings
from core.splitkv_config import SplitKvConfig
from tests.support.nvcc import build_cache_twins

NVCC = get_settings().nvcc


def test_cache_config_name_and_forms() -> None:
    plain = default_config(128, "bf16", True)
    cache = replace(plain, kvcache=True, page=16, sinks=True)
    assert cache.name == plain.name + "_snk_kvc_pg16"
    assert replace(plain, kvcache=True).name == plain.name + "_kvc"
    assert SplitKvConfig.from_name(cache.name) == cache
    assert SplitKvConfig.from_name(plain.name) == plain
    assert "page" not in plain.to_dict() and "kvcache" not in plain.to_dict()
    assert "page" not in plain.params() and "kvcache" not in plain.params()
    assert cache.to_dict()["page"] == 16 and cache.params()["kvcache"] is True
    assert SplitKvConfig.from_dict(cache.to_dict()) == cache
    assert cache.has_cache and not plain.has_cache and not replace(plain, sinks=True).has_cache
    assert cache.smem_bytes == plain.smem_bytes


def test_cache_config_renders_the_cache_macro() -> None:
    plain = default_config(64, "fp16", False)
    text = render_instantiation(replace(plain, kvcache=True))
    assert "SPLITKV_DEFINE_CACHE_KERNEL(" in text
    assert text.rstrip().endswith("16, false, false, false, 0, false)")
    paged = replace(plain, kvcache=True, page=4, local=True)
    assert render_instantiation(paged).rstrip().endswith("true, false, false, 4, false)")
    assert (
        traits(paged)
        == "splitkv::CacheTraits<64, __half, false, 16, 32, 4, 2, 16, true, false, false, 4, false>"
    )
    spans = replace(plain, kvcache=True, page=16, cap_split=True)
    assert spans.name == plain.name + "_kvc_pg16_cs"
    assert render_instantiation(spans).rstrip().endswith("false, false, false, 16, true)")
    assert SplitKvConfig.from_name(spans.name) == spans
    assert "cap_split" not in replace(spans, cap_split=False).params()
    # the plain and variant configs keep their macros and types
    assert "SPLITKV_DEFINE_KERNEL(" in render_instantiation(plain)
    assert traits(replace(plain, sinks=True)).startswith("splitkv::VariantTraits<")


@pytest.mark.parametrize(
    ("page", "kvcache", "why"),
    [(3, True, "power of two"), (8192, True, "power of two"), (16, False, "without the kvcache")],
)
def test_space_refuses_bad_page_sizes(page: int, kvcache: bool, why: str) -> None:
    config = replace(default_config(128, "bf16", True), kvcache=kvcache, page=page)
    assert any(why in reason for reason in invalid_reasons(config))


@pytest.mark.parametrize(
    ("changes", "why"),
    [({"kvcache": False, "page": 0}, "without the kvcache switch"),
     ({"local": True}, "with a window")],
)  # fmt: skip
def test_space_refuses_capacity_splits_out_of_their_domain(
    changes: dict[str, object], why: str
) -> None:
    config = replace(default_config(128, "bf16", False), kvcache=True, cap_split=True)
    assert invalid_reasons(config) == []
    assert any(why in reason for reason in invalid_reasons(replace(config, **changes)))


def test_a_cache_space_searches_both_split_spans() -> None:
    tiles = enumerate_space(128, "bf16", False)
    space = enumerate_cache_space(128, "bf16", False, 16)
    assert len(space) == 2 * len(tiles)
    assert {c.cap_split for c in space} == {False, True}
    assert {replace(c, cap_split=False, kvcache=False, page=0) for c in space} == set(tiles)
    # The search tells them apart, and a dense space has one value of the parameter.
    params = {tuple(sorted(SPLITKV.search_params(c).items())) for c in space}
    assert len(params) == len(space)
    assert {SPLITKV.search_params(c)["skv_span"] for c in tiles} == {"length"}
    # A windowed tile's twin keeps the length split only.
    local = replace(tiles[0], local=True)
    assert [t.name for t in cache_twins(local, 16)
            if not invalid_reasons(t)] == [replace(local, kvcache=True, page=16).name]  # fmt: skip


def test_space_takes_every_power_of_two_page() -> None:
    base = default_config(128, "bf16", True)
    for exp in range(13):
        assert invalid_reasons(replace(base, kvcache=True, page=1 << exp)) == []


#: (plain tile, cache variants built on it: (page, switches)).
SAMPLE: list[tuple[SplitKvConfig, list[tuple[int, dict[str, bool]]]]] = [
    (
        default_config(128, "bf16", True),
        [
            (0, {}),
            (1, {}),
            (16, {}),
            (64, {}),
            (256, {}),
            (16, {"local": True, "sinks": True}),
            (0, {"cap_split": True}),
            (16, {"cap_split": True}),
        ],
    ),
    (default_config(64, "fp16", False), [(0, {}), (4, {"softcap": True}), (128, {})]),
    (default_config(96, "fp16", True), [(32, {}), (1, {"local": True})]),
    (default_config(256, "bf16", False), [(16, {}), (0, {"sinks": True})]),
]


@pytest.mark.compile
@pytest.mark.skipif(shutil.which(NVCC) is None, reason=f"nvcc ({NVCC!r}) is not on PATH")
def test_cache_kernels_build(tmp_path: Path) -> None:
    for config, r, base in build_cache_twins(SAMPLE, tmp_path):
        if config.page == 0 or config.page >= config.block_n:
            assert r.spill_stores <= base.spill_stores + 8, config.name
