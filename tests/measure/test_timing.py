"""Timing statistics and repetition choice (pure Python, no GPU)."""

from __future__ import annotations

import contextlib
import math
import statistics
import sys
import types
from typing import Any

import pytest

from measure.timing import TimingOptions, TimingStats, choose_reps, percentile, summarize


def test_summarize_matches_the_definitions() -> None:
    samples = [5.0, 1.0, 4.0, 2.0, 3.0, 10.0, 6.0, 7.0, 9.0, 8.0]
    s = summarize(samples)
    assert s.reps == 10
    assert s.median_ms == 5.5
    # numpy's default "linear" percentile: position (n - 1) * q.
    assert s.p10_ms == pytest.approx(1.9)
    assert s.p90_ms == pytest.approx(9.1)
    assert s.mean_ms == pytest.approx(5.5)
    assert s.stdev_ms == pytest.approx(statistics.stdev(samples))


def test_summarize_single_sample() -> None:
    s = summarize([0.25])
    assert (s.median_ms, s.p10_ms, s.p90_ms, s.mean_ms, s.stdev_ms, s.reps) == (
        0.25,
        0.25,
        0.25,
        0.25,
        0.0,
        1,
    )


def test_median_is_robust_to_one_outlier() -> None:
    s = summarize([1.0] * 20 + [100.0])
    assert s.median_ms == 1.0
    assert s.p90_ms == 1.0
    assert s.mean_ms > 5.0


@pytest.mark.parametrize("bad", [[], [1.0, math.nan], [1.0, math.inf], [-0.1, 1.0]])
def test_summarize_rejects_broken_samples(bad: list[float]) -> None:
    with pytest.raises(ValueError):
        summarize(bad)


def test_percentile_bounds_and_interpolation() -> None:
    xs = [0.0, 10.0]
    assert percentile(xs, 0) == 0.0
    assert percentile(xs, 100) == 10.0
    assert percentile(xs, 25) == 2.5
    with pytest.raises(ValueError):
        percentile(xs, 101)
    with pytest.raises(ValueError):
        percentile([], 50)


def test_timing_stats_round_trip() -> None:
    s = summarize([1.0, 2.0, 3.0])
    d = s.to_dict()
    assert set(d) == {"median_ms", "p10_ms", "p90_ms", "reps", "mean_ms", "stdev_ms"}
    assert TimingStats.from_dict(d) == s


def test_timing_options_round_trip_ignores_unknown_keys() -> None:
    o = TimingOptions(warmup=1, target_ms=10.0, min_reps=3, max_reps=30, flush_l2=False)
    assert TimingOptions.from_dict({**o.to_dict(), "unknown": 1}) == o
    assert TimingOptions.from_dict({}) == TimingOptions()


def test_time_with_options_passes_every_option(monkeypatch: pytest.MonkeyPatch) -> None:
    import measure.timing

    calls: list[dict[str, Any]] = []
    stats = summarize([1.0])

    def fake(fn: object, **kwargs: Any) -> TimingStats:
        calls.append(kwargs)
        return stats

    monkeypatch.setattr(measure.timing, "time_launches", fake)
    o = TimingOptions(warmup=1, target_ms=10.0, min_reps=3, max_reps=30, budget_ms=99.0)
    assert measure.timing.time_with_options(lambda: None, o, device=1) is stats
    assert calls == [{**o.to_dict(), "device": 1}]


def test_choose_reps_fills_the_target() -> None:
    assert choose_reps(0.5, target_ms=100.0, min_reps=10, max_reps=1000) == 200


def test_choose_reps_clamps_to_floor_and_cap() -> None:
    assert choose_reps(50.0, target_ms=100.0, min_reps=10, max_reps=1000) == 10
    assert choose_reps(0.001, target_ms=100.0, min_reps=10, max_reps=1000) == 1000
    assert choose_reps(0.0, target_ms=100.0, min_reps=10, max_reps=1000) == 1000


def test_choose_reps_budget_caps_slow_kernels_but_keeps_three() -> None:
    # 2 s per launch: min_reps 10 would take 20 s; the 5 s budget allows 3 (the floor of 3).
    assert choose_reps(2000.0, target_ms=100.0, min_reps=10, max_reps=1000, budget_ms=5000) == 3
    assert choose_reps(400.0, target_ms=100.0, min_reps=10, max_reps=1000, budget_ms=5000) == 10
    assert choose_reps(600.0, target_ms=100.0, min_reps=10, max_reps=1000, budget_ms=5000) == 8


def test_choose_reps_rejects_bad_bounds() -> None:
    with pytest.raises(ValueError):
        choose_reps(1.0, min_reps=0)
    with pytest.raises(ValueError):
        choose_reps(1.0, min_reps=10, max_reps=5)


