"""What the compiler says about one build: the record every later stage reads.

Part of the shared floor (:mod:`core`): written by :mod:`codegen.build`, read by the
measurement stage, the search and the store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from core.family import AnyConfig


class BuildStatus(StrEnum):
    """Outcome of compiling one config for one architecture."""

    OK = "OK"
    SPILLS = "SPILLS"  # compiled, but ptxas reports spill stores or loads
    SMEM_OVERFLOW = "SMEM_OVERFLOW"  # static + dynamic shared memory over the device limit
    COMPILE_FAILED = "COMPILE_FAILED"


@dataclass(frozen=True)
class BuildReport:
    """One config compiled for one architecture, with ptxas's resource report.

    Attributes:
        config: the kernel configuration.
        arch: target, e.g. ``"sm_90"``.
        status: outcome; ``SPILLS`` builds are usable but not timed by default.
        registers: registers per thread (None when the build failed).
        spill_stores: bytes of spill stores reported by ptxas.
        spill_loads: bytes of spill loads reported by ptxas.
        stack_bytes: stack frame bytes per thread.
        static_smem: static shared memory bytes (dynamic smem is ``config.smem_bytes``).
        compile_seconds: wall time of the nvcc call.
        cubin: path of the cubin (None when the build failed).
        source_hash: hash of template + instantiation + flags + nvcc version + arch.
        nvcc_version: ``nvcc --version`` release line.
        flags: nvcc flags used.
        error: excerpt of the compiler's error output when the build failed.
    """

    config: AnyConfig
    arch: str
    status: BuildStatus
    registers: int | None
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    static_smem: int
    compile_seconds: float
    cubin: Path | None
    source_hash: str
    nvcc_version: str
    flags: tuple[str, ...] = field(default_factory=tuple)
    error: str | None = None

    @property
    def spill_bytes(self) -> int:
        """The larger of ptxas's spill stores and spill loads, in bytes per thread."""
        return max(self.spill_stores, self.spill_loads)

    @property
    def usable(self) -> bool:
        """True when a cubin exists that the worker can load."""
        return self.cubin is not None and self.status in (BuildStatus.OK, BuildStatus.SPILLS)
