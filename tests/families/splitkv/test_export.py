"""The exported header with a split-KV (decode) winner next to fa2 and fa3 ones.

CPU: the splitkv part (splitkv_launch.cuh with splitkv_fwd.cuh) is inlined once, after the
other families' in registry order, the table points at its launcher and caller-workspace
entry points, and a header without splitkv configs leaves it out. ``compile``: a host-only
probe built for sm_90 (portable targets: splitkv runs there, fa3 is a stub) and for
sm_80 + sm_90a: fa2tune_nearest_tuned picks the splitkv entry for a decode shape and an fa2 or
fa3 one for prefill shapes, as core.shape.nearest_shape does, and the workspace sizes are the
launcher's layout.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from codegen.export import decode_defaults_for
from codegen.families import FA3, SPLITKV
from codegen.families.fa2.space import fa2_default_config
from codegen.render import template_hash
from core.fa3_config import Fa3Config
from core.family import AnyConfig
from core.problem import Problem
from core.shape import Shape, nearest_shape
from core.splitkv_config import SplitKvConfig
from db.store import Store
from service.header import export_header
from tests.support.factories import H200, make_config, make_report, ok_result
from tests.support.nvcc import build_host_probe
from tests.support.service_data import make_store

WHEN = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

SPLIT = SplitKvConfig.from_name("splitkv_d128_fp16_full_r16_n32_w4_s2_k8")
FA3_FULL = Fa3Config.from_name("fa3_d128_fp16_full_m128_n128_s2_rs_ov_pp_r240")
FA2_SMALL = make_config(128, "fp16", False, br=64, bc=64, stages=2, swizzle=True)
DECODE = Shape(nq=1, nk=8192, batch=8, heads=32, kv_heads=8)

#: (problem, winner): a decode problem won by splitkv, prefill ones by fa2 and fa3.
PLAN: list[tuple[Problem, AnyConfig]] = [
    (Problem(gpu=H200.name, d=128, n=1, nk=8192, batch=8, heads=32, kv_heads=8), SPLIT),
    (Problem(gpu=H200.name, d=128, n=1024), FA2_SMALL),
    (Problem(gpu=H200.name, d=128, n=4096), FA3_FULL),
]


def fill_store(s: Store) -> None:
    """The shared module store's rows (``PLAN``)."""
    gpu_id = s.upsert_gpu(H200)
    for problem, cfg in PLAN:
        arch = "sm_90a" if cfg.family == "fa3" else "sm_90"
        bid = s.record_build(make_report(cfg, arch=arch))  # type: ignore[arg-type]
        s.record_measurement(
            s.problem_id(problem, gpu_id), bid, ok_result(0.05, problem), H200, trial_number=0
        )


HEADER = {"gpu": "H200", "ds": [128], "dtypes": ["fp16"], "generated_at": WHEN}


def test_splitkv_part_inlined_once_in_registry_order(header: str) -> None:
    assert header.count("// ---- begin splitkv_launch.cuh ----") == 1
    assert header.count("// ---- begin splitkv_fwd.cuh ----") == 1
    assert header.count("#define SPLITKV_DEFINE_KERNEL(") == 1
    assert header.count("// ---- begin fa2_fwd.cuh ----") == 1
    fa3 = header.index("// ---- begin fa3_launch.cuh ----")
    assert fa3 < header.index("// ---- begin splitkv_launch.cuh ----")
    assert not re.search(r'^\s*#\s*include\s*"', header, re.MULTILINE)
    assert "no config of this family" not in header


def test_splitkv_instantiations_and_table_entry(header: str) -> None:
    alias = f"fa2tune_configs::{SPLIT.name}"
    assert f"using {SPLIT.name} = {SPLITKV.header.traits(SPLIT)};" in header
    assert f"using {SPLIT.name} = splitkv::Traits<128, __half, false, 16, 32, 4, 2, 8>;" in header
    for line in SPLITKV.header.instantiations(alias):
        assert header.count(line) == 1, line
    assert (
        f'{{{{1, 8192, 8, 32, 8}}, &splitkv::launch<{alias}>, "{SPLIT.name}", nullptr, '
        f"Workspace<{alias}>::size, Workspace<{alias}>::launch}}," in header
    )
    for line in FA3.header.instantiations(f"fa2tune_configs::{FA3_FULL.name}"):
        assert header.count(line) == 1, line


