"""Factories for tests of the db package and of its users (the service, the tuner).

They build plausible records without a GPU or a compiler, so a test can seed a
:class:`~db.store.Store` with a handful of lines. Test code only: the product never imports
this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.build_report import BuildReport, BuildStatus
from core.config import Dtype
from core.fa2_config import Fa2Config
from core.family import AnyConfig
from core.problem import Problem
from core.records import GpuInfo, MeasureResult, MeasureStatus
from db.store import Store

H200 = GpuInfo(
    name="NVIDIA H200",
    compute_capability="9.0",
    sm_count=132,
    driver_version="560.35.03",
    cuda_version="12.6",
    memory_bytes=150_754_820_096,
    smem_optin_bytes=232_448,
    sm_clock_mhz=1980,
    mem_clock_mhz=3201,
)


def make_config(
    d: int = 128,
    dtype: Dtype = "fp16",
    causal: bool = False,
    br: int = 128,
    bc: int = 64,
    warps: int = 4,
    stages: int = 1,
    pad: int = 8,
    swizzle: bool = False,
) -> Fa2Config:
    """A kernel config (defaults: a common D=128 tile)."""
    return Fa2Config(
        d=d,
        dtype=dtype,
        causal=causal,
        br=br,
        bc=bc,
        warps=warps,
        stages=stages,
        pad=0 if swizzle else pad,
        swizzle=swizzle,
    )


def make_report(
    config: Fa2Config,
    *,
    arch: str = "sm_90",
    status: BuildStatus = BuildStatus.OK,
    registers: int | None = 168,
    source_hash: str | None = None,
    nvcc_version: str = "Cuda compilation tools, release 12.6, V12.6.77",
) -> BuildReport:
    """A build report for ``config`` as ptxas would give it (no cubin on disk)."""
    failed = status == BuildStatus.COMPILE_FAILED
    return BuildReport(
        config=config,
        arch=arch,
        status=status,
        registers=None if failed else registers,
        spill_stores=8 if status == BuildStatus.SPILLS else 0,
        spill_loads=8 if status == BuildStatus.SPILLS else 0,
        stack_bytes=0,
        static_smem=0,
        compile_seconds=3.5,
        cubin=None,
        source_hash=source_hash or f"src-{config.key}",
        nvcc_version=nvcc_version,
        flags=("-O3", f"-arch={arch}", "-cubin"),
        error="ptxas fatal: out of resources" if failed else None,
    )


def ok_result(median_ms: float, problem: Problem | None = None) -> MeasureResult:
    """A successful measurement with p10/p90 around ``median_ms``."""
    tflops = problem.tflops(median_ms) if problem is not None else None
    return MeasureResult(
        status=MeasureStatus.OK,
        median_ms=median_ms,
        p10_ms=median_ms * 0.98,
        p90_ms=median_ms * 1.03,
        reps=100,
        tflops=tflops,
        max_abs_err=1e-3,
        rel_err=2e-4,
        ref_err=1.1e-3,
        driver_registers=168,
        driver_local_bytes=0,
    )


def failed_result(status: MeasureStatus, median_ms: float | None = None) -> MeasureResult:
    """A measurement that does not count as a success (``median_ms`` only for WRONG_RESULT)."""
    return MeasureResult(
        status=status,
        median_ms=median_ms,
        reps=100 if median_ms is not None else 0,
        max_abs_err=float("inf") if status == MeasureStatus.WRONG_RESULT else None,
        error=f"{status.value.lower()} (test)",
    )


@dataclass(frozen=True)
class Seeded:
    """Ids of what :func:`seed_measurement` recorded."""

    gpu_id: int
    problem_id: int
    build_id: int
    measurement_id: int


def record_ok(store: Store, problem: Problem, config: AnyConfig, ms: float) -> int:
    """Record one verified measurement of ``config`` on ``problem`` (H200), taking ``ms``;
    returns the problem's id."""
    gpu = store.upsert_gpu(H200)
    pid = store.problem_id(problem, gpu)
    build = store.record_build(make_report(config))  # type: ignore[arg-type]
    store.record_measurement(pid, build, ok_result(ms, problem), H200)
    return pid


def seed_measurement(
    store: Store,
    *,
    gpu: GpuInfo = H200,
    problem: Problem | None = None,
    config: AnyConfig | None = None,
    result: MeasureResult | None = None,
    trial_number: int | None = None,
) -> Seeded:
    """Record one GPU/problem/build/measurement chain (defaults: H200, D=128, N=4096, OK)."""
    problem = problem or Problem(gpu=gpu.name, d=128, n=4096)
    config = config or make_config(d=problem.d, dtype=problem.dtype, causal=problem.causal)
    gpu_id = store.upsert_gpu(gpu)
    problem_id = store.problem_id(problem, gpu_id)
    build_id = store.record_build(make_report(config))
    measurement_id = store.record_measurement(
        problem_id, build_id, result or ok_result(1.0, problem), gpu, trial_number
    )
    return Seeded(gpu_id, problem_id, build_id, measurement_id)
