"""Benchmark one config on one problem (``fa2tune bench``), optionally against torch SDPA.

The kernel is built if needed (:func:`codegen.build.build_configs`), then verified and timed in
a :class:`~measure.worker.BenchWorker`. With ``sdpa=True`` the same worker job also times torch
SDPA's flash, efficient and cuDNN backends on the very same inputs
(:func:`measure.sdpa.sdpa_times`). Nothing is stored: the report is printed or returned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.build_report import BuildReport, BuildStatus
from core.family import AnyConfig
from core.problem import Problem
from core.records import MeasureResult, MeasureStatus
from core.variant import PLAIN, Variant
from measure.jobs import BenchJob, MeasureOptions
from measure.params import Layout
from measure.sdpa import SdpaTiming
from measure.timing import TimingOptions
from measure.worker import DEFAULT_HANDLER, BenchWorker

if TYPE_CHECKING:
    from rich.console import Console

log = logging.getLogger(__name__)

BuildFn = Callable[[Sequence[AnyConfig], str], list[BuildReport]]


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

    config: AnyConfig
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


def _default_build(configs: Sequence[AnyConfig], arch: str) -> list[BuildReport]:
    from codegen.build import build_configs

    return list(build_configs(list(configs), arch=arch))


_BUILD_STATUS = {
    BuildStatus.COMPILE_FAILED: MeasureStatus.COMPILE_FAILED,
    BuildStatus.SMEM_OVERFLOW: MeasureStatus.SMEM_OVERFLOW,
    BuildStatus.SPILLS: MeasureStatus.SPILLS,
}


def run_bench(
    config: AnyConfig,
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
    variant: Variant = PLAIN,
) -> BenchReport:
    """Build (unless ``cubin`` is given), verify and time ``config``; SDPA too with ``sdpa``.

    ``variant`` is the problem's attention variant: a config built with variant switches
    runs only on a variant they fit (else the report is SKIPPED with the reason), and SDPA is
    not timed for one.

    The worker starts before the build so its torch/CUDA start-up overlaps the compilation.

    Raises:
        ValueError: on inconsistent problem arguments.
        measure.worker.WorkerStartError: when no worker can be started.
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
            variant=variant,
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
        f"{p.dtype} {mask}{'' if p.variant.plain else ', ' + p.variant.describe()}, "
        f"layout {report.layout}, {p.flops / 1e12:.3f} TFLOP"
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
