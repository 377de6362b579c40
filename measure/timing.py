"""Timing of GPU launches with CUDA events, and the statistics of the samples.

How a launch is timed (:func:`time_launches`):

* One CUDA event pair per repetition, recorded on the current stream around the launch only.
  The per-rep samples give a median and percentiles instead of one averaged figure, so a stray
  slow rep (clock change, another process) does not move the result.
* **Cold L2 by flushing.** Between repetitions a buffer of at least twice the L2 size is
  zeroed (outside the event pair). We flush rather than rotate input copies because the
  attention inputs can be larger than what would fit several times in memory at large N, and a
  flush gives the same "inputs come from HBM" condition at every size. ``rotate`` (a list of
  argument sets used round-robin) is still accepted for callers that prefer rotation, and
  ``flush_l2=False`` times a warm L2.
* **The GPU is kept behind the CPU.** If the CPU were slower at enqueueing a rep than the GPU
  at running it, the start event would fire while the GPU waits for the launch and the wait
  would be counted. Each batch of reps is therefore preceded by a sleep kernel
  (``torch.cuda._sleep``) long enough to cover the CPU's enqueue time of the batch; it runs
  outside every event pair.
* **Adaptive repetition count.** After the warm-up a few timed launches estimate the kernel's
  time and the count is chosen to fill about ``target_ms`` of kernel time, clamped to
  ``[min_reps, max_reps]`` and to ``budget_ms`` in all.

The pure statistics (:func:`summarize`, :func:`percentile`, :func:`choose_reps`) need no GPU.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

#: Reps enqueued behind one sleep kernel.
_BATCH = 64
#: Never sleep longer than this before a batch (the sleep only has to cover CPU enqueue time).
_MAX_SLEEP_MS = 50.0
#: Flush buffer size when the device does not report its L2 size.
_DEFAULT_FLUSH_BYTES = 256 << 20


@dataclass(frozen=True)
class TimingStats:
    """Summary of per-launch times in milliseconds.

    Attributes:
        median_ms: median of the samples (the figure the tuner ranks by).
        p10_ms: 10th percentile (linear interpolation between order statistics).
        p90_ms: 90th percentile.
        reps: number of samples.
        mean_ms: arithmetic mean.
        stdev_ms: sample standard deviation (0 for a single sample).
    """

    median_ms: float
    p10_ms: float
    p90_ms: float
    reps: int
    mean_ms: float
    stdev_ms: float

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TimingStats:
        return cls(
            median_ms=float(data["median_ms"]),
            p10_ms=float(data["p10_ms"]),
            p90_ms=float(data["p90_ms"]),
            reps=int(data["reps"]),
            mean_ms=float(data["mean_ms"]),
            stdev_ms=float(data["stdev_ms"]),
        )


#: The ways to flush L2 between reps (TimingOptions.flush_by).
FlushKind = Literal["write", "read"]
FLUSH_KINDS: tuple[str, ...] = get_args(FlushKind)


@dataclass(frozen=True)
class TimingOptions:
    """How :func:`time_launches` is driven; the worker passes these through from a job.

    Attributes:
        warmup: untimed launches before anything is measured.
        target_ms: kernel time to spend measuring, which sets the repetition count.
        min_reps: fewest timed reps (unless ``budget_ms`` forbids; never fewer than 3).
        max_reps: most timed reps.
        budget_ms: cap on estimated kernel time of all reps, for very slow configs.
        flush_l2: flush L2 between reps (cold-L2 timing).
        flush_by: how (:data:`FLUSH_KINDS`): ``"write"`` (the default, every campaign's) zeroes
            the flush buffer, which leaves L2 full of dirty lines that the timed call's reads
            evict, so its HBM also carries their write-back; ``"read"`` reads the buffer, which
            leaves clean lines. Both leave none of the call's data in L2; they differ for calls
            whose bytes are comparable to the L2 size (B = 1 decode).
    """

    warmup: int = 5
    target_ms: float = 200.0
    min_reps: int = 10
    max_reps: int = 2000
    budget_ms: float = 5000.0
    flush_l2: bool = True
    flush_by: FlushKind = "write"

    def __post_init__(self) -> None:
        if self.flush_by not in FLUSH_KINDS:
            raise ValueError(f"flush_by must be one of {FLUSH_KINDS}, got {self.flush_by!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TimingOptions:
        known = {f: data[f] for f in cls.__dataclass_fields__ if f in data}
        return cls(**known)


def percentile(sorted_samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of already sorted samples, linearly interpolated.

    Matches ``numpy.percentile``'s default ("linear") method.

    Raises:
        ValueError: on an empty sequence or ``q`` outside [0, 100].
    """
    if not sorted_samples:
        raise ValueError("percentile of no samples")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    pos = (len(sorted_samples) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_samples) - 1)
    frac = pos - lo
    return sorted_samples[lo] + (sorted_samples[hi] - sorted_samples[lo]) * frac


