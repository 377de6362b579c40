"""Compiling test-only CUDA source (a harness, not a config) with the product's nvcc flags.

Shared by the fa3 compile tests: the source is compiled for sm_90a against the templates;
the caller gets whether nvcc succeeded and its whole output, to assert on a refusal's text.
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path
from typing import Any

from codegen.build import nvcc_flags
from codegen.families.fa3.space import ARCH
from codegen.render import template_dir
from core.settings import get_settings

log = logging.getLogger(__name__)


def compile_fa3_harness(source: str, name: str, workdir: Path) -> tuple[bool, str]:
    """Compile harness-only source (not a config) for sm_90a with the product's flags."""
    cu = workdir / f"{name}.cu"
    cu.write_text(source)
    out = cu.with_suffix(".cubin")
    cmd = [get_settings().nvcc, *nvcc_flags(ARCH), f"-I{template_dir()}", str(cu), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return proc.returncode == 0, proc.stdout + proc.stderr


#: (plain tile, [(page size, variant switches), ...]) of a cache-kernel compile test.
CacheSample = list[tuple[Any, list[tuple[int, dict[str, bool]]]]]


def build_cache_twins(sample: CacheSample, cache_dir: Path) -> list[tuple[Any, Any, Any]]:
    """Build each plain tile of ``sample`` and its cache twins (``kvcache=True``, the page
    size and switches given) through the product's build (sm_90; fa3 builds sm_90a), check
    each built and usable (no more than ``SPILLS``), and return ``(twin config, its report,
    the plain tile's report)`` per twin, each logged with its registers and spills."""
    from dataclasses import replace

    from codegen.build import build_configs
    from core.build_report import BuildStatus

    twins = [(tile, replace(tile, kvcache=True, page=p, **sw)) for tile, v in sample
             for p, sw in v]  # fmt: skip
    configs = list(dict.fromkeys([t for t, _ in twins] + [c for _, c in twins]))
    reports = {r.config.name: r for r in build_configs(configs, "sm_90", cache_dir=cache_dir,
                                                       jobs=2)}  # fmt: skip
    out = []
    for tile, config in twins:
        base, r = reports[tile.name], reports[config.name]
        assert base.usable, base.error
        log.info("%s: %s regs, %s B spill stores (plain tile: %s regs, %s B)", config.name,
                 r.registers, r.spill_stores, base.registers, base.spill_stores)  # fmt: skip
        assert r.status in (BuildStatus.OK, BuildStatus.SPILLS), f"{config.name}: {r.error}"
        assert r.usable, config.name
        out.append((config, r, base))
    return out


def build_host_probe(cwd: Path, *args: str) -> None:
    """Build a header's client program with nvcc (``-std=c++17``, device code unoptimised:
    ``-Xcicc -O0``; these programs check what compiles and what the host-side dispatch picks,
    the kernels' optimised builds are the families' compile tests'), failing on an error or a
    warning."""
    nvcc = get_settings().nvcc
    proc = subprocess.run([nvcc, "-std=c++17", "-Xcicc", "-O0", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, f"nvcc failed:\n{proc.stdout}\n{proc.stderr}"
    assert "warning" not in proc.stderr.lower(), proc.stderr
