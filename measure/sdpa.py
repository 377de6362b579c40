"""Timing torch SDPA's own backends on a kernel's input set, for like-for-like comparisons.

Runs in the worker child (the GPU handler calls :func:`sdpa_times` when a job asks for
``MeasureOptions.sdpa``), on the very inputs the kernel is checked on, with the kernel's
timing settings, so the ratios compare like with like (same data, same L2 flushing, same
timing loop). torch is imported only when timing runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from measure.reference import SDPA_BACKENDS
from measure.timing import TimingOptions

if TYPE_CHECKING:
    from measure.reference import InputSet


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
        tflops: ``problem.tflops(median_ms)``.
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
    from measure.reference import SdpaUnsupported, errors_vs_reference, sdpa_callable
    from measure.timing import time_with_options

    t = timing or TimingOptions()
    qb, kb, vb = inputs.bhnd()
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
            tflops=inputs.problem.tflops(stats.median_ms) if stats.median_ms > 0 else None,
            max_abs_err=errs.max_abs if math.isfinite(errs.max_abs) else None,
            note=note,
        )
    return out
