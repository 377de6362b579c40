"""Real nvcc builds of the split-KV (decode) family, head dims that are not multiples of 32.

* ``test_sample_builds_for_sm90_without_spills``: a sample for D=40 (tile 64: the mma loops
  stop at 48 columns) and D=200 (tile 224, the path whose chunks do not tile a warp) next to
  D=128, built with :func:`codegen.build.build_configs` for sm_90; spill-free with CUDA 13.0.
* ``test_traits_agree_with_the_config``: ``static_assert``\\s that the template's tile D,
  head dim and ``kSmemBytes`` are :attr:`SplitKvConfig.tile_d`, ``d`` and ``smem_bytes``.
* ``test_workspace_sizes_agree_with_the_config``: a host-only probe (no GPU is touched) that
  prints splitkv_fwd.cuh's ``splits_for`` and ``workspace_bytes`` and splitkv_launch.cuh's
  ``workspace_size`` (what the exported header's ``fa2tune_workspace_size`` returns) for
  D = 40, 80, 160, 192, 200 and 128, against :meth:`SplitKvConfig.workspace_bytes` and
  :func:`codegen.families.splitkv.host.splitkv_workspace_sizes` (the torch op's and the
  worker's sizes).

Marked ``compile``; skipped when nvcc is not on PATH. About 6 nvcc calls of 1-20 s each.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from codegen.build import build_configs, nvcc_flags
from codegen.families import SPLITKV
from codegen.families.splitkv.host import splitkv_workspace_sizes
from codegen.families.splitkv.space import invalid_reasons
from codegen.render import template_dir
from core.build_report import BuildStatus
from core.settings import get_settings
from core.shape import Shape
from core.splitkv_config import SplitKvConfig

NVCC = get_settings().nvcc
pytestmark = [
    pytest.mark.compile,
    pytest.mark.skipif(shutil.which(NVCC) is None, reason=f"nvcc ({NVCC!r}) is not on PATH"),
]

#: Built here; every one is claimed spill-free (ptxas, CUDA 13.0, sm_90).
SPILL_FREE: list[SplitKvConfig] = [
    SplitKvConfig(40, "fp16", False, rows=16, block_n=32, warps=4, stages=2, splits=16),
    SplitKvConfig(40, "bf16", True, rows=32, block_n=16, warps=2, stages=2, splits=8),
    SplitKvConfig(200, "fp16", False, rows=16, block_n=16, warps=4, stages=2, splits=16),
    SplitKvConfig(200, "bf16", True, rows=16, block_n=16, warps=4, stages=3, splits=32),
    SplitKvConfig(128, "fp16", False, rows=16, block_n=32, warps=4, stages=2, splits=16),
]

#: Configs whose sizes are checked: the issue's head dims and one of each load path.
SIZED: list[SplitKvConfig] = [
    SplitKvConfig(40, "fp16", False, rows=16, block_n=32, warps=4, stages=3, splits=16),
    SplitKvConfig(80, "bf16", True, rows=32, block_n=16, warps=2, stages=2, splits=8),
    SplitKvConfig(160, "fp16", True, rows=16, block_n=16, warps=4, stages=2, splits=32),
    SplitKvConfig(192, "bf16", False, rows=16, block_n=32, warps=4, stages=2, splits=64),
    SplitKvConfig(200, "fp16", False, rows=16, block_n=16, warps=4, stages=2, splits=16),
    SplitKvConfig(8, "fp16", False, rows=64, block_n=32, warps=1, stages=4, splits=4),
    SplitKvConfig(128, "fp16", False, rows=32, block_n=16, warps=4, stages=2, splits=16),
]

#: (nq, nk, batch, heads, kv_heads): decode with GQA and MQA, a speculative chunk, one key
#: tile (one split: no workspace), odd Nk.
SHAPES: list[Shape] = [
    Shape(1, 8192, 8, 32, 8),
    Shape(3, 4099, 2, 8, 1),
    Shape(5, 540, 1, 4, 4),
    Shape(1, 16, 8, 32, 8),
    Shape(4, 1001, 3, 28, 4),
]


def _nvcc(args: list[str], workdir: Path) -> None:
    proc = subprocess.run(
        [NVCC, *args, f"-I{template_dir()}"], cwd=workdir, capture_output=True, text=True,
        timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, f"nvcc failed:\n{proc.stdout}\n{proc.stderr}"[-4000:]
    assert "warning" not in proc.stderr.lower(), proc.stderr


def test_sample_builds_for_sm90_without_spills(tmp_path: Path) -> None:
    assert all(invalid_reasons(c) == [] for c in SPILL_FREE)
    reports = build_configs(SPILL_FREE, "sm_90", cache_dir=tmp_path, jobs=2)
    for config, r in zip(SPILL_FREE, reports, strict=True):
        assert r.config == config, r
        assert r.status == BuildStatus.OK, f"{config.name}: {r.status} {r.error}"
        assert r.registers is not None and 24 <= r.registers <= 255
        assert (r.spill_stores, r.spill_loads, r.stack_bytes) == (0, 0, 0), config.name
        assert r.cubin is not None
        data = r.cubin.read_bytes()
        assert data[:4] == b"\x7fELF" and config.name.encode() in data


def test_traits_agree_with_the_config(tmp_path: Path) -> None:
    assert all(invalid_reasons(c) == [] for c in SIZED)
    lines = ['#include "splitkv_fwd.cuh"']
    for i, c in enumerate(SIZED):
        t = f"T{i}"
        lines += [
            f"using {t} = {SPLITKV.header.traits(c)};",
            f'static_assert({t}::DHead == {c.d} && {t}::D == {c.tile_d}, "{c.name}");',
            f'static_assert({t}::kSmemBytes == {c.smem_bytes}, "{c.name}");',
            f'static_assert({t}::kHeadChunks == {c.d // 8}, "{c.name}");',
        ]
    (tmp_path / "traits.cu").write_text("\n".join(lines) + "\n")
    _nvcc([*[f for f in nvcc_flags("sm_90") if f != "-lineinfo"], "traits.cu"], tmp_path)


PROBE_HEAD = r"""
#include "splitkv_launch.cuh"
#include <cstdio>
// Host only: sizes for each (config, shape); nothing is launched and no GPU is touched.
static FaParams params(int d, int nq, int nk, int b, int h, int kv) {
  FaParams p{};
  p.batch = b; p.q_heads = h; p.kv_heads = kv; p.nq = nq; p.nk = nk; p.softmax_scale = 0.1f;
  p.q_row_stride = p.o_row_stride = int64_t{d} * h;
  p.k_row_stride = p.v_row_stride = int64_t{d} * kv;
  return p;
}
template <class T>
static void sizes(const char* name, int d, int nq, int nk, int b, int h, int kv) {
  const FaParams p = params(d, nq, nk, b, h, kv);
  const int splits = splitkv::splits_for<T>(p);
  std::printf("%s %d %d %d %d %d %d %zu %zu\n", name, nq, nk, b, h, kv, splits,
              splitkv::workspace_bytes<T>(p, splits), splitkv::workspace_size<T>(p));
}
int main() {
"""


def test_workspace_sizes_agree_with_the_config(tmp_path: Path) -> None:
    body = [PROBE_HEAD]
    for c in SIZED:
        for s in SHAPES:
            args = f'"{c.name}", {c.d}, {s.nq}, {s.nk}, {s.batch}, {s.heads}, {s.kv_heads}'
            body.append(f"  sizes<{SPLITKV.header.traits(c)}>({args});\n")
    body.append("  return 0;\n}\n")
    (tmp_path / "probe.cu").write_text("".join(body))
    _nvcc(["-std=c++17", "-gencode=arch=compute_90,code=sm_90", "probe.cu", "-o", "probe"],
          tmp_path)  # fmt: skip
    out = subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = {tuple(line.split()[:6]): [int(x) for x in line.split()[6:]] for line in
           out.stdout.splitlines()}  # fmt: skip
    assert len(got) == len(SIZED) * len(SHAPES)
    nonzero = 0
    for c in SIZED:
        for s in SHAPES:
            key = (c.name, *(str(x) for x in (s.nq, s.nk, s.batch, s.heads, s.kv_heads)))
            splits, ws_bytes, ws_size = got[key]
            where = f"{c.name} {s}"
            assert splits == c.splits_for(s.nk), where
            expected = c.workspace_bytes(s.nq, s.heads, s.kv_heads, s.batch, s.nk)
            assert ws_bytes == expected, where
            # The caller's layout: counters for 16-row tiles (16-byte rounded), then the
            # partials of workspace_bytes (d floats of O and one of LSE per partial row).
            counters, partial_rows = splitkv_workspace_sizes(c, s)
            assert partial_rows * (c.d + 1) * 4 + counters * 4 == expected, where
            rows16 = -(-(s.heads // s.kv_heads * s.nq) // 16) * s.kv_heads * s.batch
            head = -(-rows16 * 4 // 16) * 16
            assert ws_size == (head + partial_rows * (c.d + 1) * 4 if expected else 0), where
            nonzero += expected > 0
    assert nonzero >= len(SIZED) * 3