def summarize(samples: Sequence[float]) -> TimingStats:
    """Median, p10, p90, mean and standard deviation of per-launch times (ms).

    Raises:
        ValueError: when ``samples`` is empty or holds a negative or non-finite value (a
            broken measurement must not become a fast-looking result).
    """
    if not samples:
        raise ValueError("no timing samples")
    bad = [s for s in samples if not math.isfinite(s) or s < 0.0]
    if bad:
        raise ValueError(f"invalid timing samples: {bad[:5]}")
    ordered = sorted(float(s) for s in samples)
    return TimingStats(
        median_ms=float(statistics.median(ordered)),
        p10_ms=percentile(ordered, 10.0),
        p90_ms=percentile(ordered, 90.0),
        reps=len(ordered),
        mean_ms=float(statistics.fmean(ordered)),
        stdev_ms=float(statistics.stdev(ordered)) if len(ordered) > 1 else 0.0,
    )


def choose_reps(
    estimate_ms: float,
    *,
    target_ms: float = 200.0,
    min_reps: int = 10,
    max_reps: int = 2000,
    budget_ms: float = 5000.0,
) -> int:
    """Repetitions that fill about ``target_ms`` of kernel time.

    The count is clamped to ``[min_reps, max_reps]``; ``budget_ms`` then caps the total for
    very slow kernels (a 2 s launch is timed a few times, not ``min_reps`` times), but never
    below 3 samples so a median still means something.

    Raises:
        ValueError: on inconsistent bounds.
    """
    if min_reps < 1 or max_reps < min_reps:
        raise ValueError(f"bad rep bounds: min_reps={min_reps}, max_reps={max_reps}")
    per = max(estimate_ms, 1e-6)
    reps = min(max(round(target_ms / per), min_reps), max_reps)
    by_budget = max(3, math.floor(budget_ms / per))
    return max(1, min(reps, by_budget, max_reps))


# --------------------------------------------------------------------------- GPU side


_flush_buffers: dict[int, torch.Tensor] = {}
_sleep_cycles_per_ms: dict[int, float] = {}


def l2_flush_bytes(device: int) -> int:
    """Bytes written per flush on ``device``: twice its L2 (at least 64 MiB)."""
    import torch

    l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
    return max(2 * l2, 64 << 20) if l2 > 0 else _DEFAULT_FLUSH_BYTES


def _flush_buffer(device: int) -> torch.Tensor:
    import torch

    buf = _flush_buffers.get(device)
    if buf is None:
        buf = torch.empty(l2_flush_bytes(device), dtype=torch.uint8, device=f"cuda:{device}")
        _flush_buffers[device] = buf
    return buf


def _flusher(device: int, kind: FlushKind) -> Callable[[], object]:
    """The flush of ``device``'s L2 that ``kind`` names (see TimingOptions.flush_by)."""
    import torch

    buf = _flush_buffer(device)
    if kind == "write":
        return lambda: buf.zero_()
    if kind == "read":
        words = buf.view(torch.int32)
        return lambda: torch.sum(words, dtype=torch.int64)
    raise ValueError(f"flush_by must be one of {FLUSH_KINDS}, got {kind!r}")


def _cycles_per_ms(device: int) -> float | None:
    """Calibrate ``torch.cuda._sleep`` once per device (its unit is clock cycles)."""
    import torch

    if device in _sleep_cycles_per_ms:
        return _sleep_cycles_per_ms[device]
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        log.info("torch.cuda._sleep is unavailable; launches are not queued behind a sleep")
        return None
    cycles = 2_000_000
    sleep(cycles // 10)  # first call loads the kernel
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    sleep(cycles)
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end)
    rate = cycles / ms if ms > 0 else 1.5e6
    _sleep_cycles_per_ms[device] = rate
    return rate


