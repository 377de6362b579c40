"""The isolation layer: one child process per GPU owns the CUDA context and measures jobs.

A kernel under test can hang, trap or write through a wild pointer. After a trap or an illegal
address the CUDA context is unusable for good, and a hung kernel can only be stopped by
ending its process. So the parent (search, CLI) never touches CUDA: a :class:`BenchWorker`
starts a child with the ``spawn`` start method, sends it jobs over a pipe and waits with a
timeout. On a timeout it kills the child (``TIMEOUT``); when the child dies, or reports that its
context is gone, the job is ``RUNTIME_FAILED`` with the reason. Either way a fresh child is
started and the next job runs normally.

Protocol (tuples over a duplex :func:`multiprocessing.Pipe`)::

    parent -> child   ("job", job_id, job_dict) | ("stop",)
    child -> parent   ("ready", None, info)            once, after the handler is set up
                      ("setup_failed", None, text)     the handler could not be set up
                      ("progress", job_id, phase)      the job entered a phase
                      ("result", job_id, result_dict)  a MeasureResult as a dict
                      ("fatal", job_id, result_dict)   as result, then the child exits

The job timeout counts from the job's last sign of life: every ``progress`` message restarts
the clock, so building inputs for a large problem and timing a slow config do not eat into
the time a hung launch is given.

The handler is named by import path and resolved inside the child, so the protocol is
testable without a GPU (``BenchWorker(handler="tuner.worker:fake_handle")``). A handler is
either a function ``handle(job: dict, ctx: WorkerContext) -> dict`` or a class constructed
as ``cls(ctx)`` with ``handle(job) -> dict`` and optionally ``ready_info() -> dict``. A
handler raises :class:`FatalJobError` to return a result and have the worker replaced; any
other exception becomes a ``RUNTIME_FAILED`` result and the worker carries on.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import multiprocessing as mp
import os
import queue
import signal
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace
from multiprocessing.connection import Connection, wait
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from codegen.config import KernelConfig
from codegen.report import BuildReport
from tuner.loader import LAYOUTS, Layout
from tuner.problem import Problem
from tuner.records import GpuInfo, MeasureResult, MeasureStatus
from tuner.timing import TimingOptions

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from tuner.loader import LoadedKernel
    from tuner.reference import InputSet

log = logging.getLogger(__name__)

DEFAULT_HANDLER = "tuner.worker:GpuJobHandler"


# --------------------------------------------------------------------------- job and result


@dataclass(frozen=True)
class MeasureOptions:
    """How one job is measured.

    Attributes:
        layout: storage of q, k, v and O (``"bnhd"`` or ``"bhnd"``).
        timing: warm-up, repetition and L2-flush settings.
        sdpa: also time torch SDPA's flash, efficient and cuDNN backends on the same inputs
            (result in ``extra["sdpa"]``).
        recheck: verify the output again after timing (catches races that show only
            sometimes).
        seed: input seed; a fresh one per input set when ``None``.
        max_pairs: (batch, head) pairs the reference covers on large problems.
        symbol: kernel symbol to launch instead of ``config.name`` (test kernels).
    """

    layout: Layout = "bnhd"
    timing: TimingOptions = field(default_factory=TimingOptions)
    sdpa: bool = False
    recheck: bool = True
    seed: int | None = None
    max_pairs: int = 3
    symbol: str | None = None

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "layout": self.layout,
            "timing": self.timing.to_dict(),
            "sdpa": self.sdpa,
            "recheck": self.recheck,
            "seed": self.seed,
            "max_pairs": self.max_pairs,
            "symbol": self.symbol,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MeasureOptions:
        """Build from :meth:`to_dict` output; unknown keys (e.g. a fake handler's) are ignored."""
        timing = data.get("timing")
        return cls(
            layout=data.get("layout", "bnhd"),
            timing=TimingOptions.from_dict(dict(timing)) if timing else TimingOptions(),
            sdpa=bool(data.get("sdpa", False)),
            recheck=bool(data.get("recheck", True)),
            seed=None if data.get("seed") is None else int(data["seed"]),
            max_pairs=int(data.get("max_pairs", 3)),
            symbol=data.get("symbol"),
        )


@dataclass(frozen=True)
class BenchJob:
    """One (config, cubin, problem) measurement request, picklable as plain data.

    Attributes:
        config: ``KernelConfig.to_dict()``.
        cubin: path of the cubin holding the kernel.
        problem: ``Problem.to_dict()``.
        options: ``MeasureOptions.to_dict()`` (handlers may read extra keys).
    """

    config: dict[str, Any]
    cubin: str
    problem: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def make(
        cls,
        config: KernelConfig,
        cubin: str | Path,
        problem: Problem,
        options: MeasureOptions | None = None,
    ) -> BenchJob:
        """A job from typed parts."""
        opts = options or MeasureOptions()
        return cls(config.to_dict(), str(cubin), problem.to_dict(), opts.to_dict())

    @classmethod
    def from_build(
        cls, report: BuildReport, problem: Problem, options: MeasureOptions | None = None
    ) -> BenchJob:
        """A job for a build's cubin.

        Raises:
            ValueError: when the build has no cubin.
        """
        if report.cubin is None:
            raise ValueError(f"{report.config.name}: build {report.status} has no cubin")
        return cls.make(report.config, report.cubin, problem, options)

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": dict(self.config),
            "cubin": self.cubin,
            "problem": dict(self.problem),
            "options": dict(self.options),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchJob:
        return cls(
            config=dict(data["config"]),
            cubin=str(data["cubin"]),
            problem=dict(data["problem"]),
            options=dict(data.get("options") or {}),
        )


def problem_from_dict(data: Mapping[str, Any]) -> Problem:
    """Inverse of ``Problem.to_dict()`` (unknown keys ignored)."""
    names = {f.name for f in fields(Problem)}
    return Problem(**{k: v for k, v in data.items() if k in names})


def failure(status: MeasureStatus, error: str, **extra: Any) -> dict[str, Any]:
    """A result dict for a job that produced no timing."""
    return MeasureResult(status=status, error=error, extra=dict(extra)).to_dict()


# --------------------------------------------------------------------------- child side


class FatalJobError(Exception):
    """Raised by a handler: send ``result`` for this job, then replace the worker.

    Used when the CUDA context is lost (trap, illegal address); the result should say why.
    """

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__(str(result.get("error")))
        self.result = result


class WorkerContext:
    """What a handler gets from the child: its device and a way to report progress.

    Attributes:
        device: CUDA device index the worker owns.
        job_id: id of the job being handled (``None`` between jobs).
    """

    def __init__(self, device: int, conn: Connection | None) -> None:
        self.device = device
        self.job_id: int | None = None
        self._conn = conn

    def progress(self, phase: str) -> None:
        """Report that the job entered ``phase``; this also restarts the parent's timeout."""
        if self._conn is not None and self.job_id is not None:
            self._conn.send(("progress", self.job_id, phase))


class JobHandler(Protocol):
    """A job handler object (see the module docstring)."""

    def handle(self, job: dict[str, Any]) -> dict[str, Any]: ...


class _FunctionHandler:
    def __init__(
        self, fn: Callable[[dict[str, Any], WorkerContext], dict[str, Any]], ctx: WorkerContext
    ):
        self._fn = fn
        self._ctx = ctx

    def handle(self, job: dict[str, Any]) -> dict[str, Any]:
        return self._fn(job, self._ctx)


def resolve(spec: str) -> Any:
    """Import ``"package.module:attribute"``.

    Raises:
        ValueError: when ``spec`` has no ``:``.
        ImportError, AttributeError: when it does not resolve.
    """
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"handler must be 'module:attribute', got {spec!r}")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def make_handler(spec: str, ctx: WorkerContext) -> JobHandler:
    """Instantiate the handler named by ``spec`` (a class gets ``ctx``; a function is wrapped)."""
    obj = resolve(spec)
    if isinstance(obj, type):
        handler: JobHandler = obj(ctx)
        if not callable(getattr(handler, "handle", None)):
            raise TypeError(f"{spec}: instances have no handle(job) method")
        return handler
    if callable(obj):
        return _FunctionHandler(obj, ctx)
    raise TypeError(f"{spec} is neither a class nor a function")


