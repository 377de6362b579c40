"""The isolation layer: one child process per GPU owns the CUDA context and measures jobs.

A kernel under test can hang, trap or write through a wild pointer. After a trap or an illegal
address the CUDA context is unusable for good, and a hung kernel can only be stopped by
ending its process. So the parent (search, CLI) never touches CUDA: a :class:`BenchWorker`
starts a child (:func:`measure.child.child_main`) with the ``spawn`` start method, sends it
jobs over a pipe and waits with a timeout. On a timeout it kills the child (``TIMEOUT``);
when the child dies, or reports that its context is gone, the job is ``RUNTIME_FAILED`` with
the reason. Either way a fresh child is started and the next job runs normally.

Jobs (:class:`~measure.jobs.BenchJob`) and results (:class:`~core.records.MeasureResult`)
cross the pipe as the frozen dataclasses they are; the message protocol and the handler
contract are in :mod:`measure.child`.

The job timeout counts from the job's last sign of life: every ``progress`` message restarts
the clock, so building inputs for a large problem and timing a slow config do not eat into
the time a hung launch is given.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import queue
import signal
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from types import TracebackType
from typing import TYPE_CHECKING, Any

from core.build_report import BuildReport
from core.problem import Problem
from core.records import GpuInfo, MeasureResult, MeasureStatus
from measure.child import child_main
from measure.jobs import BenchJob, MeasureOptions, failure

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

log = logging.getLogger(__name__)

#: The handler that measures on the GPU (:class:`measure.handler.GpuJobHandler`).
DEFAULT_HANDLER = "measure.handler:GpuJobHandler"


class WorkerError(RuntimeError):
    """The worker machinery itself failed (not a job)."""


class WorkerStartError(WorkerError):
    """The child could not be started or set up (no GPU, no torch, bad handler)."""


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class BenchWorker:
    """A measuring child process for one GPU, replaced whenever a job kills or hangs it.

    Example::

        with BenchWorker(device=0, job_timeout_s=30) as worker:
            result = worker.measure(BenchJob.make(config, cubin, problem))

    ``measure`` also accepts ``(BuildReport, Problem)`` so that ``worker.measure`` can be
    handed to the campaign as its ``measure_fn``.

    Not thread-safe: use one thread per worker.
    """

    def __init__(
        self,
        device: int = 0,
        *,
        job_timeout_s: float = 60.0,
        start_timeout_s: float = 300.0,
        handler: str = DEFAULT_HANDLER,
        options: MeasureOptions | None = None,
        log_level: int | None = None,
        kill_wait_s: float = 30.0,
    ) -> None:
        """Configure the worker; the child starts on :meth:`start` or the first job.

        Args:
            device: CUDA device index the child uses (``torch.cuda.set_device``).
            job_timeout_s: longest silence from the child during a job before it is killed.
            start_timeout_s: longest wait for a new child to import torch and set up CUDA.
            handler: import path of the job handler (see the module docstring).
            options: default options for jobs made from ``(BuildReport, Problem)``.
            log_level: the child's logging level (the parent's effective level if ``None``).
            kill_wait_s: how long to wait for a killed child to be reaped.
        """
        if job_timeout_s <= 0 or start_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        self.device = device
        self.job_timeout_s = job_timeout_s
        self.start_timeout_s = start_timeout_s
        self.handler = handler
        self.options = options or MeasureOptions()
        self.log_level = (
            log_level if log_level is not None else logging.getLogger().getEffectiveLevel()
        )
        self.kill_wait_s = kill_wait_s
        self.restarts = 0
        self._ctx = mp.get_context("spawn")
        self._proc: BaseProcess | None = None
        self._conn: Connection | None = None
        self._ready_info: dict[str, Any] | None = None
        self._next_id = 0

    # -- lifecycle

    def start(self, wait_ready: bool = True) -> None:
        """Start the child if none runs; wait until it is set up unless told otherwise.

        Raises:
            WorkerStartError: when the child fails to set up or does not answer in time.
        """
        if self._proc is None:
            self._spawn()
        if wait_ready:
            self._wait_ready()

    def _spawn(self) -> None:
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(
            target=child_main,
            args=(child, self.handler, self.device, self.log_level),
            name=f"fa2tune-worker-{self.device}",
            daemon=True,  # never outlives the parent
        )
        proc.start()
        child.close()  # so the parent sees EOF when the child dies
        self._proc, self._conn, self._ready_info = proc, parent, None
        log.debug("worker for device %d started, pid %s", self.device, proc.pid)

    def _wait_ready(self) -> None:
        if self._ready_info is not None:
            return
        assert self._proc is not None and self._conn is not None
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._kill()
                raise WorkerStartError(
                    f"worker for device {self.device} not ready within {self.start_timeout_s:g} s"
                )
            ready = wait([self._conn, self._proc.sentinel], timeout=remaining)
            if self._conn in ready:
                try:
                    kind, _, payload = self._conn.recv()
                except (EOFError, OSError):
                    kind, payload = "died", None
            elif ready:
                kind, payload = "died", None
            else:
                continue
            if kind == "ready":
                self._ready_info = dict(payload)
                log.info(
                    "worker for device %d ready (pid %s)", self.device, self._ready_info.get("pid")
                )
                return
            if kind == "setup_failed":
                self._kill()
                raise WorkerStartError(f"worker setup failed:\n{payload}")
            if kind == "died":
                proc = self._proc
                proc.join(1.0)
                reason = _exit_reason(proc.exitcode)
                self._kill()
                raise WorkerStartError(f"worker died while starting ({reason})")
            log.debug("ignoring %r before ready", kind)

    def close(self) -> None:
        """Stop the child (politely, then by force). The worker can be started again."""
        if self._proc is None:
            return
        try:
            if self._conn is not None:
                self._conn.send(("stop",))
            self._proc.join(5.0)
        except (OSError, ValueError):
            pass
        self._kill()

    def _kill(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc, self._conn, self._ready_info = None, None, None
        if proc is not None:
            if proc.is_alive():
                proc.kill()
            proc.join(self.kill_wait_s)
            if proc.is_alive():
                log.warning("worker pid %s did not exit after SIGKILL", proc.pid)
        if conn is not None:
            conn.close()

    def _replace(self) -> None:
        """Kill the child and start its successor at once (setup overlaps the caller's work)."""
        self._kill()
        self.restarts += 1
        self._spawn()

    def __enter__(self) -> BenchWorker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_proc", None) is not None:
            # At interpreter shutdown there is nothing sensible left to do about errors.
            with contextlib.suppress(Exception):
                self._kill()

    # -- information

    @property
    def pid(self) -> int | None:
        """Process id of the current child (``None`` when none runs)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def ready_info(self) -> dict[str, Any] | None:
        """What the child reported when it became ready (pid, device, handler's info)."""
        return self._ready_info

    @property
    def gpu_info(self) -> GpuInfo | None:
        """The GPU the child measures on (real handler only); starts the child if needed."""
        self.start()
        gpu = (self._ready_info or {}).get("gpu")
        return gpu if isinstance(gpu, GpuInfo) else None

    # -- jobs

    def measure(
        self,
        job: BenchJob | Mapping[str, Any] | BuildReport,
        problem: Problem | None = None,
        options: MeasureOptions | None = None,
    ) -> MeasureResult:
        """Run one job and return its result; never raises for a job's failure.

        Args:
            job: the job, its :meth:`~measure.jobs.BenchJob.to_dict` form, or a build report
                (then ``problem`` is required).
            problem: the problem, when ``job`` is a build report.
            options: options for a build report's job (the worker's defaults otherwise).

        Raises:
            WorkerStartError: when no child can be started at all (environment problem).
        """
        if isinstance(job, BuildReport):
            if problem is None:
                raise ValueError("measure(BuildReport, ...) needs the problem")
            payload = BenchJob.from_build(job, problem, options or self.options)
        elif isinstance(job, BenchJob):
            payload = job
        else:
            payload = BenchJob.from_dict(job)
        if self._proc is not None and not self._proc.is_alive():
            # Died between jobs (OOM killer, operator): not this job's fault, so start anew.
            log.warning("worker pid %s died while idle; restarting it", self._proc.pid)
            self._replace()
        self.start()
        assert self._conn is not None and self._proc is not None
        self._next_id += 1
        job_id = self._next_id
        pid = self._proc.pid
        started = time.monotonic()
        try:
            self._conn.send(("job", job_id, payload))
        except (OSError, ValueError) as exc:
            return self._died(job_id, "submit", pid, started, f"pipe broken: {exc}")
        phase = "queued"
        deadline = time.monotonic() + self.job_timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return self._timed_out(phase, pid, started)
            ready = wait([self._conn, self._proc.sentinel], timeout=remaining)
            if not ready:
                continue
            if self._conn in ready or self._conn.poll():
                try:
                    kind, got_id, body = self._conn.recv()
                except (EOFError, OSError):
                    return self._died(job_id, phase, pid, started)
                if got_id != job_id:
                    log.debug("ignoring %r for stale job %s", kind, got_id)
                    continue
                if kind == "progress":
                    phase = str(body)
                    deadline = time.monotonic() + self.job_timeout_s
                    continue
                if kind == "result":
                    return self._annotate(body, pid, started)
                if kind == "fatal":
                    self._replace()
                    return self._annotate(body, pid, started, worker_restarted=True)
                log.warning("unexpected message %r", kind)
                continue
            return self._died(job_id, phase, pid, started)

    def _annotate(
        self, result: MeasureResult, pid: int | None, started: float, **extra: Any
    ) -> MeasureResult:
        return replace(
            result,
            extra={
                **result.extra,
                "worker_pid": pid,
                "job_seconds": round(time.monotonic() - started, 3),
                **extra,
            },
        )

    def _timed_out(self, phase: str, pid: int | None, started: float) -> MeasureResult:
        log.warning(
            "worker pid %s silent for %g s in phase %r: killing it", pid, self.job_timeout_s, phase
        )
        self._replace()
        result = failure(
            MeasureStatus.TIMEOUT,
            f"no answer within {self.job_timeout_s:g} s in phase '{phase}'; "
            "worker killed and replaced",
            phase=phase,
        )
        return self._annotate(result, pid, started, worker_restarted=True)

    def _died(
        self, job_id: int, phase: str, pid: int | None, started: float, detail: str = ""
    ) -> MeasureResult:
        proc = self._proc
        if proc is not None:
            proc.join(5.0)
        reason = _exit_reason(proc.exitcode if proc is not None else None)
        log.warning("worker pid %s died in phase %r (%s)", pid, phase, reason)
        self._replace()
        msg = f"worker process died in phase '{phase}' ({reason})"
        result = failure(
            MeasureStatus.RUNTIME_FAILED, f"{msg}: {detail}" if detail else msg, phase=phase
        )
        return self._annotate(result, pid, started, worker_restarted=True)


class WorkerPool:
    """One :class:`BenchWorker` per GPU, measuring a batch of jobs in parallel.

    Each worker runs on its own thread and takes the next job from a shared queue, so a slow or
    restarting worker does not hold the others up. Results come back in job order.
    """

    def __init__(self, devices: Sequence[int], **worker_kwargs: Any) -> None:
        """Create (not start) one worker per device index; ``worker_kwargs`` go to each."""
        if not devices:
            raise ValueError("a pool needs at least one device")
        self.workers = [BenchWorker(device=d, **worker_kwargs) for d in devices]

    def start(self) -> None:
        """Start every worker and wait until all are ready (they set up in parallel)."""
        for w in self.workers:
            w.start(wait_ready=False)
        for w in self.workers:
            w.start()

    def measure_all(self, jobs: Sequence[BenchJob | Mapping[str, Any]]) -> list[MeasureResult]:
        """Measure ``jobs`` across the workers; one result per job, in order.

        Raises:
            WorkerStartError: when a worker cannot be started.
        """
        todo: queue.SimpleQueue[int] = queue.SimpleQueue()
        for i in range(len(jobs)):
            todo.put(i)
        results: list[MeasureResult | None] = [None] * len(jobs)

        def drain(worker: BenchWorker) -> None:
            while True:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                results[i] = worker.measure(jobs[i])

        with ThreadPoolExecutor(max_workers=len(self.workers)) as pool:
            for fut in [pool.submit(drain, w) for w in self.workers]:
                fut.result()
        return [r for r in results if r is not None]

    def close(self) -> None:
        """Stop every worker."""
        for w in self.workers:
            w.close()

    def __enter__(self) -> WorkerPool:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
