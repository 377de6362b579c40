"""A GPU-free worker job handler, for tests of the worker protocol and of code driving workers.

The worker child resolves a handler by dotted name, so tests pass :data:`FAKE`
(``"tests.support.fake_handlers:fake_handle"``); the child imports this module by that name, which
works because pytest puts the repository root on ``sys.path`` (``pythonpath`` in
pyproject.toml) and a spawned child inherits the parent's ``sys.path``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from core.records import MeasureResult, MeasureStatus
from measure.child import FatalJobError, WorkerContext
from measure.jobs import BenchJob, MeasureOptions, failure

FAKE = "tests.support.fake_handlers:fake_handle"


@dataclass(frozen=True)
class FakeOptions(MeasureOptions):
    """Measure options with the fake handler's knobs (see :func:`fake_handle`).

    Attributes:
        fake: the behaviour.
        seconds: how long ``sleep`` sleeps (default an hour) or ``progress`` waits per step
            (default 0.1 s).
        steps: phases ``progress`` reports.
        code: exit code for ``exit``.
        median_ms: the time an ``ok`` job reports.
        status: the status ``status`` returns.
    """

    fake: str = "ok"
    seconds: float | None = None
    steps: int = 3
    code: int = 3
    median_ms: float = 1.0
    status: str | None = None


def fake_handle(job: BenchJob, ctx: WorkerContext) -> MeasureResult:
    """Answer ``job`` the way its :class:`FakeOptions` say (plain options: ``ok``).

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
    opts = job.options if isinstance(job.options, FakeOptions) else FakeOptions()
    mode = opts.fake
    extra = {"pid": os.getpid(), "mode": mode}
    ctx.progress(mode)
    if mode == "sleep":
        time.sleep(opts.seconds if opts.seconds is not None else 3600.0)
    elif mode == "progress":
        for i in range(opts.steps):
            time.sleep(opts.seconds if opts.seconds is not None else 0.1)
            ctx.progress(f"step{i}")
    elif mode == "exit":
        os._exit(opts.code)
    elif mode == "raise":
        raise RuntimeError("fake handler failure")
    elif mode == "fatal":
        raise FatalJobError(failure(MeasureStatus.RUNTIME_FAILED, "fake fatal error", **extra))
    elif mode == "wrong":
        return MeasureResult(
            status=MeasureStatus.WRONG_RESULT, max_abs_err=0.5, error="fake wrong", extra=extra
        )
    elif mode == "status":
        return failure(MeasureStatus(str(opts.status)), "fake status", **extra)
    median = opts.median_ms
    return MeasureResult(
        status=MeasureStatus.OK,
        median_ms=median,
        p10_ms=median * 0.99,
        p90_ms=median * 1.01,
        reps=10,
        tflops=job.problem.tflops(median),
        max_abs_err=1e-4,
        rel_err=1e-4,
        ref_err=1e-4,
        extra=extra,
    )
