"""The fa2 family's variant kernels (local, softcap, sinks): their text and real nvcc builds.

* ``test_variant_config_renders_the_variant_macro`` (CPU): a variant config's instantiation is
  ``FA2_DEFINE_VARIANT_KERNEL`` over every Traits argument (varlen included, switches last);
  a plain config keeps its macro.
* ``test_variant_sample_builds`` (compile, sm_80 and sm_90): each switch alone and all three,
  dense and varlen, D 64/128/256, fp16 and bf16, next to the plain config of the same tile;
  every variant builds, and none spills where its plain tile does not (ptxas, CUDA 13.0). The
  registers are logged (plain vs variant). Not in the sample, because it does spill: D=256
  causal 64x64 varlen with ``local`` (plain 248 registers, spill-free; local 255 and 40 bytes
  of spill stores on sm_90): the window's per-row bounds cost registers (up to ~25 on the
  largest tiles), and the tuner's ptxas check is what keeps such configs out.
* ``test_variant_kernels_take_faparams_then_favariant`` (compile): the kernels' signatures,
  checked by assigning them to typed function pointers (dense: ``(FaParams, FaVariant)``;
  varlen: ``(FaParams, FaVarlen, FaVariant)``) and the templated kernels and launchers exist.
* ``test_the_gpu_check_program_builds`` (compile): the GPU tier's program
  (``mma_variant_check.cu``) compiles.

Marked ``compile`` (but the render test); skipped when nvcc is not on PATH. About 40 nvcc
calls of 1-3 s each.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from codegen.build import build_configs, nvcc_flags
from codegen.families import FA2
from codegen.families.fa2 import render_instantiation
from codegen.families.fa2.space import is_valid
from codegen.render import template_dir
from core.build_report import BuildReport, BuildStatus
from core.fa2_config import Fa2Config
from core.settings import get_settings

log = logging.getLogger(__name__)

NVCC = get_settings().nvcc
needs_nvcc = pytest.mark.skipif(
    shutil.which(NVCC) is None, reason=f"nvcc ({NVCC!r}) is not on PATH"
)

LOCAL = ("local",)
SOFTCAP = ("softcap",)
SINKS = ("sinks",)
ALL = ("local", "softcap", "sinks")

#: Plain tiles and the switches built on them; spill-free on sm_90 with CUDA 13.0 (on sm_80,
#: whose 128-thread blocks get fewer registers, the D=64 pad-8 two-stage tiles spill plain).
TILES: list[tuple[Fa2Config, list[tuple[str, ...]]]] = [
    (Fa2Config(64, "fp16", False, 64, 64, 4, 2, pad=8), [LOCAL, SOFTCAP, SINKS, ALL]),
    (Fa2Config(64, "bf16", True, 64, 64, 4, 2, pad=8, varlen=True), [LOCAL, ALL]),
    (Fa2Config(128, "bf16", True, 64, 64, 4, 1, swizzle=True), [LOCAL, SOFTCAP, SINKS, ALL]),
    (Fa2Config(128, "fp16", False, 64, 64, 4, 2, swizzle=True, varlen=True), [SINKS, ALL]),
    (Fa2Config(256, "bf16", False, 64, 32, 4, 1, swizzle=True), [LOCAL, ALL]),
    (Fa2Config(256, "fp16", True, 64, 32, 4, 1, swizzle=True), [SOFTCAP, SINKS]),
]


def with_switches(tile: Fa2Config, switches: tuple[str, ...]) -> Fa2Config:
    """``tile`` with the named variant switches set."""
    return replace(
        tile, local="local" in switches, softcap="softcap" in switches, sinks="sinks" in switches
    )


def _spill_free(r: BuildReport) -> bool:
    spills = (r.spill_stores, r.spill_loads, r.stack_bytes)
    return r.status == BuildStatus.OK and spills == (0, 0, 0)


def test_variant_config_renders_the_variant_macro() -> None:
    dense = Fa2Config(128, "bf16", True, 64, 64, 4, 1, swizzle=True, local=True, sinks=True)
    assert dense.name == "fa2_d128_bf16_causal_br64_bc64_w4_s1_swz_loc_snk"
    assert render_instantiation(dense) == (
        '#include "fa2_fwd.cuh"\n'
        "FA2_DEFINE_VARIANT_KERNEL(fa2_d128_bf16_causal_br64_bc64_w4_s1_swz_loc_snk, 128, "
        "__nv_bfloat16, true, 64, 64, 4, 1, 0, true, false, true, false, true)\n"
    )
    packed = Fa2Config(64, "fp16", False, 128, 64, 4, 2, pad=8, varlen=True, softcap=True)
    assert render_instantiation(packed) == (
        '#include "fa2_fwd.cuh"\n'
        "FA2_DEFINE_VARIANT_KERNEL(fa2_d64_fp16_full_br128_bc64_w4_s2_pad8_vl_cap, 64, __half, "
        "false, 128, 64, 4, 2, 8, false, true, false, true, false)\n"
    )
    assert FA2.header.traits(packed) == (
        "fa2::Traits<64, __half, false, 128, 64, 4, 2, 8, false, true, false, true>"
    )  # the header's Traits drops switches off at the end (their defaults)
    plain = replace(dense, local=False, sinks=False)
    assert render_instantiation(plain) == (
        '#include "fa2_fwd.cuh"\nFA2_DEFINE_KERNEL(fa2_d128_bf16_causal_br64_bc64_w4_s1_swz, '
        "128, __nv_bfloat16, true, 64, 64, 4, 1, 0, true)\n"
    )
    assert is_valid(dense) == (True, "") and is_valid(packed) == (True, "")


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
    assert compared >= len(reports) // 2  # most of the sample is spill-free plain


SIGNATURES = r"""
#include "fa2_fwd.cuh"
FA2_DEFINE_VARIANT_KERNEL(dense_k, 64, __half, false, 64, 64, 4, 2, 8, false, false, true, true,
                          false)
