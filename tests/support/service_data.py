"""Fake but plausible results for the service and export tests, written through the Store API.

Imported by the service, export and torch tests (and ``tests/service/conftest.py``); it holds no
tests itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI

from core.build_report import BuildStatus
from core.config import Dtype
from core.fa2_config import Fa2Config
from core.problem import Problem
from core.records import GpuInfo, MeasureStatus
from core.settings import get_settings
from db.store import Store
from service.deps import get_app_settings
from tests.support.factories import H200, failed_result, make_config, make_report, ok_result

A100 = GpuInfo(
    name="NVIDIA A100-SXM4-80GB",
    compute_capability="8.0",
    sm_count=108,
    driver_version="550.54.15",
    cuda_version="12.4",
    memory_bytes=85_899_345_920,
    smem_optin_bytes=166_912,
)

H200_NS = (512, 1024, 4096, 16384)

WinnerKey = tuple[str, int, str, bool, int]  # (GPU, D, dtype, causal, N)


@dataclass(frozen=True)
class Seeded:
    """What :func:`seed` wrote, for assertions."""

    measurements: int
    ok: int
    winners: dict[WinnerKey, Fa2Config]


def plan() -> list[tuple[GpuInfo, int, Dtype, bool, int]]:
    """H200: D=64 and D=128 fp16 full at :data:`H200_NS`, D=128 fp16 causal at 1024 and
    4096, D=128 bf16 full at 4096; A100: D=64 fp16 full at 2048."""
    out: list[tuple[GpuInfo, int, Dtype, bool, int]] = []
    for d in (64, 128):
        out += [(H200, d, "fp16", False, n) for n in H200_NS]
    out += [(H200, 128, "fp16", True, n) for n in (1024, 4096)]
    out += [(H200, 128, "bf16", False, 4096), (A100, 64, "fp16", False, 2048)]
    return out


def seed(store: Store) -> Seeded:
    """Record :func:`plan`. Each problem gets a winner (its tile grows with N, so the header's
    buckets differ), a slower OK config, a faster WRONG_RESULT (must never win) and a
    COMPILE_FAILED build."""
    winners: dict[WinnerKey, Fa2Config] = {}
    count = ok = 0
    for gpu, d, dtype, causal, n in plan():
        gpu_id = store.upsert_gpu(gpu)
        problem = Problem(gpu=gpu.name, d=d, n=n, dtype=dtype, causal=causal)
        pid = store.problem_id(problem, gpu_id)
        winner = make_config(d, dtype, causal, br=64 if n <= 1024 else 128, bc=64, stages=2,
                             swizzle=True)  # fmt: skip
        slower = make_config(d, dtype, causal, br=128, bc=128)
        wrong = make_config(d, dtype, causal, br=64, bc=128)
        broken = make_config(d, dtype, causal, br=128, bc=32)
        # Plausible H200 figures: ~200-400 TFLOP/s, rising with N.
        tflops = 200.0 + 40.0 * (n.bit_length() - 10) + (30.0 if d == 128 else 0.0)
        ms = problem.flops / (tflops * 1e12) * 1e3
        rows = [
            (winner, BuildStatus.OK, ok_result(ms, problem)),
            (slower, BuildStatus.OK, ok_result(ms * 1.25, problem)),
            (wrong, BuildStatus.OK, failed_result(MeasureStatus.WRONG_RESULT, ms * 0.7)),
            (broken, BuildStatus.COMPILE_FAILED, failed_result(MeasureStatus.COMPILE_FAILED)),
        ]
        for trial, (cfg, build_status, result) in enumerate(rows):
            bid = store.record_build(make_report(cfg, status=build_status))
            store.record_measurement(pid, bid, result, gpu, trial_number=trial)
            count += 1
            ok += result.status == MeasureStatus.OK
        winners[(gpu.name, d, dtype, causal, n)] = winner
    return Seeded(measurements=count, ok=ok, winners=winners)


def make_store(directory: Path) -> Store:
    """A migrated SQLite store in a throwaway directory."""
    return Store.from_url(f"sqlite:///{directory / 'fa2tune.db'}")


def set_token(app: FastAPI, token: str | None) -> None:
    """Configure ``app``'s ingest token (``None``: writes disabled)."""
    settings = get_settings().model_copy(update={"ingest_token": token})
    app.dependency_overrides[get_app_settings] = lambda: settings