def _child_main(conn: Connection, handler_spec: str, device: int, log_level: int) -> None:
    """Entry point of the worker process."""
    logging.basicConfig(
        level=log_level,
        format="%(asctime)s %(levelname)s worker[%(process)d] %(name)s: %(message)s",
    )
    # Ctrl-C goes to the whole process group; the parent decides when the worker stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ctx = WorkerContext(device, conn)
    try:
        handler = make_handler(handler_spec, ctx)
        info_fn = getattr(handler, "ready_info", None)
        info = dict(info_fn()) if callable(info_fn) else {}
    except BaseException:
        conn.send(("setup_failed", None, traceback.format_exc(limit=8)))
        return
    conn.send(("ready", None, {"pid": os.getpid(), "device": device, **info}))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if not msg or msg[0] == "stop":
            return
        if msg[0] != "job":
            log.warning("unknown message %r", msg[0])
            continue
        _, job_id, job = msg
        ctx.job_id = job_id
        try:
            result = handler.handle(job)
        except FatalJobError as exc:
            conn.send(("fatal", job_id, exc.result))
            return
        except Exception as exc:
            log.exception("job %s failed", job_id)
            result = failure(
                MeasureStatus.RUNTIME_FAILED,
                f"{type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(limit=6),
            )
        ctx.job_id = None
        conn.send(("result", job_id, result))