# --------------------------------------------------------------------------- time_launches' loop
# A stand-in for torch's CUDA API with a virtual GPU clock: every enqueued operation advances
# the clock by its duration, an event records the clock. This checks the control flow
# (warm-up, flush outside the event pair, rotation, adaptive rep count), not a real GPU.


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0
        self.log: list[str] = []


class _FakeCuda:
    def __init__(self, clock: _Clock) -> None:
        self.clock = clock
        clk = clock

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.t: float | None = None

            def record(self) -> None:
                self.t = clk.t
                clk.log.append("event")

            def synchronize(self) -> None:
                pass

            def elapsed_time(self, end: Event) -> float:
                assert self.t is not None and end.t is not None
                return end.t - self.t

        self.Event = Event

    def current_device(self) -> int:
        return 0

    def device(self, dev: int) -> Any:
        return contextlib.nullcontext()

    def synchronize(self, dev: int | None = None) -> None:
        pass

    def _sleep(self, cycles: int) -> None:
        self.clock.t += cycles / 1e6  # 1 GHz: 1e6 cycles per ms
        self.clock.log.append("sleep")

    def get_device_properties(self, dev: int) -> Any:
        return types.SimpleNamespace(L2_cache_size=50 << 20)


class _FlushBuffer:
    def __init__(self, clock: _Clock) -> None:
        self.clock = clock

    def zero_(self) -> None:
        self.clock.t += 5.0  # a slow flush: it must not show in the samples
        self.clock.log.append("flush")

    def view(self, dtype: str) -> _FlushBuffer:
        return self

    def read(self) -> None:
        self.clock.t += 3.0
        self.clock.log.append("read-flush")


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    from measure import timing

    clock = _Clock()
    fake = types.ModuleType("torch")
    fake.cuda = _FakeCuda(clock)  # type: ignore[attr-defined]
    fake.uint8 = "uint8"  # type: ignore[attr-defined]
    fake.empty = lambda *a, **k: _FlushBuffer(clock)  # type: ignore[attr-defined]
    fake.int32, fake.int64 = "int32", "int64"  # type: ignore[attr-defined]
    fake.sum = lambda buf, dtype: buf.read()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", fake)
    # Module caches keyed by device must not leak the fakes into real GPU tests.
    monkeypatch.setattr(timing, "_flush_buffers", {})
    monkeypatch.setattr(timing, "_sleep_cycles_per_ms", {})
    return clock


def test_time_launches_excludes_the_flush_and_rotates(fake_torch: _Clock) -> None:
    from measure.timing import time_launches

    seen: list[str] = []

    def kernel(tag: str, ms: float) -> None:
        seen.append(tag)
        fake_torch.t += ms
        fake_torch.log.append("kernel")

    stats = time_launches(kernel, warmup=2, reps=6, rotate=[("a", 0.5), ("b", 0.5), ("c", 0.5)])
    assert stats.reps == 6
    assert stats.median_ms == pytest.approx(0.5) and stats.stdev_ms == pytest.approx(0.0)
    assert seen[-6:] == ["a", "b", "c", "a", "b", "c"]
    # Each timed rep: flush, start event, kernel, end event (sleeps only between batches).
    tail = [x for x in fake_torch.log if x != "sleep"][-24:]
    assert tail == ["flush", "event", "kernel", "event"] * 6


def test_time_launches_adaptive_count_and_no_flush(fake_torch: _Clock) -> None:
    from measure.timing import time_launches

    def kernel() -> None:
        fake_torch.t += 2.0
        fake_torch.log.append("kernel")

    stats = time_launches(
        kernel, warmup=1, target_ms=40.0, min_reps=3, max_reps=100, flush_l2=False
    )
    assert stats.reps == 20  # 40 ms target / 2 ms per call
    assert stats.median_ms == pytest.approx(2.0)
    assert "flush" not in fake_torch.log


def test_time_launches_flush_by_read(fake_torch: _Clock) -> None:
    """flush_by="read" reads the buffer instead of zeroing it, outside the event pair."""
    from measure.timing import time_launches

    def kernel() -> None:
        fake_torch.t += 1.0
        fake_torch.log.append("kernel")

    stats = time_launches(kernel, warmup=1, reps=4, flush_by="read")
    assert stats.median_ms == pytest.approx(1.0)
    tail = [x for x in fake_torch.log if x != "sleep"][-16:]
    assert tail == ["read-flush", "event", "kernel", "event"] * 4
    assert "flush" not in fake_torch.log


def test_flush_kind_is_checked(fake_torch: _Clock) -> None:
    from measure.timing import time_launches

    with pytest.raises(ValueError, match="flush_by"):
        TimingOptions(flush_by="zero")
    with pytest.raises(ValueError, match="flush_by"):
        time_launches(lambda: None, reps=1, flush_by="zero")
    o = TimingOptions(flush_by="read")
    assert TimingOptions.from_dict(o.to_dict()) == o