def test_provenance_and_targets(header: str) -> None:
    top = header.split("// PUBLIC API")[0]
    assert f"B=8 H=32/8kv Nq=1 Nk=8192: {SPLIT.name} (family splitkv)" in top
    assert f"splitkv_fwd.cuh (template hash {template_hash(main='splitkv_fwd.cuh')})" in top
    # splitkv is portable: only fa3 has a note about sm_90a.
    assert top.count("-gencode=arch=compute_90a,code=sm_90a ...") == 1
    assert "The configs of the fa3 family run from sm_90a code" in top
    assert "fa2tune_forward_with_workspace" in header and "CUDA graph" in header


def test_header_without_splitkv_winners_carries_its_decode_defaults(store: Store) -> None:
    """No split-KV winner: the family's part is still in (its default serves decode steps),
    with exactly the two defaults of (D=128, bf16) as its configs; fa3's is left out."""
    text = export_header(store, "H200", [128], dtypes=["bf16"], generated_at=WHEN)
    assert "(fa3: no config of this family in the header)" in text
    assert "(splitkv: no config of this family in the header)" not in text
    defaults = decode_defaults_for([fa2_default_config(128, "bf16", c) for c in (False, True)])
    launched = set(re.findall(r"splitkv::launch<fa2tune_configs::(\w+)>", text))
    assert launched == {c.name for c in defaults.values()}


def test_splitkv_only_header_has_no_sm90a_note(store: Store, tmp_path: Path) -> None:
    s = make_store(tmp_path)
    gpu_id = s.upsert_gpu(H200)
    problem, cfg = PLAN[0]
    bid = s.record_build(make_report(cfg))  # type: ignore[arg-type]
    s.record_measurement(
        s.problem_id(problem, gpu_id), bid, ok_result(0.05, problem), H200, trial_number=0
    )
    text = export_header(s, "H200", [128], dtypes=["fp16"], generated_at=WHEN)
    s.close()
    assert "// ---- begin splitkv_launch.cuh ----" in text and "namespace fa3" not in text
    assert "compute_90a" not in text.split("// PUBLIC API")[0]


# ------------------------------------------------------------------------------ nvcc

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
SM80 = "-gencode=arch=compute_80,code=sm_80"
SM90 = "-gencode=arch=compute_90,code=sm_90"
SM90A = "-gencode=arch=compute_90a,code=sm_90a"

PROBE = r"""
#include "fa2_tuned.cuh"
#include <cstdio>
#include <cstdlib>
// Host-only (no GPU is touched): the tuned entry for each shape on argv (nq nk b h kv ...)
// on 132 SMs, then the workspace entry points of every tuned choice and the splitkv
// config's workspace size for the decode shape.
static FaParams params(int nq, int nk, int b, int h, int kv) {
  FaParams p{};
  p.q = p.k = p.v = p.o = reinterpret_cast<void*>(std::uintptr_t{1} << 20);  // never read
  p.batch = b; p.q_heads = h; p.kv_heads = kv; p.nq = nq; p.nk = nk; p.softmax_scale = 0.1f;
  p.q_row_stride = p.o_row_stride = 128LL * h; p.k_row_stride = p.v_row_stride = 128LL * kv;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = 128;
  p.q_batch_stride = p.o_batch_stride = 128LL * h * nq;
  p.k_batch_stride = p.v_batch_stride = 128LL * kv * nk;
  return p;
}
int main(int argc, char** argv) {
  for (int i = 1; i + 4 < argc; i += 5) {
    int s[5];
    for (int j = 0; j < 5; ++j) s[j] = std::atoi(argv[i + j]);
    fa2tune_tuned_choice c{};
    if (!fa2tune_nearest_tuned(128, FA2TUNE_FP16, false, s[0], s[1], s[2], s[3], s[4], 132, &c))
      return 1;
    std::printf("nearest %d %d %d %d %d %s\n", c.nq, c.nk, c.batch, c.q_heads, c.kv_heads, c.name);
  }
  for (int i = 0; i < fa2tune_detail::kTuned[0].count; ++i) {
    const fa2tune_detail::Choice& c = fa2tune_detail::kTuned[0].choices[i];
    std::printf("workspace %s %d %d\n", c.name, c.workspace_size != nullptr,
                c.launch_with_workspace != nullptr);
  }
  const FaParams p = params(1, 8192, 8, 32, 8);
  using Split = fa2tune_configs::SPLIT_NAME;
  std::printf("bytes %zu %zu\n", splitkv::workspace_size<Split>(p),
              splitkv::workspace_size<Split>(params(1, 32, 8, 32, 8)));
  // Off the tuned GPU (no device here) a decode step runs the split-KV decode default, with
  // its workspace; invalid parameters are refused before anything is launched.
  std::printf("public %zu %d\n", fa2tune_workspace_size(p, 128, FA2TUNE_FP16, false),
              fa2tune_forward_with_workspace(FaParams{}, 128, FA2TUNE_FP16, false, nullptr, 0) ==
                  cudaErrorInvalidValue);
  return 0;
}
"""

