"""The Hopper family's KV-cache kernels (``_kvc``, ``_kvc_pg<P>``; fa3_fwd.cuh, "KV caches").

CPU: a cache config's name, dict form and stored parameters round-trip; it renders
``FA3_DEFINE_CACHE_KERNEL`` over every ``Traits`` argument and the page size last; the space
takes a page that holds whole key tiles or tiles them in 8-row steps, and refuses the rest,
varlen and longest-first twins; the K/V boxes are a page's rows where a page is smaller than
a tile; the tuner's cache twins of the fa3 space are only the valid ones.

``compile``: a sample of cache configs (contiguous and paged 16/64/256, plain and with a
window, D 64/128, one and two consumer warpgroups) builds through the product's build for
sm_90a, each with no more spill than its plain tile plus 8 bytes where a page holds whole
tiles (pages smaller than a tile issue several TMA boxes per tile from the producer, which
setmaxnreg leaves few registers), and its cubin holds the attention kernel and the append.

Not shown here: correctness and speed on a GPU (the measure worker's GPU tier, pending).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from codegen.families import family_of
from codegen.families.fa3.space import cache_reasons, enumerate_space
from core.fa3_config import Fa3Config
from core.family import config_from_name, config_from_params
from core.problem import Problem, kv_page_of
from core.settings import get_settings
from tests.support.nvcc import build_cache_twins
from tuner.campaign import with_cache

NVCC = get_settings().nvcc
BASE = Fa3Config(128, "bf16", True)  # 128 x 128, RS, overlap, ping-pong


def test_cache_config_name_and_forms() -> None:
    c = replace(BASE, kvcache=True, page=256)
    assert c.name == "fa3_d128_bf16_causal_m128_n128_s2_rs_ov_pp_r240_kvc_pg256"
    assert config_from_name(c.name) == c and kv_page_of(c) == 256
    assert config_from_params(c.family, c.d, c.dtype, c.causal, c.params()) == c
    assert type(c).from_dict(c.to_dict()) == c
    contiguous = replace(BASE, kvcache=True)
    assert contiguous.name.endswith("_r240_kvc") and kv_page_of(contiguous) == 0
    assert kv_page_of(BASE) is None and "kvcache" not in BASE.params()


def test_cache_config_renders_the_cache_macro() -> None:
    c = replace(BASE, kvcache=True, page=64, local=True)
    text = family_of(c).render(c)
    assert text == (
        '#include "fa3_fwd.cuh"\n'
        f"FA3_DEFINE_CACHE_KERNEL({c.name}, 128, __nv_bfloat16, true, 128, 128, 2, true, true, "
        "true, 240, false, false, true, false, false, 64)\n"
    )
    assert family_of(c).header.traits(c).endswith("false, true, false, false, 64>")


@pytest.mark.parametrize(
    ("config", "why"),
    [
        (replace(BASE, page=16), "without the kvcache switch"),
        (replace(BASE, kvcache=True, page=24), "not a power of two"),
        (replace(BASE, kvcache=True, page=8192), "not a power of two up to 4096"),
        (replace(BASE, kvcache=True, page=4), "neither hold whole 128-key tiles"),
        (replace(BASE, block_n=176, kvcache=True, page=256), "neither hold whole 176-key"),
        (replace(BASE, block_n=176, kvcache=True, page=32), "neither hold whole 176-key"),
        (replace(BASE, kvcache=True, longest_first=True), "no _vl, no _lf"),
        (replace(BASE, kvcache=True, varlen=True), "no _vl, no _lf"),
    ],
)
def test_space_refuses_what_the_template_cannot_load(config: Fa3Config, why: str) -> None:
    assert any(why in r for r in cache_reasons(config)), cache_reasons(config)
    ok, reason = family_of(config).check(config, 1 << 30)
    assert not ok and why in reason


@pytest.mark.parametrize(
    ("block_n", "page", "box_rows"),
    [(128, 0, 128), (128, 8, 8), (128, 16, 16), (128, 128, 128), (128, 4096, 128),
     (176, 16, 16), (192, 64, 64), (64, 256, 64)],
)  # fmt: skip
def test_pages_take_whole_tiles_or_tile_them(block_n: int, page: int, box_rows: int) -> None:
    c = replace(BASE, block_n=block_n, kvcache=True, page=page)
    assert cache_reasons(c) == []
    assert c.kv_box_rows == box_rows and block_n % box_rows == 0
    assert c.smem_bytes == replace(c, kvcache=False, page=0).smem_bytes  # the same tiles


def test_the_tuners_cache_twins_of_the_fa3_space_are_valid() -> None:
    space = enumerate_space(128, "bf16", True)
    problem = Problem(gpu="NVIDIA H200", d=128, n=2048, nk=34816, batch=1, heads=32,
                      kv_heads=8, dtype="bf16", causal=True, kv_page=256)  # fmt: skip
    twins = with_cache(space, problem, 227 * 1024)
    assert twins and all(t.kvcache and t.page == 256 and not t.longest_first for t in twins)
    assert {t.block_n for t in twins} == {64, 128}  # the tiles a 256-key page holds whole
    assert all(family_of(t).check(t, 1 << 30)[0] for t in twins)


#: (plain tile, page sizes with switches) the compile tier builds.
SAMPLE: list[tuple[Fa3Config, list[tuple[int, dict[str, bool]]]]] = [
    (BASE, [(0, {}), (16, {}), (64, {}), (256, {}), (256, {"local": True})]),
    (Fa3Config(128, "fp16", False), [(0, {}), (128, {})]),
    (Fa3Config(64, "fp16", True, block_m=64, block_n=128, pingpong=False), [(256, {})]),
]


@pytest.mark.compile
@pytest.mark.skipif(shutil.which(NVCC) is None, reason=f"nvcc ({NVCC!r}) is not on PATH")
def test_cache_kernels_build(tmp_path: Path) -> None:
    cuobjdump = shutil.which("cuobjdump")
    for config, r, base in build_cache_twins(SAMPLE, tmp_path):
        if config.kv_box_rows == config.block_n:
            assert r.spill_stores <= base.spill_stores + 8, config.name
        if cuobjdump is not None and r.cubin is not None:
            out = subprocess.run([cuobjdump, "-symbols", str(r.cubin)], capture_output=True,
                                 text=True, check=True).stdout  # fmt: skip
            names = set(out.split())
            assert config.name in names and f"{config.name}_append" in names, out
