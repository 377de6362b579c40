"""The shared floor (:mod:`core`): Problem's dict form and throughput, and the import rules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from core import Problem

ROOT = Path(__file__).resolve().parents[2]


def test_tflops_is_flops_over_time() -> None:
    p = Problem(gpu="g", d=128, n=4096, batch=2, heads=16)
    # 4 * B * H * N * N * D = 4 * 2 * 16 * 4096^2 * 128 = 274.9 GFLOP; in 1 ms: 274.9 TFLOP/s.
    assert p.tflops(1.0) == pytest.approx(274.877906944)
    causal = Problem(gpu="g", d=128, n=4096, batch=2, heads=16, causal=True)
    assert causal.tflops(0.5) == pytest.approx(p.tflops(1.0))


def test_from_dict_inverts_to_dict_and_ignores_unknown_keys() -> None:
    p = Problem(gpu="g", d=64, n=100, nk=300, kv_heads=2, heads=8, causal=True, dtype="bf16")
    assert Problem.from_dict({**p.to_dict(), "unknown": 1}) == p
    assert Problem.from_dict({"gpu": "g", "d": 64, "n": 512}) == Problem(gpu="g", d=64, n=512)
    with pytest.raises(TypeError):
        Problem.from_dict({"gpu": "g", "d": 64})


def _imported_packages(statement: str) -> set[str]:
    """Top-level project packages a fresh interpreter holds after ``statement``."""
    code = (
        f"import sys; {statement}; "
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    return set(out) & {"core", "codegen", "measure", "tuner", "db", "service", "fa2tune"}


def _all_modules(package: str) -> str:
    """``import`` statements for every module of ``package`` and its subpackages (found on
    disk, not imported; alembic's migration scripts, which run only inside alembic, aside)."""
    names = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in (ROOT / package).rglob("*.py")
        if "migrations" not in p.parts
    )
    return "; ".join(f"import {n}" for n in names)


def test_core_imports_no_other_package() -> None:
    assert _imported_packages(_all_modules("core")) == {"core"}


@pytest.mark.parametrize("package", ["codegen", "db"])
def test_codegen_and_db_import_neither_tuner_measure_nor_service(package: str) -> None:
    imported = _imported_packages(_all_modules(package))
    assert imported <= {"core", "codegen", "db"}
    assert package in imported


@pytest.mark.parametrize("package", ["core", "codegen", "db", "tuner", "service"])
def test_no_stage_imports_the_fa2tune_package(package: str) -> None:
    """Settings and the version live on the ground floor (core): no arrow runs back up into
    fa2tune/, which holds the CLI and the torch op above every stage."""
    assert "fa2tune" not in _imported_packages(_all_modules(package))


def test_measure_imports_neither_tuner_nor_db_nor_service() -> None:
    modules = "bench child commands gpuinfo handler jobs loader lru reference sdpa timing verify"
    imported = _imported_packages("; ".join(f"import measure.{m}" for m in modules.split()))
    assert imported <= {"core", "codegen", "measure"}