FA2_DEFINE_VARIANT_KERNEL(packed_k, 64, __half, true, 64, 64, 4, 2, 8, false, true, false, false,
                          true)
using Dense = fa2::Traits<64, __half, false, 64, 64, 4, 2, 8, false, false, true, true, false>;
using Packed = fa2::Traits<64, __half, true, 64, 64, 4, 2, 8, false, true, false, false, true>;
static_assert(Dense::Local && Dense::Softcap && !Dense::Sinks && Dense::kVariant, "switches");
static_assert(!Dense::Varlen && Packed::Varlen && Packed::Sinks, "switches");
static_assert(!fa2::Traits<64, __half, false, 64, 64, 4, 2, 8, false>::kVariant, "plain");
void (*dense_ptr)(FaParams, FaVariant) = dense_k;
void (*packed_ptr)(FaParams, FaVarlen, FaVariant) = packed_k;
void (*dense_tpl)(FaParams, FaVariant) = fa2::fwd_variant_kernel<Dense>;
void (*packed_tpl)(FaParams, FaVarlen, FaVariant) = fa2::fwd_varlen_variant_kernel<Packed>;
cudaError_t (*dense_launch)(const FaParams&, const FaVariant&, cudaStream_t) =
    fa2::launch_variant<Dense>;
cudaError_t (*packed_launch)(const FaParams&, const FaVarlen&, const FaVariant&, cudaStream_t) =
    fa2::launch_varlen_variant<Packed>;
"""


@pytest.mark.compile
@needs_nvcc
def test_variant_kernels_take_faparams_then_favariant(tmp_path: Path) -> None:
    (tmp_path / "sig.cu").write_text(SIGNATURES)
    flags = [f for f in nvcc_flags("sm_90") if f not in ("-cubin", "-lineinfo")]
    proc = subprocess.run(
        [NVCC, *flags, f"-I{template_dir()}", "-c", "sig.cu", "-o", "sig.o"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"[-4000:]


@pytest.mark.compile
@needs_nvcc
def test_the_gpu_check_program_builds(tmp_path: Path) -> None:
    """The GPU tier's program (mma_variant_check.cu, fa2 and splitkv) keeps compiling."""
    source = Path(__file__).with_name("mma_variant_check.cu")
    proc = subprocess.run(
        [NVCC, "-O3", "-std=c++17", "-gencode=arch=compute_90,code=sm_90",
         f"-I{template_dir()}", str(source), "-o", str(tmp_path / "check")],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
