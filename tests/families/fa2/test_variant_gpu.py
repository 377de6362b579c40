"""The fa2 variant kernels against a brute-force reference, on a real GPU (marker ``gpu``).

Builds ``variant_check.cu`` (next to this file: a host program with its own double-precision
reference of :mod:`core.variant`'s rules, no torch) for the GPU's architecture and runs it:
9 configs (each switch alone and together, dense and packed, D 40/64/128/256, fp16/bf16,
pipeline depths 1-4) times 9 cases (causal and two-sided windows, chunks, chunk with window,
nq > nk rows that see no key, a decode row, a window past every key, a one-key window, a
window far from key 0, a sinks kernel given no sink pointer), O and LSE poisoned with NaN.

Run on a GPU machine: ``pytest -m gpu tests/families/fa2/test_variant_gpu.py``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from codegen.render import template_dir
from core.settings import get_settings

NVCC = get_settings().nvcc
SOURCE = Path(__file__).with_name("variant_check.cu")


def _gpu_arch() -> str | None:
    """The first GPU's ``sm_XY``, or None without a GPU (nvidia-smi missing or failing)."""
    if shutil.which("nvidia-smi") is None:
        return None
    proc = subprocess.run(
        ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    return "sm_" + proc.stdout.split()[0].replace(".", "")


ARCH = _gpu_arch()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(shutil.which(NVCC) is None, reason=f"nvcc ({NVCC!r}) is not on PATH"),
    pytest.mark.skipif(ARCH is None, reason="no NVIDIA GPU (nvidia-smi)"),
]


def test_variant_kernels_match_the_reference(tmp_path: Path) -> None:
    assert ARCH is not None
    exe = tmp_path / "variant_check"
    num = ARCH[3:]
    build = subprocess.run(
        [NVCC, "-O3", "-std=c++17", f"-gencode=arch=compute_{num},code=sm_{num}",
         f"-I{template_dir()}", str(SOURCE), "-o", str(exe)],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=900, check=False)
    failed = [line for line in run.stdout.splitlines() if not line.startswith("ok ")]
    assert run.returncode == 0, "\n".join(failed)[-6000:]
    assert sum(line.startswith("ok ") for line in run.stdout.splitlines()) == 81
