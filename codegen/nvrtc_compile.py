"""Compile one instantiation with NVRTC, with nvcc's command line shape: ``OPTIONS -o OUT SRC``.

The build runs it where it would run nvcc (``python nvrtc_compile.py <options> -o <cubin>
<source>``, through :mod:`codegen.nvcc_job`, which times it, kills it at its timeout and
keeps its output), so a machine with the driver and the ``cuda-bindings`` and
``nvidia-cuda-nvrtc`` wheels but no CUDA toolkit builds the same configs: NVRTC compiles the
source to a cubin for the ``--gpu-architecture`` given, and its log (ptxas's ``-v`` report
with ``--ptxas-options=-v``) goes to stderr in nvcc's format, which :mod:`codegen.ptxas`
reads. Options are NVRTC's (``-I`` and ``--pre-include`` included: the shims of
``codegen/rtc`` stand in for the toolkit's headers).

Exit status: 0 with the cubin written; 1 when the compilation failed; 127 when NVRTC cannot
be loaded (no ``cuda-bindings``, or no NVRTC library).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def nvrtc_module() -> Any:
    """``cuda.bindings.nvrtc``, its library loaded.

    Raises:
        ImportError: no cuda-bindings, or no NVRTC library it can load.
    """
    from cuda.bindings import nvrtc

    err, *_ = nvrtc.nvrtcVersion()  # loads the library: fails here if it is missing
    if int(err) != 0:
        raise ImportError(f"NVRTC is not usable: {err}")
    return nvrtc


def nvrtc_release() -> str:
    """``"NVRTC 13.0"``: the version of the NVRTC library cuda-bindings loads.

    Raises:
        ImportError: as :func:`nvrtc_module`.
    """
    _, major, minor = nvrtc_module().nvrtcVersion()
    return f"NVRTC {major}.{minor}"


def _check(result: tuple[Any, ...], what: str) -> Any:
    err, *rest = result
    if int(err) != 0:
        raise RuntimeError(f"{what}: {err}")
    return rest[0] if len(rest) == 1 else tuple(rest)


def compile_source(source: bytes, name: str, options: list[str]) -> tuple[bool, str, bytes]:
    """``(ok, log, cubin)`` of one NVRTC compilation (``cubin`` empty when it failed)."""
    nvrtc = nvrtc_module()
    prog = _check(nvrtc.nvrtcCreateProgram(source, name.encode(), 0, [], []), "create program")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
        size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "log size")
        log = b" " * size
        _check(nvrtc.nvrtcGetProgramLog(prog, log), "log")
        text = log.rstrip(b"\0 ").decode("utf-8", errors="replace")
        if int(err) != 0:
            return False, text, b""
        size = _check(nvrtc.nvrtcGetCUBINSize(prog), "cubin size")
        cubin = b" " * size
        _check(nvrtc.nvrtcGetCUBIN(prog, cubin), "cubin")
        return True, text, cubin
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def main(argv: list[str] | None = None) -> int:
    """``OPTIONS -o OUT SRC``: compile SRC to OUT; the log goes to stderr."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[-3] != "-o":
        sys.stderr.write("usage: nvrtc_compile.py [NVRTC options] -o OUT SRC\n")
        return 2
    options, out, src = args[:-3], Path(args[-2]), Path(args[-1])
    try:
        ok, log, cubin = compile_source(src.read_bytes(), src.name, options)
    except ImportError as exc:
        sys.stderr.write(f"error: NVRTC is not available: {exc}\n")
        return 127
    if log:
        sys.stderr.write(log if log.endswith("\n") else log + "\n")
    if not ok:
        return 1
    out.write_bytes(cubin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