# --------------------------------------------------------------------------- parent side


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
            target=_child_main,
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
        return GpuInfo(**gpu) if isinstance(gpu, dict) else None

    # -- jobs

    def measure(
        self,
        job: BenchJob | Mapping[str, Any] | BuildReport,
        problem: Problem | None = None,
        options: MeasureOptions | None = None,
    ) -> MeasureResult:
        """Run one job and return its result; never raises for a job's failure.

        Args:
            job: the job, or a build report (then ``problem`` is required).
            problem: the problem, when ``job`` is a build report.
            options: options for a build report's job (the worker's defaults otherwise).

        Raises:
            WorkerStartError: when no child can be started at all (environment problem).
        """
        return MeasureResult.from_dict(self.measure_dict(job, problem, options))

    def measure_dict(
        self,
        job: BenchJob | Mapping[str, Any] | BuildReport,
        problem: Problem | None = None,
        options: MeasureOptions | None = None,
    ) -> dict[str, Any]:
        """As :meth:`measure`, returning the result as a dict."""
        if isinstance(job, BuildReport):
            if problem is None:
                raise ValueError("measure(BuildReport, ...) needs the problem")
            payload = BenchJob.from_build(job, problem, options or self.options).to_dict()
        elif isinstance(job, BenchJob):
            payload = job.to_dict()
        else:
            payload = BenchJob.from_dict(job).to_dict()
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
        self, body: Mapping[str, Any], pid: int | None, started: float, **extra: Any
    ) -> dict[str, Any]:
        out = dict(body)
        out["extra"] = {
            **dict(out.get("extra") or {}),
            "worker_pid": pid,
            "job_seconds": round(time.monotonic() - started, 3),
            **extra,
        }
        return out

    def _timed_out(self, phase: str, pid: int | None, started: float) -> dict[str, Any]:
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
    ) -> dict[str, Any]:
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


# --------------------------------------------------------------------------- the GPU handler


K = TypeVar("K")
V = TypeVar("V")


