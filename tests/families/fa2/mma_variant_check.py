"""Build and run ``mma_variant_check.cu`` (the mma.sync families' variant kernels against a
brute-force reference) on this machine's GPU; shared by the fa2 and splitkv GPU tiers."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from codegen.render import template_dir
from core.settings import get_settings

SOURCE = Path(__file__).with_name("mma_variant_check.cu")


def gpu_arch() -> str | None:
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


def skip_reason() -> str | None:
    """Why the check cannot run here (no nvcc, no GPU), or None."""
    nvcc = get_settings().nvcc
    if shutil.which(nvcc) is None:
        return f"nvcc ({nvcc!r}) is not on PATH"
    if gpu_arch() is None:
        return "no NVIDIA GPU (nvidia-smi)"
    return None


def run_check(family: str, workdir: Path) -> tuple[int, list[str]]:
    """Build the program for the GPU's architecture and run it for ``family`` (``fa2`` or
    ``splitkv``). Returns the number of cases that passed and the other lines of its output
    (failures, errors, the summary).

    Raises:
        AssertionError: nvcc failed (its output's tail in the message).
    """
    arch = gpu_arch()
    assert arch is not None
    num = arch[3:]
    exe = workdir / "mma_variant_check"
    build = subprocess.run(
        [get_settings().nvcc, "-O3", "-std=c++17", f"-gencode=arch=compute_{num},code=sm_{num}",
         f"-I{template_dir()}", str(SOURCE), "-o", str(exe)],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(exe), family], capture_output=True, text=True, timeout=900)
    lines = run.stdout.splitlines()
    passed = sum(line.startswith("ok ") for line in lines)
    return passed, [line for line in lines if not line.startswith("ok ")] + [run.stderr]
