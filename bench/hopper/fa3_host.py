"""What only the fa3 harness needs on top of the product: parallel builds into a work
directory, the ptxas log of a build, the micro-tests' own nvcc call, and a one-call launcher
on torch's current stream.

Everything else is the product's: the config (:class:`core.fa3_config.Fa3Config`), its space
rules (:mod:`codegen.families.fa3.space`), rendering (the family registry, :mod:`codegen.families`),
the build (:func:`codegen.build.build_configs`, sm_90a for the Hopper family), TMA descriptors
(:mod:`codegen.families.fa3.host`) and loading / argument packing / launching
(:mod:`measure.loader`). The ABI is in docs/fa3_kernel.md.

CPU machines can import this module (torch and cuda-bindings are imported where used).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from codegen.build import build_configs, nvcc_flags  # noqa: E402
from codegen.families.fa3.space import ARCH, invalid_reasons  # noqa: E402
from codegen.ninja import LOG_SUFFIX  # noqa: E402
from codegen.render import template_dir  # noqa: E402
from core.build_report import BuildReport  # noqa: E402
from core.fa3_config import Fa3Config  # noqa: E402
from core.settings import get_settings  # noqa: E402
from measure.loader import BoundLaunch, LoadedKernel  # noqa: E402
from measure.params import Layout  # noqa: E402

if TYPE_CHECKING:
    import torch

#: The GPU architecture builds are asked for; the registry compiles fa3 for sm_90a on it.
GPU_ARCH = "sm_90"


def nvcc() -> str:
    """The product's nvcc (``FA2TUNE_NVCC`` or ``nvcc``)."""
    return get_settings().nvcc


def build(configs: Sequence[Fa3Config], workdir: Path, jobs: int = 8) -> dict[str, BuildReport]:
    """Build ``configs`` with the product's build (cached under ``workdir``), by config name.

    Raises:
        ValueError: a config outside the space (the harness only measures valid ones).
    """
    for c in configs:
        why = invalid_reasons(c)
        if why:
            raise ValueError(f"{c.name} is outside the space: {why}")
    reports = build_configs(list(configs), GPU_ARCH, cache_dir=workdir, jobs=max(1, jobs))
    return {r.config.name: r for r in reports}


def ptxas_log(report: BuildReport) -> str:
    """nvcc's output for a build (``-Xptxas -v``), empty when there is none."""
    if report.cubin is None:
        return report.error or ""
    log = report.cubin.with_name(report.config.name + LOG_SUFFIX)
    return log.read_text() if log.is_file() else ""


def summary(report: BuildReport) -> dict[str, Any]:
    """One build as a JSON row."""
    log = ptxas_log(report)
    return {
        "name": report.config.name,
        "ok": report.usable,
        "status": str(report.status),
        "seconds": round(report.compile_seconds, 2),
        "regs": report.registers,
        "spill_stores": report.spill_stores,
        "spill_loads": report.spill_loads,
        "stack": report.stack_bytes,
        "warnings": [ln for ln in log.splitlines() if "warning" in ln.lower()][:5],
    }


def compile_source(
    source: str, name: str, workdir: Path, *, extra: tuple[str, ...] = ()
) -> tuple[bool, Path, float, str]:
    """Compile harness-only CUDA (the micro-tests, static_assert probes) for sm_90a with the
    product's flags and templates: ``(ok, cubin, seconds, log)``."""
    workdir.mkdir(parents=True, exist_ok=True)
    cu, cubin = workdir / f"{name}.cu", workdir / f"{name}.cubin"
    cu.write_text(source)
    cmd = [nvcc(), *nvcc_flags(ARCH), f"-I{template_dir()}", *extra, str(cu), "-o", str(cubin)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return proc.returncode == 0, cubin, time.perf_counter() - t0, proc.stdout + proc.stderr


def load(report: BuildReport) -> LoadedKernel:
    """Load a build's kernel into the current context (dynamic smem limit raised)."""
    if report.cubin is None:
        raise ValueError(f"{report.config.name}: build {report.status} has no cubin")
    return LoadedKernel.for_config(report.config, report.cubin)


def bind(
    kernel: LoadedKernel,
    config: Fa3Config,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor | None,
    scale: float,
    layout: Layout,
) -> BoundLaunch:
    """The product's bound launch (params + TMA descriptors) on torch's current stream."""
    import torch

    stream = torch.cuda.current_stream().cuda_stream
    return kernel.bind_config(config, q, k, v, o, lse, scale, layout, stream)
