"""The worker's isolation protocol, on the CPU with the fake handler (no GPU, no torch)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.build_report import BuildReport, BuildStatus
from core.fa2_config import Fa2Config
from core.problem import Problem
from core.records import MeasureResult, MeasureStatus
from measure.child import WorkerContext, make_handler, resolve
from measure.jobs import BenchJob, MeasureOptions
from measure.lru import Lru
from measure.timing import TimingOptions
from measure.worker import BenchWorker, WorkerStartError
from tests.support.fake_handlers import FAKE, FakeOptions

CONFIG = Fa2Config.from_name("fa2_d64_fp16_full_br64_bc64_w2_s1_pad0")
PROBLEM = Problem(gpu="fake", d=64, n=256, batch=2, heads=4)


def job(**options: Any) -> BenchJob:
    return BenchJob(CONFIG, "/nonexistent.cubin", PROBLEM, FakeOptions(**options))


@pytest.fixture
def worker() -> Iterator[BenchWorker]:
    w = BenchWorker(device=0, job_timeout_s=1.5, start_timeout_s=60, handler=FAKE, kill_wait_s=5)
    with w:
        yield w


def test_ok_job_returns_result_from_the_child(worker: BenchWorker) -> None:
    res = worker.measure(job(median_ms=2.0))
    assert res.status == MeasureStatus.OK
    assert res.median_ms == 2.0
    assert res.tflops == pytest.approx(PROBLEM.tflops(2.0))
    assert res.extra["pid"] == worker.pid
    assert res.extra["worker_pid"] == worker.pid
    assert "worker_restarted" not in res.extra
    assert worker.restarts == 0


def test_hang_times_out_and_the_worker_is_replaced(worker: BenchWorker) -> None:
    pid = worker.pid
    t0 = time.monotonic()
    res = worker.measure(job(fake="sleep", seconds=60))
    assert time.monotonic() - t0 < 15
    assert res.status == MeasureStatus.TIMEOUT
    assert res.extra["phase"] == "sleep"
    assert res.extra["worker_restarted"] is True
    assert "killed" in (res.error or "")
    assert worker.restarts == 1
    after = worker.measure(job())
    assert after.status == MeasureStatus.OK
    assert after.extra["pid"] != pid


def test_abrupt_exit_is_runtime_failed_and_replaced(worker: BenchWorker) -> None:
    pid = worker.pid
    res = worker.measure(job(fake="exit", code=7))
    assert res.status == MeasureStatus.RUNTIME_FAILED
    assert "exit code 7" in (res.error or "")
    assert res.extra["worker_restarted"] is True
    after = worker.measure(job())
    assert after.status == MeasureStatus.OK
    assert after.extra["pid"] != pid
    assert worker.restarts == 1


def test_exception_is_runtime_failed_and_the_worker_stays(worker: BenchWorker) -> None:
    pid = worker.pid
    res = worker.measure(job(fake="raise"))
    assert res.status == MeasureStatus.RUNTIME_FAILED
    assert "fake handler failure" in (res.error or "")
    assert "traceback" in res.extra
    assert worker.pid == pid
    assert worker.measure(job()).extra["pid"] == pid
    assert worker.restarts == 0


def test_fatal_error_returns_the_result_and_replaces_the_worker(worker: BenchWorker) -> None:
    pid = worker.pid
    res = worker.measure(job(fake="fatal"))
    assert res.status == MeasureStatus.RUNTIME_FAILED
    assert res.error == "fake fatal error"
    assert res.extra["worker_restarted"] is True
    assert worker.measure(job()).extra["pid"] != pid


def test_progress_restarts_the_timeout(worker: BenchWorker) -> None:
    # 4 steps of 0.8 s: 3.2 s in all, longer than the 1.5 s timeout, but never silent that long.
    res = worker.measure(job(fake="progress", steps=4, seconds=0.8))
    assert res.status == MeasureStatus.OK
    assert worker.restarts == 0


def test_many_failures_in_a_row_then_ok(worker: BenchWorker) -> None:
    statuses = [
        worker.measure(job(fake=mode)).status for mode in ("exit", "raise", "fatal", "wrong", "ok")
    ]
    assert statuses == [
        MeasureStatus.RUNTIME_FAILED,
        MeasureStatus.RUNTIME_FAILED,
        MeasureStatus.RUNTIME_FAILED,
        MeasureStatus.WRONG_RESULT,
        MeasureStatus.OK,
    ]
    assert worker.restarts == 2


def test_measure_accepts_a_build_report_and_a_problem(worker: BenchWorker, tmp_path: Path) -> None:
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(b"")
    report = BuildReport(
        config=CONFIG,
        arch="sm_90",
        status=BuildStatus.OK,
        registers=100,
        spill_stores=0,
        spill_loads=0,
        stack_bytes=0,
        static_smem=0,
        compile_seconds=1.0,
        cubin=cubin,
        source_hash="x",
        nvcc_version="13.0",
    )
    res = worker.measure(report, PROBLEM)
    assert res.status == MeasureStatus.OK
    with pytest.raises(ValueError, match="problem"):
        worker.measure(report)


def test_measure_accepts_a_plain_dict(worker: BenchWorker) -> None:
    # A job's dict form carries the product's options only, not the fake's knobs, so the fake
    # answers with its default (OK, 1 ms) rather than the "wrong" the typed job asks for.
    res = worker.measure(job(fake="wrong", median_ms=5.0).to_dict())
    assert res.status == MeasureStatus.OK
    assert res.median_ms == 1.0
    assert worker.measure(job(fake="wrong")).status == MeasureStatus.WRONG_RESULT


def test_bad_handler_path_fails_to_start() -> None:
    w = BenchWorker(handler="tuner.no_such_module:handle", start_timeout_s=60)
    with pytest.raises(WorkerStartError, match="no_such_module"):
        w.start()
    assert w.pid is None
    w.close()


def test_gpu_info_is_none_without_the_gpu_handler(worker: BenchWorker) -> None:
    assert worker.gpu_info is None
    info = worker.ready_info
    assert info is not None and info["pid"] == worker.pid and info["device"] == 0


def test_close_is_idempotent_and_restartable() -> None:
    w = BenchWorker(handler=FAKE, start_timeout_s=60)
    w.start()
    first = w.pid
    w.close()
    w.close()
    assert w.pid is None
    assert w.measure(job()).status == MeasureStatus.OK  # starts a new child on demand
    assert w.pid != first
    w.close()


def test_invalid_timeouts_are_rejected() -> None:
    with pytest.raises(ValueError):
        BenchWorker(job_timeout_s=0)


# --------------------------------------------------------------------------- plain data


def test_measure_result_round_trips_through_dict() -> None:
    res = MeasureResult(
        status=MeasureStatus.OK,
        median_ms=1.5,
        p10_ms=1.4,
        p90_ms=1.6,
        reps=100,
        tflops=300.0,
        max_abs_err=1e-4,
        rel_err=2e-4,
        ref_err=3e-4,
        driver_registers=128,
        driver_local_bytes=0,
        extra={"seed": 5, "sdpa": {"flash": {"median_ms": 2.0}}},
    )
    d = res.to_dict()
    assert d["status"] == "OK"
    assert MeasureResult.from_dict(d) == res


def test_result_from_dict_tolerates_missing_optional_keys() -> None:
    res = MeasureResult.from_dict({"status": "TIMEOUT", "error": "hang"})
    assert res == MeasureResult(status=MeasureStatus.TIMEOUT, error="hang")


def test_job_and_options_round_trip() -> None:
    opts = MeasureOptions(
        layout="bhnd",
        timing=TimingOptions(warmup=2, target_ms=50.0, flush_l2=False),
        sdpa=True,
        seed=7,
        symbol="k",
    )
    assert MeasureOptions.from_dict(opts.to_dict()) == opts
    j = BenchJob.make(CONFIG, "/x.cubin", PROBLEM, opts)
    assert BenchJob.from_dict(j.to_dict()) == j
    assert Fa2Config.from_dict(j.to_dict()["config"]) == CONFIG
    assert Problem.from_dict(j.to_dict()["problem"]) == PROBLEM
    with pytest.raises(ValueError, match="layout"):
        MeasureOptions(layout="nhbd")  # type: ignore[arg-type]


def test_problem_from_dict_keeps_gqa_and_nk() -> None:
    p = Problem(gpu="g", d=128, n=100, nk=300, kv_heads=2, heads=8, causal=True, dtype="bf16")
    assert Problem.from_dict(p.to_dict()) == p


def test_lru_evicts_the_least_recently_used() -> None:
    dropped: list[int] = []
    lru: Lru[str, int] = Lru(2, on_evict=dropped.append)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # "b" is now the oldest
    lru.put("c", 3)
    assert dropped == [2]
    assert "b" not in lru and "a" in lru and len(lru) == 2
    lru.clear()
    assert sorted(dropped) == [1, 2, 3]


def test_resolve_and_make_handler_in_process() -> None:
    assert callable(resolve(FAKE))
    with pytest.raises(ValueError):
        resolve("no_colon")
    handler = make_handler(FAKE, WorkerContext(0, None))
    out = handler.handle(job(median_ms=4.0))
    assert out.status == MeasureStatus.OK and out.median_ms == 4.0


def test_pool_spreads_jobs_and_keeps_their_order() -> None:
    from measure.worker import WorkerPool

    jobs = [job(median_ms=float(i + 1), fake="progress", steps=1, seconds=0.2) for i in range(6)]
    jobs[2] = job(fake="exit")
    with WorkerPool([0, 1], handler=FAKE, job_timeout_s=10, start_timeout_s=60) as pool:
        results = pool.measure_all(jobs)
        pids = {w.pid for w in pool.workers}
    assert [r.status for r in results] == [MeasureStatus.OK] * 2 + [
        MeasureStatus.RUNTIME_FAILED
    ] + [MeasureStatus.OK] * 3
    assert [r.median_ms for r in results if r.status == MeasureStatus.OK] == [
        1.0,
        2.0,
        4.0,
        5.0,
        6.0,
    ]
    handled_by = {r.extra["worker_pid"] for r in results}
    assert len(handled_by) >= 2  # both workers took jobs
    assert len(pids) == 2


def test_a_worker_that_died_while_idle_is_restarted_before_the_next_job(
    worker: BenchWorker,
) -> None:
    import os
    import signal

    pid = worker.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    res = worker.measure(job())
    assert res.status == MeasureStatus.OK
    assert res.extra["pid"] != pid
