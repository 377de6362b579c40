"""Real nvcc builds: the kernel template sampled for D=64 and D=128, and a tiny local template.

Marked ``compile``; skipped when nvcc is not on PATH, and the template sample also when
``codegen/templates/fa2_fwd.cuh`` is missing. About 10 nvcc calls of 1-3 s each.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from codegen.build import BuildBatch, build_batch
from codegen.families import fa2 as families_mod
from codegen.families.fa2 import render_instantiation
from codegen.families.fa2.space import is_valid
from codegen.render import TEMPLATE_HEADER, template_dir
from core.build_report import BuildStatus
from core.fa2_config import Fa2Config
from core.settings import get_settings

NVCC = get_settings().nvcc
HAVE_NVCC = shutil.which(NVCC) is not None
HAVE_TEMPLATE = (template_dir() / TEMPLATE_HEADER).is_file()
JOBS = min(4, os.cpu_count() or 1)

pytestmark = [
    pytest.mark.compile,
    pytest.mark.skipif(not HAVE_NVCC, reason=f"nvcc ({NVCC!r}) is not on PATH"),
]
needs_template = pytest.mark.skipif(
    not HAVE_TEMPLATE,
    reason=f"the kernel template codegen/templates/{TEMPLATE_HEADER} has not landed yet",
)


def cfg(
    d: int, br: int, bc: int, warps: int, stages: int, pad: int = 8, swz: bool = False
) -> Fa2Config:
    return Fa2Config(d, "fp16", False, br, bc, warps, stages, pad=pad, swizzle=swz)


SAMPLE: list[Fa2Config] = [
    # D=64: FA2's tile in both layouts, the seed kernels' 64x64 and 128x64/8w.
    cfg(64, 128, 128, 4, 1),
    cfg(64, 128, 128, 4, 1, pad=0, swz=True),
    cfg(64, 64, 64, 4, 2),
    cfg(64, 128, 64, 8, 1, pad=16),
    # D=128: FA2's tile in both layouts, 64x64 unpadded, 128x64/8w with two stages.
    cfg(128, 128, 64, 4, 1),
    cfg(128, 128, 64, 4, 1, pad=0, swz=True),
    cfg(128, 64, 64, 4, 1, pad=0),
    cfg(128, 128, 64, 8, 2),
]
BROKEN = cfg(64, 64, 32, 2, 1)
BROKEN_MARK = "#error deliberately broken by test_build_compile"


@pytest.fixture(scope="module")
def sample_builds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, BuildBatch]]:
    cache = tmp_path_factory.mktemp("compile cache")
    with pytest.MonkeyPatch.context() as mp:
        # One config gets a preprocessor error: it must fail alone.
        mp.setattr(
            families_mod,  # the fa2 family renders through this module's reference
            "render_instantiation",
            lambda c: render_instantiation(c) + (BROKEN_MARK + "\n" if c == BROKEN else ""),
        )
        batch = build_batch([*SAMPLE, BROKEN], "sm_90", cache, JOBS)
        yield cache, batch


@needs_template
def test_sample_configs_are_valid() -> None:
    assert all(is_valid(c)[0] for c in SAMPLE)


@needs_template
def test_template_sample_builds(sample_builds: tuple[Path, BuildBatch]) -> None:
    _, batch = sample_builds
    assert batch.built == len(SAMPLE) + 1 and batch.cached == 0
    assert [r.config for r in batch.reports] == [*SAMPLE, BROKEN]
    for r in batch.reports[: len(SAMPLE)]:
        assert r.status in (BuildStatus.OK, BuildStatus.SPILLS), (r.config.name, r.error)
        assert r.usable and r.cubin is not None
        assert r.registers is not None and 16 <= r.registers <= 255
        assert r.spill_stores >= 0 and r.spill_loads >= 0 and r.stack_bytes >= 0
        assert (r.status == BuildStatus.SPILLS) == (r.spill_stores + r.spill_loads > 0)
        assert r.compile_seconds > 0
        assert r.nvcc_version.startswith("Cuda compilation tools, release")
        data = r.cubin.read_bytes()
        assert data[:4] == b"\x7fELF"
        assert r.config.name.encode() in data, "the extern C symbol is the config name"


@needs_template
def test_broken_config_fails_alone(sample_builds: tuple[Path, BuildBatch]) -> None:
    _, batch = sample_builds
    broken = batch.reports[-1]
    assert broken.status == BuildStatus.COMPILE_FAILED
    assert broken.cubin is None and broken.registers is None
    assert broken.error is not None and "deliberately broken" in broken.error
    assert batch.failed == 1


@needs_template
def test_second_build_is_served_from_cache(sample_builds: tuple[Path, BuildBatch]) -> None:
    cache, first = sample_builds
    again = build_batch(SAMPLE, "sm_90", cache, JOBS)
    assert (again.built, again.cached) == (0, len(SAMPLE))
    for a, b in zip(again.reports, first.reports[: len(SAMPLE)], strict=True):
        assert a == b


TINY_TEMPLATE = r"""
#pragma once
#include <cstdint>
struct FaParams {
  const void* q; const void* k; const void* v; void* o; float* lse;
  int64_t s[12];
  int32_t batch, q_heads, kv_heads, nq, nk;
  float softmax_scale;
};
static_assert(sizeof(FaParams) == 160, "ABI");
template <int D, int Bc, int Warps, int Pad, bool Swizzle>
struct Traits {
  static_assert(!Swizzle, "tiny template: no swizzle");
  static constexpr int kThreads = 32 * Warps;
};
// Pad 16 asks for too much static shared memory; 8 warps at 8 blocks/SM leave 32 registers
// for Bc live accumulators, so Bc = 256 spills.
#define FA2_DEFINE_KERNEL(NAME, D, ELEM, CAUSAL, BR, BC, WARPS, STAGES, PAD, SWIZZLE)   \
  using NAME##_t = Traits<D, BC, WARPS, PAD, SWIZZLE>;                                  \
  extern "C" __global__ void __launch_bounds__(NAME##_t::kThreads, 8) NAME(FaParams p) { \
    __shared__ float big[PAD == 16 ? 60000 : 32];                                       \
    const float* q = static_cast<const float*>(p.q);                                    \
    float acc[BC];                                                                      \
    _Pragma("unroll") for (int j = 0; j < BC; ++j) acc[j] = q[threadIdx.x + j * 33];    \
    for (int it = 0; it < p.nk; ++it) {                                                 \
      _Pragma("unroll") for (int j = 0; j < BC; ++j)                                    \
        acc[j] = acc[j] * acc[(j * 7 + 3) % BC] + q[it * BC + j];                       \
    }                                                                                   \
    float s = 0.f;                                                                      \
    _Pragma("unroll") for (int j = 0; j < BC; ++j) s += acc[j] * (j + 1);               \
    big[threadIdx.x % 32] = s;                                                          \
    __syncthreads();                                                                    \
    static_cast<float*>(p.o)[threadIdx.x] = big[(threadIdx.x + 1) % 32];                \
  }
