"""The worker's child side: resolve the job handler, then answer jobs until told to stop.

Runs inside the process :class:`~measure.worker.BenchWorker` spawns; only this process touches
CUDA (through the handler), so whatever a kernel does to the context dies with it.

The handler is named by import path (``"package.module:attribute"``) and resolved here, in
the child, so the protocol is testable without a GPU (the tests pass
``"tests.support.fake_handlers:fake_handle"``). A handler is either a function
``handle(job: BenchJob, ctx: WorkerContext) -> MeasureResult`` or a class constructed as
``cls(ctx)`` with ``handle(job: BenchJob) -> MeasureResult`` and optionally
``ready_info() -> dict``. A handler raises :class:`FatalJobError` to return a result and have
the worker replaced; any other exception becomes a ``RUNTIME_FAILED`` result and the worker
carries on.

Messages (tuples over the duplex pipe; values are pickled as they are)::

    parent -> child   ("job", job_id, BenchJob) | ("stop",)
    child -> parent   ("ready", None, info: dict)       once, after the handler is set up
                      ("setup_failed", None, text)      the handler could not be set up
                      ("progress", job_id, phase)       the job entered a phase
                      ("result", job_id, MeasureResult)
                      ("fatal", job_id, MeasureResult)  as result, then the child exits
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Protocol

from core.records import MeasureResult, MeasureStatus
from measure.jobs import BenchJob, failure

log = logging.getLogger(__name__)


class FatalJobError(Exception):
    """Raised by a handler: send ``result`` for this job, then replace the worker.

    Used when the CUDA context is lost (trap, illegal address); the result should say why.
    """

    def __init__(self, result: MeasureResult) -> None:
        super().__init__(str(result.error))
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

    def handle(self, job: BenchJob) -> MeasureResult: ...


HandlerFn = Callable[[BenchJob, WorkerContext], MeasureResult]


class _FunctionHandler:
    def __init__(self, fn: HandlerFn, ctx: WorkerContext) -> None:
        self._fn = fn
        self._ctx = ctx

    def handle(self, job: BenchJob) -> MeasureResult:
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
    """Instantiate the handler named by ``spec`` (a class gets ``ctx``; a function is wrapped).

    Raises:
        TypeError: when ``spec`` names neither a handler class nor a function.
    """
    obj = resolve(spec)
    if isinstance(obj, type):
        handler: JobHandler = obj(ctx)
        if not callable(getattr(handler, "handle", None)):
            raise TypeError(f"{spec}: instances have no handle(job) method")
        return handler
    if callable(obj):
        return _FunctionHandler(obj, ctx)
    raise TypeError(f"{spec} is neither a class nor a function")


def child_main(conn: Connection, handler_spec: str, device: int, log_level: int) -> None:
    """Entry point of the worker process (the ``target`` of the spawned process)."""
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
            if not isinstance(result, MeasureResult):
                # The parent trusts what arrives; a wrong type is the handler's bug, not a job's.
                raise TypeError(f"handler returned {type(result).__name__}, not a MeasureResult")
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
