"""Compiling test-only CUDA source (a harness, not a config) with the product's nvcc flags.

Shared by the fa3 compile tests: the source is compiled for sm_90a against the templates;
the caller gets whether nvcc succeeded and its whole output, to assert on a refusal's text.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from codegen.build import nvcc_flags
from codegen.families.fa3.space import ARCH
from codegen.render import template_dir
from core.settings import get_settings


def compile_fa3_harness(source: str, name: str, workdir: Path) -> tuple[bool, str]:
    """Compile harness-only source (not a config) for sm_90a with the product's flags."""
    cu = workdir / f"{name}.cu"
    cu.write_text(source)
    out = cu.with_suffix(".cubin")
    cmd = [get_settings().nvcc, *nvcc_flags(ARCH), f"-I{template_dir()}", str(cu), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return proc.returncode == 0, proc.stdout + proc.stderr
