"""The split-KV family's variant kernels (local, softcap, sinks): their text and nvcc builds.

* ``test_variant_config_renders_the_variant_macro`` (CPU): a variant config's instantiation is
  ``SPLITKV_DEFINE_VARIANT_KERNEL`` over every Traits argument (switches last) and its C++
  type is ``splitkv::VariantTraits<...>``; a plain config keeps its macro and ``Traits``.
* ``test_variant_sample_builds`` (compile, sm_80 and sm_90): each switch alone and all three,
  D 40/64/128/256, fp16 and bf16, causal and not, next to the plain config of the same tile;
  every variant builds, and none spills where its plain tile does not (ptxas, CUDA 13.0). The
  registers are logged (plain vs variant).
* ``test_variant_launchers_and_workspace`` (compile, host only: no GPU is touched): the
  variant kernel's signature (the plain one's plus ``FaVariant``), ``launch_variant`` and
  ``launch_variant_with_workspace`` instantiate, and a variant config's workspace size is its
  plain tile's (both sized from nk: the grid and workspace do not follow the window).

Marked ``compile`` (but the render test); skipped when nvcc is not on PATH. About 40 nvcc
calls of 1-5 s each.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from codegen.build import build_configs
from codegen.families import SPLITKV
from codegen.families.splitkv import render_instantiation
from codegen.families.splitkv.space import is_valid
from codegen.render import template_dir
from core.build_report import BuildReport, BuildStatus
from core.settings import get_settings
from core.splitkv_config import SplitKvConfig

log = logging.getLogger(__name__)

NVCC = get_settings().nvcc
needs_nvcc = pytest.mark.skipif(
    shutil.which(NVCC) is None, reason=f"nvcc ({NVCC!r}) is not on PATH"
)

LOCAL = ("local",)
SOFTCAP = ("softcap",)
SINKS = ("sinks",)
ALL = ("local", "softcap", "sinks")


def skv(
    d: int, dtype: str, causal: bool, rows: int, bn: int, w: int, s: int, k: int
) -> SplitKvConfig:
    return SplitKvConfig(d, dtype, causal, rows=rows, block_n=bn, warps=w, stages=s, splits=k)  # type: ignore[arg-type]


#: Plain tiles (spill-free on sm_90 with CUDA 13.0) and the switches built on them.
TILES: list[tuple[SplitKvConfig, list[tuple[str, ...]]]] = [
    (skv(128, "fp16", False, 16, 32, 4, 2, 16), [LOCAL, SOFTCAP, SINKS, ALL]),
    (skv(128, "bf16", True, 32, 16, 2, 2, 8), [LOCAL, ALL]),
    (skv(64, "fp16", False, 16, 32, 4, 3, 8), [SOFTCAP, ALL]),
    (skv(256, "bf16", False, 16, 16, 4, 2, 32), [LOCAL, ALL]),
    (skv(40, "fp16", True, 16, 32, 4, 2, 16), [LOCAL, SINKS, ALL]),
]


def with_switches(tile: SplitKvConfig, switches: tuple[str, ...]) -> SplitKvConfig:
    """``tile`` with the named variant switches set."""
    return replace(
        tile, local="local" in switches, softcap="softcap" in switches, sinks="sinks" in switches
    )


def _spill_free(r: BuildReport) -> bool:
    spills = (r.spill_stores, r.spill_loads, r.stack_bytes)
    return r.status == BuildStatus.OK and spills == (0, 0, 0)


def test_variant_config_renders_the_variant_macro() -> None:
    c = skv(128, "bf16", True, 32, 16, 2, 2, 8)
    v = replace(c, local=True, sinks=True)
    assert v.name == "splitkv_d128_bf16_causal_r32_n16_w2_s2_k8_loc_snk"
    assert render_instantiation(v) == (
        '#include "splitkv_fwd.cuh"\n'
        "SPLITKV_DEFINE_VARIANT_KERNEL(splitkv_d128_bf16_causal_r32_n16_w2_s2_k8_loc_snk, 128, "
        "__nv_bfloat16, true, 32, 16, 2, 2, 8, true, false, true)\n"
    )
    assert SPLITKV.render(v) == render_instantiation(v)
    assert SPLITKV.header.traits(v) == (
        "splitkv::VariantTraits<128, __nv_bfloat16, true, 32, 16, 2, 2, 8, true, false, true>"
    )
    assert SPLITKV.header.traits(replace(c, softcap=True)) == (
        "splitkv::VariantTraits<128, __nv_bfloat16, true, 32, 16, 2, 2, 8, false, true>"
    )  # switches off at the end are left to their defaults
    assert render_instantiation(c) == (
        '#include "splitkv_fwd.cuh"\n'
        "SPLITKV_DEFINE_KERNEL(splitkv_d128_bf16_causal_r32_n16_w2_s2_k8, 128, __nv_bfloat16, "
        "true, 32, 16, 2, 2, 8)\n"
    )
    assert SPLITKV.header.traits(c) == "splitkv::Traits<128, __nv_bfloat16, true, 32, 16, 2, 2, 8>"
    assert is_valid(v) == (True, "")


@pytest.mark.compile
@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_variant_sample_builds(arch: str, tmp_path: Path) -> None:
    plains = [tile for tile, _ in TILES]
    variants = [with_switches(tile, sw) for tile, switches in TILES for sw in switches]
    assert all(is_valid(c) == (True, "") for c in plains + variants)
    reports = build_configs([*plains, *variants], arch, cache_dir=tmp_path, jobs=2)
    by_name = {r.config.name: r for r in reports}
    compared = 0
    for tile, switches in TILES:
        plain = by_name[tile.name]
        assert plain.status in (BuildStatus.OK, BuildStatus.SPILLS), f"{tile.name}: {plain.error}"
        for sw in switches:
            c = with_switches(tile, sw)
            r = by_name[c.name]
            log.info(
                "%s %s: %s registers, %s B spilled (plain %s, %s B)", arch, c.name, r.registers,
                r.spill_stores, plain.registers, plain.spill_stores,
            )  # fmt: skip
            assert r.status in (BuildStatus.OK, BuildStatus.SPILLS), f"{c.name}: {r.error}"
            assert r.registers is not None and 24 <= r.registers <= 255
            assert r.cubin is not None and c.name.encode() in r.cubin.read_bytes()
            if not _spill_free(plain):
                continue
            compared += 1
            assert _spill_free(r), (
                f"{c.name} ({arch}): {r.registers} registers, spills "
                f"{r.spill_stores}/{r.spill_loads} B, stack {r.stack_bytes} B; plain "
                f"{plain.registers} registers, no spill"
            )
    assert compared >= len(variants) // 2


PROBE = r"""
#include "splitkv_launch.cuh"
#include <cstdio>
// Host only: nothing is launched and no GPU is touched.
using Plain = splitkv::Traits<128, __half, false, 16, 32, 4, 2, 16>;
using Var = splitkv::VariantTraits<128, __half, false, 16, 32, 4, 2, 16, true, true, true>;
using Cap = splitkv::VariantTraits<128, __half, false, 16, 32, 4, 2, 16, false, true>;
static_assert(Var::Local && Var::Softcap && Var::Sinks && Var::kVariant, "switches");
static_assert(!Cap::Local && Cap::Softcap && !Cap::Sinks, "defaults");
static_assert(!Plain::kVariant && !Plain::Local && Var::kSmemBytes == Plain::kSmemBytes, "plain");
SPLITKV_DEFINE_VARIANT_KERNEL(var_k, 128, __half, false, 16, 32, 4, 2, 16, true, false, true)
void (*macro_ptr)(FaParams, float*, float*, int*, FaVariant) = var_k;
void (*tpl_ptr)(FaParams, float*, float*, int*, FaVariant) = splitkv::fwd_variant_kernel<Var>;
cudaError_t (*launch_ptr)(const FaParams&, const FaVariant&, cudaStream_t) =
    splitkv::launch_variant<Var>;
cudaError_t (*ws_ptr)(const FaParams&, const FaVariant&, void*, size_t, cudaStream_t) =
    splitkv::launch_variant_with_workspace<Cap>;
int main() {
  int bad = 0;
  for (int nk : {16, 300, 4099, 8192}) {
    FaParams p{};
    p.batch = 2; p.q_heads = 32; p.kv_heads = 8; p.nq = 1; p.nk = nk; p.softmax_scale = 0.1f;
    const size_t a = splitkv::workspace_size<Plain>(p), b = splitkv::workspace_size<Var>(p);
    std::printf("nk %d: plain %zu variant %zu\n", nk, a, b);
    bad += a != b || splitkv::splits_for<Plain>(p) != splitkv::splits_for<Var>(p);
  }
  return bad;
}
"""


@pytest.mark.compile
@needs_nvcc
def test_variant_launchers_and_workspace(tmp_path: Path) -> None:
    (tmp_path / "probe.cu").write_text(PROBE)
    proc = subprocess.run(
        [NVCC, "-std=c++17", "-gencode=arch=compute_90,code=sm_90", f"-I{template_dir()}",
         "probe.cu", "-o", "probe"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"[-4000:]
    out = subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("nk ") == 4