"""


def test_tiny_template_statuses(tmp_path: Path) -> None:
    """Every status from a real nvcc, independent of the kernel template's state."""
    tdir = tmp_path / "tiny templates"
    tdir.mkdir()
    (tdir / TEMPLATE_HEADER).write_text(TINY_TEMPLATE)
    ok = cfg(64, 64, 32, 4, 1)
    spills = cfg(64, 128, 256, 8, 1)
    smem = cfg(64, 64, 32, 4, 1, pad=16)
    static_assert = cfg(64, 64, 32, 4, 1, pad=0, swz=True)
    configs = [ok, spills, smem, static_assert]
    batch = build_batch(configs, "sm_90", tmp_path / "cache", JOBS, template_dir=tdir)
    r_ok, r_spills, r_smem, r_assert = batch.reports
    assert r_ok.status == BuildStatus.OK and r_ok.registers is not None
    assert r_spills.status == BuildStatus.SPILLS
    assert r_spills.registers is not None and r_spills.registers <= 32
    assert r_spills.spill_stores > 0 and r_spills.stack_bytes > 0
    assert r_smem.status == BuildStatus.SMEM_OVERFLOW and r_smem.cubin is None
    assert r_smem.error is not None and "too much shared data" in r_smem.error
    assert r_assert.status == BuildStatus.COMPILE_FAILED
    assert r_assert.error is not None and "tiny template: no swizzle" in r_assert.error
    assert (batch.built, batch.failed, batch.spilling) == (4, 2, 1)


def test_relative_template_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A template directory given relative to the caller's cwd still compiles (nvcc runs
    in each config's own build directory, so the path must not be used as given)."""
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / TEMPLATE_HEADER).write_text(TINY_TEMPLATE)
    monkeypatch.chdir(tmp_path)
    batch = build_batch(
        [cfg(64, 64, 32, 4, 1)], "sm_90", tmp_path / "cache", 1, template_dir=Path("tpl")
    )
    assert batch.reports[0].status == BuildStatus.OK, batch.reports[0].error