class Lru(Generic[K, V]):
    """A small least-recently-used map calling ``on_evict`` for dropped values."""

    def __init__(self, capacity: int, on_evict: Callable[[V], None] | None = None) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._on_evict = on_evict
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        old = self._items.pop(key, None)
        if old is not None and old is not value and self._on_evict is not None:
            self._on_evict(old)
        self._items[key] = value
        while len(self._items) > self.capacity:
            _, dropped = self._items.popitem(last=False)
            if self._on_evict is not None:
                self._on_evict(dropped)

    def clear(self) -> None:
        while self._items:
            _, dropped = self._items.popitem(last=False)
            if self._on_evict is not None:
                self._on_evict(dropped)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items


class GpuJobHandler:
    """The real job handler: load, verify, then time, on the worker's GPU.

    Per job: load the kernel (cached per cubin file and symbol), get the problem's
    :class:`~tuner.reference.InputSet` (cached, so the reference is computed once per problem),
    optionally time SDPA, poison the output, launch once, synchronise, check
    (``WRONG_RESULT`` with the figures), and only then time (``OK``, TFLOP/s from the median).

    A failure is ``RUNTIME_FAILED``; when the CUDA context did not survive it (sticky error,
    or the health probe fails) the result is raised as :class:`FatalJobError` so the worker is
    replaced.
    """

    def __init__(
        self, ctx: WorkerContext, *, max_kernels: int = 32, max_inputsets: int = 2
    ) -> None:
        import torch

        from tuner.gpuinfo import current_gpu_info
        from tuner.loader import ensure_context

        self.ctx = ctx
        self.device = ctx.device
        ensure_context(self.device)
        self.info = current_gpu_info(self.device)
        self.stream = torch.cuda.current_stream(self.device).cuda_stream
        self.phase = "idle"
        self._kernels: Lru[tuple[str, int, int, str, int], LoadedKernel] = Lru(
            max_kernels, on_evict=lambda k: k.unload()
        )
        self._inputs: Lru[tuple[Any, ...], InputSet] = Lru(max_inputsets)

    def ready_info(self) -> dict[str, Any]:
        return {"gpu": self.info.to_dict()}

    def _enter(self, phase: str) -> None:
        self.phase = phase
        self.ctx.progress(phase)

    def handle(self, job: dict[str, Any]) -> dict[str, Any]:
        from tuner.loader import CudaError, context_healthy

        self.phase = "start"
        try:
            return self._measure(BenchJob.from_dict(job))
        except Exception as exc:
            msg = f"{type(exc).__name__}: {exc}"
            sticky = isinstance(exc, CudaError) and exc.sticky
            if sticky or not context_healthy():
                log.warning("CUDA context lost in phase %r: %s", self.phase, msg)
                raise FatalJobError(
                    failure(
                        MeasureStatus.RUNTIME_FAILED,
                        f"{msg} [CUDA context lost; worker replaced]",
                        phase=self.phase,
                    )
                ) from exc
            if _is_oom(exc):
                # Not the config's fault most of the time: drop cached inputs and carry on.
                self._inputs.clear()
                _empty_cache()
            return failure(
                MeasureStatus.RUNTIME_FAILED,
                msg,
                phase=self.phase,
                traceback=traceback.format_exc(limit=6),
            )

    def _kernel(self, cubin: str, symbol: str, smem: int) -> LoadedKernel:
        from tuner.loader import LoadedKernel

        st = os.stat(cubin)
        # mtime and size catch a cubin rebuilt in place under the same path.
        key = (os.path.realpath(cubin), st.st_mtime_ns, st.st_size, symbol, smem)
        kernel = self._kernels.get(key)
        if kernel is None:
            kernel = LoadedKernel.from_file(cubin, symbol, smem)
            self._kernels.put(key, kernel)
        return kernel

    def _inputset(self, problem: Problem, opts: MeasureOptions) -> InputSet:
        from tuner.reference import make_inputset

        spec = {k: v for k, v in problem.to_dict().items() if k != "gpu"}
        key = (tuple(sorted(spec.items())), opts.layout, opts.seed, opts.max_pairs)
        inputs = self._inputs.get(key)
        if inputs is None:
            inputs = make_inputset(
                problem,
                opts.layout,
                device=f"cuda:{self.device}",
                seed=opts.seed,
                max_pairs=opts.max_pairs,
            )
            self._inputs.put(key, inputs)
        return inputs

    def _measure(self, job: BenchJob) -> dict[str, Any]:
        from tuner.loader import grid_for, make_params, synchronize
        from tuner.timing import time_with_options
        from tuner.verify import check_output, poison

        config = KernelConfig.from_dict(job.config)
        problem = problem_from_dict(job.problem)
        opts = MeasureOptions.from_dict(job.options)
        mismatch = [
            f"{name} {a!r} != {b!r}"
            for name, a, b in (
                ("d", config.d, problem.d),
                ("dtype", config.dtype, problem.dtype),
                ("causal", config.causal, problem.causal),
            )
            if a != b
        ]
        if mismatch:
            return failure(
                MeasureStatus.SKIPPED, "config does not fit the problem: " + ", ".join(mismatch)
            )
        optin = self.info.smem_optin_bytes
        if optin and config.smem_bytes > optin:
            return failure(
                MeasureStatus.SMEM_OVERFLOW,
                f"needs {config.smem_bytes} B of dynamic shared memory; "
                f"the device allows {optin} B",
            )

        self._enter("load")
        kernel = self._kernel(job.cubin, opts.symbol or config.name, config.smem_bytes)
        regs = {"driver_registers": kernel.num_regs, "driver_local_bytes": kernel.local_bytes}
        if optin and kernel.static_smem + config.smem_bytes > optin:
            return {
                **failure(
                    MeasureStatus.SMEM_OVERFLOW,
                    f"static {kernel.static_smem} B + dynamic {config.smem_bytes} B of shared "
                    f"memory exceed the device's {optin} B",
                ),
                **regs,
            }
        if config.threads > kernel.max_threads:
            return {
                **failure(
                    MeasureStatus.RUNTIME_FAILED,
                    f"{config.threads} threads per block requested; with {kernel.num_regs} "
                    f"registers the kernel allows {kernel.max_threads}",
                ),
                **regs,
            }

        self._enter("inputs")
        inputs = self._inputset(problem, opts)
        extra: dict[str, Any] = {**inputs.describe(), "symbol": kernel.symbol}

        if opts.sdpa:
            from tuner.bench import sdpa_times

            self._enter("sdpa")
            extra["sdpa"] = {
                name: t.to_dict()
                for name, t in sdpa_times(
                    inputs, timing=opts.timing, device=self.device, progress=self._enter
                ).items()
            }

        o, lse = inputs.outputs()
        poison(o, lse)
        params = make_params(inputs.q, inputs.k, inputs.v, o, lse, inputs.scale, opts.layout)
        grid, block = grid_for(config, problem)
        launch = kernel.bind(params, grid, block, config.smem_bytes, self.stream)

        self._enter("launch")
        launch()
        synchronize(self.stream)

        self._enter("verify")
        check = check_output(o, lse, inputs)
        base = MeasureResult(
            status=MeasureStatus.WRONG_RESULT,
            max_abs_err=_finite_or_none(check.max_abs_err),
            rel_err=_finite_or_none(check.rel_err),
            ref_err=inputs.ref_err,
            driver_registers=kernel.num_regs,
            driver_local_bytes=kernel.local_bytes,
            extra=extra,
        )
        if not check.ok:
            return replace(base, error=check.message).to_dict()

        self._enter("time")
        t = opts.timing
        stats = time_with_options(launch, t, device=self.device)
        synchronize(self.stream)
        extra.update(mean_ms=stats.mean_ms, stdev_ms=stats.stdev_ms, flush_l2=t.flush_l2)

        if opts.recheck:
            self._enter("recheck")
            again = check_output(o, lse, inputs)
            if not again.ok:
                return replace(
                    base,
                    max_abs_err=_finite_or_none(again.max_abs_err),
                    rel_err=_finite_or_none(again.rel_err),
                    error=f"correct after one launch, wrong after {stats.reps + t.warmup} more "
                    f"(race?): {again.message}",
                ).to_dict()

        tflops = problem.flops / (stats.median_ms * 1e-3) / 1e12 if stats.median_ms > 0 else None
        return replace(
            base,
            status=MeasureStatus.OK,
            median_ms=stats.median_ms,
            p10_ms=stats.p10_ms,
            p90_ms=stats.p90_ms,
            reps=stats.reps,
            tflops=tflops,
        ).to_dict()


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _is_oom(exc: BaseException) -> bool:
    return "out of memory" in str(exc).lower() or type(exc).__name__ == "OutOfMemoryError"


