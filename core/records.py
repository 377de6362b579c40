"""Measurement records passed from the GPU worker to the search and the store.

Part of the shared floor (:mod:`core`): written by :mod:`measure`, read by :mod:`tuner`,
:mod:`db` and :mod:`service`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any


class MeasureStatus(StrEnum):
    """Outcome of one (build, problem) measurement. Only OK measurements can become best."""

    OK = "OK"
    WRONG_RESULT = "WRONG_RESULT"  # ran, but disagrees with the float32 reference
    RUNTIME_FAILED = "RUNTIME_FAILED"  # trap, illegal address, launch failure, dead worker
    TIMEOUT = "TIMEOUT"  # the worker did not answer in time (hang); it was replaced
    COMPILE_FAILED = "COMPILE_FAILED"  # never ran: the build failed
    SPILLS = "SPILLS"  # not timed: the build spills more than --max-spill-bytes
    SMEM_OVERFLOW = "SMEM_OVERFLOW"  # never ran: needs more shared memory than the device has
    SKIPPED = "SKIPPED"  # never ran for another recorded reason


@dataclass(frozen=True)
class GpuInfo:
    """Provenance of the device a measurement was taken on."""

    name: str
    compute_capability: str  # "9.0"
    sm_count: int
    driver_version: str
    cuda_version: str  # CUDA runtime/toolkit version torch or the driver reports
    memory_bytes: int = 0
    smem_optin_bytes: int = 0  # max dynamic shared memory per block after opt-in
    l2_bytes: int = 0  # L2 cache size (0: not read)
    sm_clock_mhz: int | None = None  # clocks as found (never changed by fa2tune)
    mem_clock_mhz: int | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class MeasureResult:
    """What the worker returns for one (config, problem) job.

    Times are milliseconds per kernel launch; ``tflops`` is :meth:`Problem.tflops` of the median.
    ``max_abs_err``/``rel_err`` compare against a float32 reference; ``ref_err`` is the same
    figure for torch SDPA's flash backend on the same inputs (the error budget's yardstick).
    """

    status: MeasureStatus
    median_ms: float | None = None
    p10_ms: float | None = None
    p90_ms: float | None = None
    reps: int = 0
    tflops: float | None = None
    max_abs_err: float | None = None
    rel_err: float | None = None
    ref_err: float | None = None
    driver_registers: int | None = None
    driver_local_bytes: int | None = None
    error: str | None = None
    extra: dict[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["status"] = str(self.status)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MeasureResult:
        """Inverse of :meth:`to_dict`; tolerant of missing optional keys (unknown ones ignored)."""
        names = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        kwargs["status"] = MeasureStatus(str(data["status"]))
        kwargs["extra"] = dict(data.get("extra") or {})
        return cls(**kwargs)
