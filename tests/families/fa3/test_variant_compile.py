"""The fa3 family's attention-variant kernels (local window/chunk, softcap, sinks) built for sm_90a.

CPU: a variant config renders ``FA3_DEFINE_VARIANT_KERNEL`` over every ``Traits`` argument
(varlen and longest-first included, the switches last) and the space takes every switch.
``compile``: a sample of variant configs (each switch alone and all three, dense and varlen,
D 64/128/256, fp16/bf16, RS and SS, one to three consumer warpgroups) builds through the
product's build with no more spills than its plain twin; the extern "C" kernels take
``FaVariant`` last (dense: after the descriptors; varlen: after ``VarlenArgs`` and the
descriptors); the exported header's variant kernels and launchers instantiate.

The register and spill figures of the sample on CUDA 13.0 are in docs/variants.md ("Kernels:
fa3"). About 45 nvcc calls of 2-6 s each, run one at a time.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from codegen.build import build_configs, nvcc_flags
from codegen.families import family
from codegen.families.fa3.space import ARCH, VARIANT_SWITCHES, invalid_reasons
from codegen.render import template_dir
from core.build_report import BuildReport, BuildStatus
from core.fa3_config import Fa3Config
from core.family import AnyConfig
from core.settings import get_settings
from tests.support.nvcc import compile_fa3_harness

log = logging.getLogger(__name__)

NVCC = get_settings().nvcc
needs_nvcc = pytest.mark.skipif(
    shutil.which(NVCC) is None, reason=f"nvcc ({NVCC!r}) is not on PATH"
)

#: Plain configs whose variant twins are built: the shipped seeds' shapes of each D.
BASES: list[Fa3Config] = [
    Fa3Config(128, "fp16", False),  # RS, overlap, ping-pong, 2 consumer warpgroups
    Fa3Config(128, "bf16", True, block_n=176),
    Fa3Config(128, "fp16", True, pv_regs=False),  # SS
    Fa3Config(128, "fp16", False, overlap=False, pingpong=False),  # the serial mainloop
    Fa3Config(64, "bf16", False, block_m=192, block_n=128, pv_regs=False, pingpong=False,
              consumer_regs=160),  # three consumer warpgroups
    Fa3Config(64, "fp16", True, block_m=64, block_n=128, pingpong=False),  # one, no split
    Fa3Config(256, "bf16", True, block_n=80),
]  # fmt: skip

#: (local, softcap, sinks): each switch alone, then all three.
SWITCH_SETS: list[tuple[bool, bool, bool]] = [
    (True, False, False),
    (False, True, False),
    (False, False, True),
    (True, True, True),
]


def with_switches(c: Fa3Config, switches: tuple[bool, bool, bool]) -> Fa3Config:
    local, softcap, sinks = switches
    return replace(c, local=local, softcap=softcap, sinks=sinks)


def variant_sample() -> list[tuple[Fa3Config, Fa3Config]]:
    """(variant config, its plain twin) pairs: every base with all three switches; the first
    base with each switch alone; the first base and D 256 varlen with local alone and all
    three; one longest-first causal config with softcap and sinks (kept small: each pair is
    two sm_90a builds, and CI runs them all)."""
    pairs = [(with_switches(b, SWITCH_SETS[-1]), b) for b in BASES]
    pairs += [(with_switches(BASES[0], s), BASES[0]) for s in SWITCH_SETS[:-1]]
    for b in (BASES[0], BASES[6]):
        vl = replace(b, varlen=True)
        pairs += [(with_switches(vl, s), vl) for s in (SWITCH_SETS[0], SWITCH_SETS[3])]
    lf = replace(BASES[1], longest_first=True)
    pairs.append((replace(lf, softcap=True, sinks=True), lf))
    return pairs


def test_variant_switches_are_all_in_the_space() -> None:
    assert VARIANT_SWITCHES == ("local", "softcap", "sinks")
    for variant, plain in variant_sample():
        assert invalid_reasons(variant) == [], variant.name
        assert variant.has_variant and not plain.has_variant


def test_variant_render_uses_the_variant_macro_over_every_traits_argument() -> None:
    c = Fa3Config(128, "fp16", True, varlen=True, local=True, sinks=True)
    text = family("fa3").render(c)
    assert text == (
        '#include "fa3_fwd.cuh"\n'
        f"FA3_DEFINE_VARIANT_KERNEL({c.name}, 128, __half, true, 128, 128, 2, true, true, "
        "true, 240, true, false, true, false, true)\n"
    )
    # A plain config keeps its macro and arguments.
    plain = family("fa3").render(Fa3Config(128, "fp16", True))
    assert "FA3_DEFINE_KERNEL(fa3_d128_fp16_causal_m128_n128_s2_rs_ov_pp_r240, 128, __half, " \
           "true, 128, 128, 2, true, true, true, 240)" in plain  # fmt: skip


def _table(pairs: list[tuple[Fa3Config, Fa3Config]], reports: dict[AnyConfig, BuildReport]) -> str:
    rows = []
    for v, plain in pairs:
        r, rp = reports[v], reports[plain]
        rows.append(
            f"{v.name}: {r.status.value} {r.registers} regs, spills {r.spill_stores}/"
            f"{r.spill_loads} (plain {rp.status.value} {rp.registers} regs, spills "
            f"{rp.spill_stores}/{rp.spill_loads})"
        )
    return "\n".join(rows)


@pytest.mark.compile
@needs_nvcc
def test_variant_sample_builds_with_no_more_spills_than_plain(tmp_path: Path) -> None:
    pairs = variant_sample()
    configs = sorted({c for pair in pairs for c in pair})
    reports = {r.config: r for r in build_configs(configs, "sm_90", cache_dir=tmp_path, jobs=2)}
    log.info("fa3 variant builds:\n%s", _table(pairs, reports))
    usable = (BuildStatus.OK, BuildStatus.SPILLS)
    for variant, plain in pairs:
        r, rp = reports[variant], reports[plain]
        assert r.arch == ARCH and r.status in usable, f"{variant.name}: {r.status} {r.error}"
        assert rp.status in usable, f"{plain.name}: {rp.status} {rp.error}"
        assert r.registers is not None and r.registers <= 255
        if rp.spill_stores + rp.spill_loads == 0:
            assert (r.spill_stores, r.spill_loads, r.stack_bytes) == (0, 0, 0), _table(
                [(variant, plain)], reports
            )
        assert r.cubin is not None and variant.name.encode() in r.cubin.read_bytes()


@pytest.mark.compile
@needs_nvcc
def test_variant_kernels_take_favariant_last(tmp_path: Path) -> None:
    """The extern "C" signatures, dense and varlen, as the loader's launches pass them."""
    dense = Fa3Config(128, "fp16", False, softcap=True)
    packed = Fa3Config(128, "bf16", True, varlen=True, local=True, sinks=True)
    render = family("fa3").render
    body = "".join(render(c) for c in (dense, packed)).replace('#include "fa3_fwd.cuh"\n', "")
    tma = "CUtensorMap, CUtensorMap, CUtensorMap"
    checks = [
        f"static_assert(std::is_same_v<decltype(&{dense.name}), "
        f"void (*)(FaParams, {tma}, FaVariant)>);",
        f"static_assert(std::is_same_v<decltype(&{packed.name}), "
        f"void (*)(FaParams, fa3::VarlenArgs, {tma}, FaVariant)>);",
        f"static_assert({dense.name}_traits::Softcap && !{dense.name}_traits::Local);",
        f"static_assert({packed.name}_traits::Local && {packed.name}_traits::Sinks "
        f"&& {packed.name}_traits::Varlen);",
    ]
    ok, out = compile_fa3_harness(
        '#include "fa3_fwd.cuh"\n' + body + "\n".join(checks) + "\n", "variant_sig", tmp_path
    )
    assert ok, out[-3000:]


