"""Two exported headers in one process (``compile``: nvcc builds two shared libraries).

Each library built from an exported header must read its own GPU name and dispatch tables.
The header's data was once C++17 ``inline`` variables, which g++ makes STB_GNU_UNIQUE: one
object per process, even across libraries loaded with RTLD_LOCAL, so the second library read
the first one's tables (on the H200, a plain-sm_90 build called the Hopper kernels of an
sm_90a build loaded before it). No GPU is touched: both libraries are asked host-only
questions (the tuned GPU's name, ``fa2tune_nearest_tuned``), in a fresh Python process.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from core.gpu_name import normalize_gpu_name
from db.store import Store
from service.header import export_header
from tests.support.service_data import A100, H200_NS, seed

pytestmark = pytest.mark.compile

NVCC = shutil.which("nvcc")

WRAPPER = r"""
#include "fa2_tuned.cuh"
// Host-only: the header's tuned GPU, and the Nq of the tuned D=64 fp16 entry nearest to a
// call of N=256 (B=2, 16 heads) on 132 SMs, or -1 when it has none.
extern "C" const char* probe_gpu() { return fa2tune_detail::kTunedGpu; }
extern "C" int probe_nearest_nq() {
  fa2tune_tuned_choice c{};
  return fa2tune_nearest_tuned(64, FA2TUNE_FP16, false, 256, 256, 2, 16, 16, 132, &c) ? c.nq
                                                                                      : -1;
}
"""

LOADER = r"""
import ctypes, sys
libs = [ctypes.CDLL(path) for path in sys.argv[1:]]  # RTLD_LOCAL, as ctypes does by default
for lib in libs:
    lib.probe_gpu.restype = ctypes.c_char_p
    print(lib.probe_gpu().decode(), lib.probe_nearest_nq())
"""


#: The shared module store: H200 results at D=64 fp16 for N in H200_NS; A100 results at D=64
#: fp16 N=2048 only.
fill_store = seed


def _build(store: Store, gpu: str, where: Path) -> subprocess.Popen[str]:
    assert NVCC is not None
    where.mkdir()
    (where / "fa2_tuned.cuh").write_text(export_header(store, gpu, [64], dtypes=["fp16"]))
    (where / "wrapper.cu").write_text(WRAPPER)
    return subprocess.Popen(
        [NVCC, "-std=c++17", "-O1", "-shared", "-Xcompiler", "-fPIC",
         "-gencode=arch=compute_80,code=sm_80", "wrapper.cu", "-o", "libprobe.so"],
        cwd=where, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
def test_each_library_reads_its_own_tables(store: Store, tmp_path: Path) -> None:
    builds = {gpu: _build(store, gpu, tmp_path / gpu) for gpu in ("H200", A100.name)}
    for gpu, proc in builds.items():
        out, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"nvcc failed for {gpu}:\n{out}"
    libs = [str(tmp_path / gpu / "libprobe.so") for gpu in builds]
    # Both load orders: whichever comes first must not lend the other its data.
    for order in (libs, libs[::-1]):
        run = subprocess.run(
            [sys.executable, "-c", LOADER, *order], capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 0, run.stderr
        got = dict(line.rsplit(" ", 1) for line in run.stdout.splitlines())
        assert got == {
            normalize_gpu_name("H200"): str(min(H200_NS)),
            normalize_gpu_name(A100.name): "2048",
        }, order
    nm = shutil.which("nm")
    if nm is not None:  # the cause, named: no header data is a process-unique symbol
        for lib in libs:
            symbols = subprocess.run(
                [nm, "-D", "-C", lib], capture_output=True, text=True, check=True
            ).stdout
            unique = [s for s in symbols.splitlines() if " u fa2tune_detail::k" in s]
            assert unique == [], unique