#: (shape asked, family expected): decode shapes go to splitkv, prefill ones to fa2 or fa3.
ASKED: list[tuple[Shape, str]] = [
    (DECODE, "splitkv"),
    (Shape(nq=1, nk=4096, batch=4, heads=32, kv_heads=8), "splitkv"),
    (Shape(nq=4, nk=16384, batch=8, heads=32, kv_heads=8), "splitkv"),
    (Shape(nq=4096, nk=4096, batch=2, heads=16, kv_heads=16), "fa3"),
    (Shape(nq=1024, nk=1024, batch=2, heads=16, kv_heads=16), "fa2"),
    (Shape(nq=2048, nk=2048, batch=4, heads=32, kv_heads=8), "fa3"),
]


def workspace_bytes(config: SplitKvConfig, shape: Shape) -> int:
    """splitkv_launch.cuh's layout: counters for 16-row tiles (16-byte rounded), then
    partial O and LSE per (row tile, split); 0 with one split."""
    splits = config.splits_for(shape.nk)
    if splits <= 1:
        return 0
    rows = shape.heads // shape.kv_heads * shape.nq
    per_kv = shape.kv_heads * shape.batch
    counters = -(-(-(-rows // 16) * per_kv * 4) // 16) * 16
    tiles = -(-rows // config.rows) * per_kv
    return counters + tiles * splits * config.rows * (config.d + 1) * 4


def run_probe(header: str, tmp_path: Path, targets: tuple[str, ...], units: list[str]) -> None:
    assert NVCC is not None
    (tmp_path / "fa2_tuned.cuh").write_text(header)
    (tmp_path / "probe.cu").write_text(PROBE.replace("SPLIT_NAME", SPLIT.name))
    (tmp_path / "other.cu").write_text('#include "fa2_tuned.cuh"\n')
    build_host_probe(tmp_path, *targets, *units, "-o", "probe")
    args = [str(x) for s, _ in ASKED for x in (s.nq, s.nk, s.batch, s.heads, s.kv_heads)]
    out = subprocess.run(
        [str(tmp_path / "probe"), *args], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    winners = {_shape(problem): c for problem, c in PLAN}
    picked = [x.split()[1:] for x in lines if x.startswith("nearest ")]
    assert len(picked) == len(ASKED)
    for (asked, family), got in zip(ASKED, picked, strict=True):
        near = nearest_shape(asked, sorted(winners), 132)
        assert near is not None
        want = [near.nq, near.nk, near.batch, near.heads, near.kv_heads]
        assert ([*map(int, got[:5])], got[5]) == (want, winners[near].name), asked
        assert got[5].startswith(family + "_"), (asked, got)
    ws = {x.split()[1]: x.split()[2:] for x in lines if x.startswith("workspace ")}
    assert ws == {c.name: ["1", "1"] if c.family == "splitkv" else ["0", "0"] for _, c in PLAN}
    small = Shape(nq=1, nk=32, batch=8, heads=32, kv_heads=8)  # one key tile: one split
    expected = (workspace_bytes(SPLIT, DECODE), workspace_bytes(SPLIT, small))
    assert expected[1] == 0 and expected[0] > 0
    assert f"bytes {expected[0]} {expected[1]}" in lines
    decode_default = decode_defaults_for([fa2_default_config(128, "fp16", False)])
    (default,) = decode_default.values()
    assert isinstance(default, SplitKvConfig)
    assert f"public {workspace_bytes(default, DECODE)} 1" in lines


def _shape(problem: Problem) -> Shape:
    return Shape(problem.n, problem.n_keys, problem.batch, problem.heads, problem.n_kv_heads)


@pytest.mark.slow
@pytest.mark.compile
@needs_nvcc
def test_sm90_build_dispatches_decode_to_splitkv(header: str, tmp_path: Path) -> None:
    """Plain sm_90 (splitkv is portable; fa3 compiles to a stub), two translation units."""
    run_probe(header, tmp_path, (SM90,), ["probe.cu", "other.cu"])


@pytest.mark.slow
@pytest.mark.compile
@needs_nvcc
def test_fat_sm80_sm90a_build_dispatches_decode_to_splitkv(header: str, tmp_path: Path) -> None:
    run_probe(header, tmp_path, (SM80, SM90A), ["probe.cu"])