def time_launches(
    fn: Callable[..., object],
    *,
    warmup: int = 5,
    reps: int | None = None,
    rotate: Sequence[Sequence[object]] | None = None,
    flush_l2: bool = True,
    flush_by: FlushKind = "write",
    target_ms: float = 200.0,
    min_reps: int = 10,
    max_reps: int = 2000,
    budget_ms: float = 5000.0,
    device: int | None = None,
) -> TimingStats:
    """Time ``fn`` (which enqueues GPU work on torch's current stream) with CUDA events.

    Args:
        fn: launches the work; called as ``fn(*args)`` with an argument set from ``rotate``,
            or ``fn()``. It must enqueue on ``torch.cuda.current_stream()``.
        warmup: untimed calls first (loads modules, warms clocks and caches).
        reps: timed calls; ``None`` chooses adaptively (see :func:`choose_reps`).
        rotate: argument sets used round-robin, rep ``i`` uses ``rotate[i % len(rotate)]``.
        flush_l2: flush L2 before every timed call (untimed): touch a buffer of twice its size.
        flush_by: ``"write"`` zeroes that buffer, ``"read"`` reads it (TimingOptions.flush_by).
        target_ms: adaptive mode: kernel time to spend measuring.
        min_reps: adaptive mode: fewest reps.
        max_reps: adaptive mode: most reps.
        budget_ms: adaptive mode: cap on the estimated total for very slow kernels.
        device: CUDA device index; the current device when ``None``.

    Returns:
        The statistics of the per-call times in milliseconds.

    Raises:
        RuntimeError: from torch when the work faults (the caller decides whether the CUDA
            context survived).
    """
    import torch

    dev = torch.cuda.current_device() if device is None else device
    with torch.cuda.device(dev):
        arg_sets: list[Sequence[object]] = [tuple(a) for a in rotate] if rotate else [()]
        flush = _flusher(dev, flush_by) if flush_l2 else None
        cycles_per_ms = _cycles_per_ms(dev)

        def one(i: int) -> None:
            fn(*arg_sets[i % len(arg_sets)])

        # Warm-up, and the CPU's enqueue cost per rep (the GPU is not waited for here). The first
        # call is left out of the estimate: it may load modules or allocate.
        n_warm = max(warmup, 2)
        t0 = time.perf_counter()
        for i in range(n_warm):
            if i == 1:
                t0 = time.perf_counter()
            if flush is not None:
                flush()
            one(i)
        cpu_ms_per_rep = (time.perf_counter() - t0) * 1e3 / (n_warm - 1)
        torch.cuda.synchronize(dev)

        if reps is None:
            probe = _timed(one, 3, flush, cycles_per_ms, cpu_ms_per_rep)
            estimate = statistics.median(probe)
            reps = choose_reps(
                estimate,
                target_ms=target_ms,
                min_reps=min_reps,
                max_reps=max_reps,
                budget_ms=budget_ms,
            )
            log.debug("estimate %.4f ms -> %d reps", estimate, reps)
        if reps < 1:
            raise ValueError(f"reps must be >= 1, got {reps}")
        return summarize(_timed(one, reps, flush, cycles_per_ms, cpu_ms_per_rep))


def time_with_options(
    fn: Callable[..., object], options: TimingOptions, *, device: int | None = None
) -> TimingStats:
    """:func:`time_launches` driven by ``options`` (adaptive rep count, no argument rotation)."""
    return time_launches(
        fn,
        warmup=options.warmup,
        flush_l2=options.flush_l2,
        flush_by=options.flush_by,
        target_ms=options.target_ms,
        min_reps=options.min_reps,
        max_reps=options.max_reps,
        budget_ms=options.budget_ms,
        device=device,
    )


def _timed(
    one: Callable[[int], None],
    reps: int,
    flush: Callable[[], object] | None,
    cycles_per_ms: float | None,
    cpu_ms_per_rep: float,
) -> list[float]:
    """Enqueue ``reps`` event-bracketed calls in batches behind sleep kernels; wait; read."""
    import torch

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    sleep = getattr(torch.cuda, "_sleep", None)
    for b0 in range(0, reps, _BATCH):
        b1 = min(b0 + _BATCH, reps)
        if sleep is not None and cycles_per_ms is not None:
            # 1.5x the enqueue time of this batch plus a margin: the GPU starts the batch only
            # once the CPU is (almost) done enqueueing it.
            ms = min(_MAX_SLEEP_MS, 1.5 * cpu_ms_per_rep * (b1 - b0) + 0.05)
            sleep(int(ms * cycles_per_ms))
        t0 = time.perf_counter()
        for i in range(b0, b1):
            if flush is not None:
                flush()
            starts[i].record()
            one(i)
            ends[i].record()
        # The next batch's sleep follows what enqueueing actually cost.
        cpu_ms_per_rep = (time.perf_counter() - t0) * 1e3 / (b1 - b0)
    ends[-1].synchronize()
    torch.cuda.synchronize()  # surfaces a fault of any rep, not just the last
    return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
