"""What compiles the kernels: nvcc, or NVRTC where no CUDA toolkit is installed.

:func:`resolve_compiler` picks by ``settings.compiler`` (``FA2TUNE_COMPILER``): ``nvcc``;
``nvrtc`` (the NVRTC library of the ``nvidia-cuda-nvrtc`` wheel, reached through
``cuda-bindings``: what a ``pip install 'fa2tune[gpu]'`` next to torch has, with no toolkit);
or ``auto``, nvcc when it runs and NVRTC otherwise, saying so once. Both run through the same
ninja edges (:mod:`codegen.nvcc_job`): NVRTC as ``python nvrtc_compile.py OPTIONS -o OUT SRC``
(:mod:`codegen.nvrtc_compile`), whose log is nvcc's ptxas ``-v`` report, so the reports,
the spill checks and the cache are one path. NVRTC compiles the same templates with the
shims of ``codegen/rtc`` for the toolkit headers they include; its options, its version and
the shims' content are part of the build's cache key, so an NVRTC build never passes for an
nvcc one.
"""

from __future__ import annotations

import hashlib
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from codegen import nvrtc_compile

log = logging.getLogger(__name__)

#: The NVRTC shims' directory and the header NVRTC pre-includes.
RTC_DIR = Path(__file__).resolve().parent / "rtc"
PRELUDE = "fa_rtc_prelude.h"

#: NVRTC options that shape the cubin (nvcc's DEFAULT_FLAGS in NVRTC's words; NVRTC
#: optimises device code at -O3 by default), before the architecture.
NVRTC_FLAGS: tuple[str, ...] = ("-std=c++17", "--ptxas-options=-v", "-lineinfo")


class CompilerNotFoundError(RuntimeError):
    """Neither nvcc nor NVRTC can be run (``codegen.build.NvccNotFoundError`` subclasses it)."""


@lru_cache(maxsize=1)
def rtc_digest() -> str:
    """SHA-256 over the shims' names and contents (part of an NVRTC build's release)."""
    h = hashlib.sha256()
    for path in sorted(p for p in RTC_DIR.iterdir() if p.is_file() and p.name != "README.md"):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@dataclass(frozen=True)
class Compiler:
    """One way of compiling.

    Attributes:
        kind: ``nvcc`` or ``nvrtc``.
        executable: what the build runs: nvcc, or the Python interpreter (NVRTC's script
            comes first in its flags).
        release: the version line the reports and the cache key carry.
    """

    kind: str
    executable: str
    release: str

    def flags(self, target: str, nvcc_flags: list[str]) -> list[str]:
        """The options that shape the cubin for ``target`` (hashed and recorded);
        ``nvcc_flags``: :func:`codegen.build.nvcc_flags` of the target."""
        if self.kind == "nvcc":
            return nvcc_flags
        return [f"--gpu-architecture={target}", *NVRTC_FLAGS, f"--pre-include={PRELUDE}"]

    def command_flags(self, target: str, nvcc_flags: list[str], template_dir: Path) -> list[str]:
        """Everything after the executable of one compile, without ``-o OUT SRC``."""
        if self.kind == "nvcc":
            return [*nvcc_flags, "-I", str(template_dir)]
        options = [f"--gpu-architecture={target}", *NVRTC_FLAGS,
                   f"--pre-include={RTC_DIR / PRELUDE}"]  # fmt: skip
        return [nvrtc_compile.__file__, *options, "-I", str(template_dir), "-I", str(RTC_DIR)]


def nvrtc_compiler() -> Compiler:
    """NVRTC through cuda-bindings.

    Raises:
        CompilerNotFoundError: no cuda-bindings, or no NVRTC library it can load.
    """
    try:
        release = nvrtc_compile.nvrtc_release()
    except ImportError as exc:
        raise CompilerNotFoundError(
            f"NVRTC is not available ({exc}): pip install cuda-bindings nvidia-cuda-nvrtc"
        ) from exc
    return Compiler("nvrtc", sys.executable, f"{release}; fa2tune rtc shims {rtc_digest()[:12]}")


_told: set[str] = set()


def resolve_compiler(nvcc: str, choice: str, nvcc_release: Callable[[str], str]) -> Compiler:
    """The compiler ``choice`` names (``auto``, ``nvcc``, ``nvrtc``).

    Args:
        nvcc: the nvcc executable.
        choice: ``settings.compiler``.
        nvcc_release: ``codegen.build.nvcc_version`` (called for nvcc and auto; it raises
            ``NvccNotFoundError`` when nvcc cannot be run).

    Raises:
        CompilerNotFoundError: the chosen compiler (auto: either) cannot be run.
    """
    if choice == "nvrtc":
        return nvrtc_compiler()
    try:
        return Compiler("nvcc", nvcc, nvcc_release(nvcc))
    except CompilerNotFoundError as no_nvcc:
        if choice == "nvcc":
            raise
        try:
            compiler = nvrtc_compiler()
        except CompilerNotFoundError as no_nvrtc:
            raise type(no_nvcc)(f"{no_nvcc}; and {no_nvrtc}") from no_nvcc
        if compiler.release not in _told:
            _told.add(compiler.release)
            log.info("nvcc is not available (%s): compiling with %s", no_nvcc, compiler.release)
        return compiler
