"""fa2tune_forward_kvcache on a real GPU: bench/h200/kvcache_header_probe.cu against a header
with KV-cache kernels of page sizes 0 and 16 (tests/support/kvcache_header.py, tuned "on the
H200": there the plain decode steps run the tuned split-KV winner's cache twin and the windowed
ones the window winner's; elsewhere the split-KV defaults' twins).

The probe (its comment says what it runs: paged and contiguous caches, appends, mapped batch
rows, the caller's workspace and the header's own, a CUDA graph replayed over growing
lengths, refusals) checks O and LSE against a float32 CPU reference and the caches bit for
bit, one PASS/FAIL line per call; this test builds it with nvcc (sm_80 and sm_90 code, -O2)
and wants every line to pass. bench/h200/header_check.sh's kvcache stage runs the same probe
for sm_90 and for sm_80 + sm_90a.

Run on a GPU machine: ``pytest -m gpu tests/codegen/test_gpu_header_kvcache.py`` (one nvcc
build of about 30 s, then a few seconds of launches and CPU reference).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.gpu import gpu_marks
from tests.support.kvcache_header import probe_header

pytestmark = [*gpu_marks(), pytest.mark.compile, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "bench" / "h200" / "kvcache_header_probe.cu"
GENCODES = ("-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90")


def test_kvcache_probe_passes_every_call(tmp_path: Path) -> None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    (tmp_path / "fa2_tuned.cuh").write_text(probe_header("NVIDIA H200", (0, 16)))
    build = subprocess.run(
        [nvcc, "-std=c++17", "-O2", *GENCODES, f"-I{tmp_path}", str(PROBE), "-o", "probe"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert build.returncode == 0, f"nvcc failed:\n{build.stdout}\n{build.stderr}"
    run = subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True, timeout=600)
    lines = run.stdout.splitlines()
    failed = [line for line in lines if line.startswith("FAIL")]
    assert run.returncode == 0 and not failed, "\n".join(failed) or run.stderr
    assert sum(line.startswith("PASS") for line in lines) >= 50, run.stdout
