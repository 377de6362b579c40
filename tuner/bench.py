"""Benchmark one config on one problem (``fa2tune bench``), optionally against torch SDPA.

The kernel is built if needed (:func:`codegen.build.build_configs`), then verified and timed in
a :class:`~tuner.worker.BenchWorker`. With ``sdpa=True`` the same worker job also times torch
SDPA's flash, efficient and cuDNN backends on the very same inputs (:func:`sdpa_times`), so the
ratios compare like with like (same data, same L2 flushing, same timing loop).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codegen.config import KernelConfig
from codegen.report import BuildReport, BuildStatus
from tuner.loader import Layout
from tuner.problem import Problem
from tuner.records import MeasureResult, MeasureStatus
from tuner.reference import SDPA_BACKENDS
from tuner.timing import TimingOptions
from tuner.worker import DEFAULT_HANDLER, BenchJob, BenchWorker, MeasureOptions

if TYPE_CHECKING:
    from rich.console import Console

    from tuner.reference import InputSet

log = logging.getLogger(__name__)

BuildFn = Callable[[Sequence[KernelConfig], str], list[BuildReport]]


@dataclass(frozen=True)
class SdpaTiming:
    """One torch SDPA backend on an input set.

    Attributes:
        backend: ``"flash"``, ``"efficient"`` or ``"cudnn"``.
        status: ``"OK"``, ``"UNSUPPORTED"`` (torch cannot run the case; ``note`` says why)
            or ``"FAILED"`` (it ran and failed, e.g. out of memory).
        median_ms: median time per call.
        p10_ms: 10th percentile.
        p90_ms: 90th percentile.
        reps: timed calls.
        tflops: ``problem.flops / median``.
        max_abs_err: its error against the float32 reference on the checked pairs.
        note: how the case was mapped, or why it was skipped.
    """

    backend: str
    status: str
    median_ms: float | None = None
    p10_ms: float | None = None
    p90_ms: float | None = None
    reps: int = 0
    tflops: float | None = None
    max_abs_err: float | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SdpaTiming:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})


def sdpa_times(
    inputs: InputSet,
    *,
    backends: Sequence[str] = SDPA_BACKENDS,
    timing: TimingOptions | None = None,
    device: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, SdpaTiming]:
    """Time torch SDPA restricted to each backend on ``inputs`` (runs where the GPU is).

    A backend that cannot run the case is reported ``UNSUPPORTED`` with torch's reason rather
    than silently falling back to another backend.

    Args:
        inputs: the input set (its reference gives each backend's error).
        backends: which backends, in order.
        timing: timing settings (the kernel's, so the comparison is like for like).
        device: CUDA device index.
        progress: called with ``"sdpa-<backend>"`` before each backend (worker heartbeat).
    """
    from tuner.reference import SdpaUnsupported, errors_vs_reference, sdpa_callable
    from tuner.timing import time_with_options

    t = timing or TimingOptions()
    qb, kb, vb = inputs.bhnd()
    flops = inputs.problem.flops
    out: dict[str, SdpaTiming] = {}
    for backend in backends:
        if progress is not None:
            progress(f"sdpa-{backend}")
        try:
            fn, note = sdpa_callable(
                qb, kb, vb, causal=inputs.problem.causal, scale=inputs.scale, backend=backend
            )
        except SdpaUnsupported as exc:
            out[backend] = SdpaTiming(backend, "UNSUPPORTED", note=str(exc))
            continue
        try:
            errs = errors_vs_reference(fn(), inputs, layout="bhnd")
            stats = time_with_options(fn, t, device=device)
        except RuntimeError as exc:
            out[backend] = SdpaTiming(backend, "FAILED", note=f"{type(exc).__name__}: {exc}"[:300])
            continue
        out[backend] = SdpaTiming(
            backend,
            "OK",
            median_ms=stats.median_ms,
            p10_ms=stats.p10_ms,
            p90_ms=stats.p90_ms,
            reps=stats.reps,
            tflops=flops / (stats.median_ms * 1e-3) / 1e12 if stats.median_ms > 0 else None,
            max_abs_err=errs.max_abs if math.isfinite(errs.max_abs) else None,
            note=note,
        )
    return out


def build_summary(report: BuildReport) -> dict[str, Any]:
    """JSON-able view of a build report."""
    return {
        "status": str(report.status),
        "arch": report.arch,
        "registers": report.registers,
        "spill_stores": report.spill_stores,
        "spill_loads": report.spill_loads,
        "stack_bytes": report.stack_bytes,
        "static_smem": report.static_smem,
        "compile_seconds": report.compile_seconds,
        "cubin": str(report.cubin) if report.cubin is not None else None,
        "error": report.error,
    }


@dataclass
class BenchReport:
    """Everything ``fa2tune bench`` reports.

    Attributes:
        config: the kernel configuration.
        problem: the problem it ran on.
        result: the kernel's measurement (a build failure's status when it never ran).
        layout: tensor layout used.
        gpu: the worker's GPU description (``GpuInfo.to_dict()``), when known.
        build: :func:`build_summary` of the build, ``None`` when a cubin was given.
    """

    config: KernelConfig
    problem: Problem
    result: MeasureResult
    layout: Layout = "bnhd"
    gpu: dict[str, Any] | None = None
    build: dict[str, Any] | None = None
    sdpa: dict[str, SdpaTiming] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.result.status == MeasureStatus.OK

    def speedup(self, backend: str) -> float | None:
        """SDPA backend's median over ours (> 1: ours is faster), when both ran."""
        theirs = self.sdpa.get(backend)
        if theirs is None or theirs.median_ms is None or not self.result.median_ms:
            return None
        return theirs.median_ms / self.result.median_ms

    def to_dict(self) -> dict[str, Any]:
        result = self.result.to_dict()
        result["extra"] = {k: v for k, v in self.result.extra.items() if k != "sdpa"}
        return {
            "config": self.config.name,
            "config_params": self.config.to_dict(),
            "problem": self.problem.to_dict(),
            "layout": self.layout,
            "gpu": self.gpu,
            "build": self.build,
            "result": result,
            "sdpa": {
                name: {**t.to_dict(), "speedup_vs_sdpa": self.speedup(name)}
                for name, t in self.sdpa.items()
            },
        }


def _default_build(configs: Sequence[KernelConfig], arch: str) -> list[BuildReport]:
    from codegen.build import build_configs

    return list(build_configs(list(configs), arch=arch))


_BUILD_STATUS = {
    BuildStatus.COMPILE_FAILED: MeasureStatus.COMPILE_FAILED,
    BuildStatus.SMEM_OVERFLOW: MeasureStatus.SMEM_OVERFLOW,
    BuildStatus.SPILLS: MeasureStatus.SPILLS,
}


def run_bench(
    config: KernelConfig,
    *,
    n: int,
    nk: int | None = None,
    batch: int = 2,
    heads: int = 16,
    kv_heads: int | None = None,
    layout: Layout = "bnhd",
    arch: str = "sm_90",
    sdpa: bool = False,
    device: int = 0,
    job_timeout_s: float = 60.0,
    timing: TimingOptions | None = None,
    cubin: Path | None = None,
    symbol: str | None = None,
    handler: str = DEFAULT_HANDLER,
    build_fn: BuildFn | None = None,
) -> BenchReport:
    """Build (unless ``cubin`` is given), verify and time ``config``; SDPA too with ``sdpa``.

    The worker starts before the build so its torch/CUDA start-up overlaps the compilation.

    Raises:
        ValueError: on inconsistent problem arguments.
        tuner.worker.WorkerStartError: when no worker can be started.
    """
    if heads % (kv_heads or heads) != 0:
        raise ValueError(f"--heads {heads} is not a multiple of --kv-heads {kv_heads}")
    options = MeasureOptions(
        layout=layout, timing=timing or TimingOptions(), sdpa=sdpa, symbol=symbol
    )
    worker = BenchWorker(
        device=device, job_timeout_s=job_timeout_s, handler=handler, options=options
    )
    try:
        worker.start(wait_ready=False)
        build: dict[str, Any] | None = None
        build_status: MeasureStatus | None = None
        build_error: str | None = None
        if cubin is None:
            reports = (build_fn or _default_build)([config], arch)
            report = reports[0]
            build = build_summary(report)
            if report.usable and report.cubin is not None:
                cubin = report.cubin
            else:
                build_status = _BUILD_STATUS.get(report.status, MeasureStatus.COMPILE_FAILED)
                build_error = report.error or f"build status {report.status}"
        gpu = worker.gpu_info
        problem = Problem(
            gpu=gpu.name if gpu is not None else "unknown",
            d=config.d,
            n=n,
            batch=batch,
            heads=heads,
            dtype=config.dtype,
            causal=config.causal,
            kv_heads=kv_heads,
            nk=nk,
        )
        if cubin is None:
            result = MeasureResult(
                status=build_status or MeasureStatus.COMPILE_FAILED, error=build_error
            )
        else:
            result = worker.measure(BenchJob.make(config, cubin, problem, options))
        sdpa_raw = result.extra.get("sdpa")
        timings = (
            {k: SdpaTiming.from_dict(v) for k, v in sdpa_raw.items()}
            if isinstance(sdpa_raw, dict)
            else {}
        )
        return BenchReport(
            config=config,
            problem=problem,
            result=result,
            layout=layout,
            gpu=gpu.to_dict() if gpu is not None else None,
            build=build,
            sdpa=timings,
        )
    finally:
        worker.close()


def _ms(x: float | None) -> str:
    return f"{x:.4f}" if x is not None else "-"


def _num(x: float | None, fmt: str = ".1f") -> str:
    return format(x, fmt) if x is not None else "-"


def render(report: BenchReport, console: Console) -> None:
    """Print ``report`` as a header and a table."""
    from rich.table import Table

    p, r = report.problem, report.result
    gpu = report.gpu or {}
    gpu_text = (
        f"{gpu.get('name')} (cc {gpu.get('compute_capability')}, {gpu.get('sm_count')} SMs, "
        f"driver {gpu.get('driver_version')}, CUDA {gpu.get('cuda_version')})"
        if gpu
        else "unknown GPU"
    )
    mask = "causal" if p.causal else "full"
    console.print(f"[bold]{report.config.name}[/bold] on {gpu_text}")
    console.print(
        f"problem: B={p.batch} Hq={p.heads} Hkv={p.n_kv_heads} Nq={p.n} Nk={p.n_keys} D={p.d} "
        f"{p.dtype} {mask}, layout {report.layout}, {p.flops / 1e12:.3f} TFLOP"
    )
    if report.build is not None:
        b = report.build
        console.print(
            f"build: {b['status']} ({b['arch']}), {b['registers']} regs, spills "
            f"{b['spill_stores']}/{b['spill_loads']} B, stack {b['stack_bytes']} B"
        )
    if r.driver_registers is not None:
        console.print(
            f"driver: {r.driver_registers} regs, {r.driver_local_bytes} B local per thread"
        )

    table = Table(show_header=True, header_style="bold")
    for col in ("", "status", "median ms", "p10 ms", "p90 ms", "TFLOP/s", "max |err|", "speedup"):
        table.add_column(col, justify="left" if col in ("", "status") else "right", no_wrap=True)
    table.add_row(
        "ours",
        str(r.status),
        _ms(r.median_ms),
        _ms(r.p10_ms),
        _ms(r.p90_ms),
        _num(r.tflops),
        _num(r.max_abs_err, ".2e"),
        "",
    )
    for name, t in report.sdpa.items():
        sp = report.speedup(name)
        table.add_row(
            f"sdpa {name}",
            t.status,
            _ms(t.median_ms),
            _ms(t.p10_ms),
            _ms(t.p90_ms),
            _num(t.tflops),
            _num(t.max_abs_err, ".2e"),
            f"{sp:.2f}x" if sp is not None else "-",
        )
    console.print(table)
    if r.ref_err is not None:
        console.print(
            f"reference: sdpa error {r.ref_err:.2e} on the same inputs; "
            f"rel err {_num(r.rel_err, '.2e')}"
        )
    if r.error:
        console.print(f"[red]error:[/red] {r.error}", markup=True, highlight=False)
    for name, t in report.sdpa.items():
        if t.status != "OK" or t.note:
            console.print(
                f"sdpa {name}: {t.status if t.status != 'OK' else 'note'}: {t.note}",
                highlight=False,
            )
    if report.sdpa:
        console.print("speedup = the backend's median / ours (above 1: ours is faster)")