@pytest.mark.compile
@needs_nvcc
def test_variant_macro_refuses_a_plain_config(tmp_path: Path) -> None:
    source = (
        '#include "fa3_fwd.cuh"\n'
        "FA3_DEFINE_VARIANT_KERNEL(fa3_plain, 128, __half, false, 128, 128, 2, true, true, "
        "true, 240, false, false, false, false, false)\n"
    )
    ok, out = compile_fa3_harness(source, "variant_plain", tmp_path)
    assert not ok and "a plain config: FA3_DEFINE_KERNEL" in out


#: The exported header's variant entry points (fa3_launch.cuh), explicitly instantiated and
#: compiled host and device side, as codegen/export.py instantiates a config's.
LAUNCH_HARNESS = """\
#include "fa3_launch.cuh"
using Dense = fa3::Traits<128, __half, false, 128, 128, 2, true, true, true, 240, false, false,
                          true, true, true>;
using Packed = fa3::Traits<128, __nv_bfloat16, true, 128, 176, 2, true, true, true, 240, true,
                           false, false, false, true>;
template __global__ void fa3::fwd_variant_kernel<Dense>(
    const FaParams, const __grid_constant__ CUtensorMap, const __grid_constant__ CUtensorMap,
    const __grid_constant__ CUtensorMap, const FaVariant);
template cudaError_t fa3::launch_variant<Dense>(const FaParams&, const FaVariant&, cudaStream_t);
template bool fa3::can_launch<Dense>(const FaParams&);
template __global__ void fa3::fwd_varlen_variant_kernel<Packed>(
    const FaParams, const fa3::VarlenArgs, const __grid_constant__ CUtensorMap,
    const __grid_constant__ CUtensorMap, const __grid_constant__ CUtensorMap, const FaVariant);
template cudaError_t fa3::launch_varlen_variant<Packed>(const FaParams&, const FaVarlen&,
                                                        const FaVariant&, cudaStream_t);
template bool fa3::can_launch_varlen<Packed>(const FaParams&, const FaVarlen&);
static_assert(fa3::launch_detail::kernel_of<Dense>() == &fa3::fwd_variant_kernel<Dense>);
static_assert(fa3::launch_detail::kernel_of<Packed>() ==
              &fa3::fwd_varlen_variant_kernel<Packed>);
"""


@pytest.mark.compile
@needs_nvcc
def test_launch_header_variant_entry_points_compile(tmp_path: Path) -> None:
    cu = tmp_path / "variant_launch.cu"
    cu.write_text(LAUNCH_HARNESS)
    flags = [f for f in nvcc_flags(ARCH) if f not in ("-cubin", "-Xptxas", "-v")]
    cmd = [NVCC, *flags, f"-I{template_dir()}", "-c", str(cu), "-o", str(tmp_path / "v.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