def _empty_cache() -> None:
    try:
        import torch

        torch.cuda.empty_cache()
    except Exception as exc:
        log.debug("empty_cache failed: %s", exc)


# --------------------------------------------------------------------------- CPU test double


def fake_handle(job: dict[str, Any], ctx: WorkerContext) -> dict[str, Any]:
    """A GPU-free handler for tests of the worker protocol and of code driving workers.

    ``job["options"]["fake"]`` picks the behaviour:

    * ``"ok"`` (default): OK with ``median_ms`` from the options (1.0) and TFLOP/s.
    * ``"sleep"``: sleep ``seconds`` (default an hour), i.e. hang.
    * ``"progress"``: report ``steps`` phases ``seconds`` apart, then OK.
    * ``"exit"``: end the process at once with ``code`` (default 3), like a segfault would.
    * ``"raise"``: raise ``RuntimeError`` (an ordinary handler bug).
    * ``"fatal"``: raise :class:`FatalJobError` (a lost CUDA context).
    * ``"wrong"``: ``WRONG_RESULT``.
    * ``"status"``: return ``status`` from the options verbatim.

    Every result's ``extra`` holds the handling process's ``pid``.
    """
    opts = dict(job.get("options") or {})
    mode = str(opts.get("fake", "ok"))
    extra = {"pid": os.getpid(), "mode": mode}
    ctx.progress(mode)
    if mode == "sleep":
        time.sleep(float(opts.get("seconds", 3600.0)))
    elif mode == "progress":
        for i in range(int(opts.get("steps", 3))):
            time.sleep(float(opts.get("seconds", 0.1)))
            ctx.progress(f"step{i}")
    elif mode == "exit":
        os._exit(int(opts.get("code", 3)))
    elif mode == "raise":
        raise RuntimeError("fake handler failure")
    elif mode == "fatal":
        raise FatalJobError(failure(MeasureStatus.RUNTIME_FAILED, "fake fatal error", **extra))
    elif mode == "wrong":
        return MeasureResult(
            status=MeasureStatus.WRONG_RESULT, max_abs_err=0.5, error="fake wrong", extra=extra
        ).to_dict()
    elif mode == "status":
        return failure(MeasureStatus(str(opts["status"])), "fake status", **extra)
    median = float(opts.get("median_ms", 1.0))
    problem = problem_from_dict(job["problem"]) if job.get("problem") else None
    tflops = problem.flops / (median * 1e-3) / 1e12 if problem is not None else None
    result = MeasureResult(
        status=MeasureStatus.OK,
        median_ms=median,
        p10_ms=median * 0.99,
        p90_ms=median * 1.01,
        reps=10,
        tflops=tflops,
        max_abs_err=1e-4,
        rel_err=1e-4,
        ref_err=1e-4,
        extra=extra,
    )
    return result.to_dict()
