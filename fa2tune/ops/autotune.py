"""Tuning on first use (``fa2tune.torch.autotune``): torch-free.

Modes (:data:`MODES`):

* ``off``: tuning results are not used at all: every shape runs its family's default config
  (the FA2 defaults fa2tune starts a campaign from), no database or service is asked. A
  baseline to compare tuned runs with, or a process that must not depend on stored results.
* ``cached`` (the default): configs come from what is tuned (service, shipped results, local
  database: the exact shape, else the nearest tuned shape) or a family's default; nothing
  is ever tuned.
* ``on_first_call``: as ``cached``, and a call shape with no result measured at exactly that
  shape for this GPU starts one tuning job, once per shape and process; the call itself (and
  every call until the job ends) is served at once by the nearest tuned config or the
  default. The job is
  ``fa2tune tune`` for that one problem with a small time budget (:func:`campaign_command`):
  the campaign's own code, building ahead in parallel and timing in its isolated worker
  process, verifying every config before it can win, and writing to the local database
  (``FA2TUNE_DB_URL``). When the job ends, the listeners (:func:`add_listener`: the op's
  choice cache) forget that shape's decision, so the next call chooses again and picks the
  tuned config; the next process starts tuned.

Jobs run one at a time (one GPU campaign at a time) on a daemon thread that waits for the
campaign's process: the model's Python threads never run the search. A job still running
when the model's process exits keeps running to its budget and stores its result (its
output goes to a log file, not to the parent's pipes).

The tuner is a plain callable (:data:`Tuner`), so tests inject a fake one.
"""

from __future__ import annotations

import logging
import math
import queue
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from core.problem import Problem

log = logging.getLogger("fa2tune.torch")

Mode = Literal["off", "cached", "on_first_call"]
MODES: tuple[Mode, ...] = get_args(Mode)

#: The campaign's timing target per config for first-use tuning (ms): shorter than
#: ``fa2tune tune``'s default, so a small budget times more configs.
FIRST_USE_TARGET_MS = 50

#: Seconds a campaign process may run past its budget (worker start, builds in flight,
#: shutdown) before it is killed.
GRACE_S = 300.0


@dataclass(frozen=True)
class TuneJob:
    """One first-use tuning job: one problem on one device.

    Attributes:
        problem: what to tune (``gpu`` is the device's name as the driver reports it).
        device: the CUDA device index to tune on.
        budget_s: wall-clock budget of the campaign.
        db_url: the database the result goes to.
        cache_dir: the build cache (the op's: a tuned config is then built already).
    """

    problem: Problem
    device: int
    budget_s: float
    db_url: str
    cache_dir: Path

    @property
    def key(self) -> tuple[int, Problem]:
        """Jobs are started once per (device, problem) and process."""
        return (self.device, self.problem)


#: Runs one job to its end (the result in ``job.db_url``); raises on failure.
Tuner = Callable[[TuneJob], None]
#: Called after each job (finished or failed), on the tuning thread.
Listener = Callable[[TuneJob], None]


def check_mode(mode: str) -> Mode:
    """``mode`` when it is one of :data:`MODES`.

    Raises:
        ValueError: naming the modes.
    """
    for known in MODES:
        if mode == known:
            return known
    raise ValueError(f"autotune mode must be one of {', '.join(MODES)}; got {mode!r}")


def check_budget(budget_s: float) -> float:
    """``budget_s`` as a float when it is a positive, finite number of seconds.

    Raises:
        ValueError: otherwise.
    """
    value = float(budget_s)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"budget_s must be a positive number of seconds; got {budget_s!r}")
    return value


def campaign_command(job: TuneJob, python: str = sys.executable) -> list[str]:
    """The ``fa2tune tune`` command line of a job: its one problem, budget and device."""
    p = job.problem
    return [
        python, "-m", "fa2tune.cli", "--db", job.db_url, "--cache-dir", str(job.cache_dir),
        "tune", "--d", str(p.d), "--nq", str(p.n), "--nk", str(p.n_keys),
        "--batch", str(p.batch), "--heads", str(p.heads), "--kv-heads", str(p.n_kv_heads),
        "--dtype", p.dtype, "--causal", "yes" if p.causal else "no",
        "--time-budget", str(max(1, math.ceil(job.budget_s))), "--device", str(job.device),
        "--target-ms", str(FIRST_USE_TARGET_MS),
    ]  # fmt: skip


def run_campaign_process(job: TuneJob) -> None:
    """The default :data:`Tuner`: ``fa2tune tune`` for the job's problem in a child process.

    The child's output goes to a log file in the temporary directory (not to pipes: a child
    that outlives the model's process must not die writing to a closed pipe), removed when
    the campaign succeeds.

    Raises:
        RuntimeError: the campaign exited non-zero or ran past its budget plus
            :data:`GRACE_S` (killed); the message names the log and ends with its last lines.
    """
    command = campaign_command(job)
    log.debug("first-use tuning: %s", " ".join(command))
    with tempfile.NamedTemporaryFile(
        "w", prefix=f"fa2tune-autotune-{job.problem.study_name}-", suffix=".log", delete=False
    ) as out:
        path = Path(out.name)
        try:
            code = subprocess.run(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                timeout=job.budget_s + GRACE_S, check=False,
            ).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"fa2tune tune ran past {job.budget_s + GRACE_S:.0f} s (log: {path})"
            ) from None
    if code != 0:
        lines = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        tail = "\n".join(lines[-5:])
        raise RuntimeError(f"fa2tune tune exited with {code} (log: {path}): {tail}")
    path.unlink(missing_ok=True)


class AutoTuner:
    """The process's first-use tuning: the mode, the budget and the jobs started so far.

    Thread-safe: :meth:`consider` may be called from any thread; each (device, problem) gets
    at most one job per instance, and jobs run one at a time in order on one daemon thread.
    """

    def __init__(self, mode: str = "cached", budget_s: float = 30.0, tuner: Tuner | None = None):
        self.mode: Mode = check_mode(mode)
        self.budget_s = check_budget(budget_s)
        self.tuner: Tuner = tuner if tuner is not None else run_campaign_process
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._started: dict[tuple[int, Problem], TuneJob] = {}
        self._pending = 0
        self._failed: dict[tuple[int, Problem], str] = {}
        self._queue: queue.SimpleQueue[TuneJob] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def consider(self, problem: Problem, device: int, db_url: str, cache_dir: Path) -> bool:
        """Start tuning ``problem`` on ``device`` unless the mode says no or it was started
        before; True when this call started a job."""
        if self.mode != "on_first_call":
            return False
        job = TuneJob(problem, device, self.budget_s, db_url, cache_dir)
        with self._lock:
            if job.key in self._started:
                return False
            self._started[job.key] = job
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._work, name="fa2tune-autotune", daemon=True
                )
                self._thread.start()
        self._queue.put(job)
        log.info(
            "fa2tune.torch: tuning %s in the background (budget %.0f s)",
            problem.study_name, self.budget_s,
        )  # fmt: skip
        return True

    @property
    def jobs(self) -> list[TuneJob]:
        """Every job started, in order."""
        with self._lock:
            return list(self._started.values())

    @property
    def failed(self) -> dict[tuple[int, Problem], str]:
        """Why jobs failed, by :attr:`TuneJob.key`."""
        with self._lock:
            return dict(self._failed)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every started job has ended; False when ``timeout`` passed first."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            try:
                self.tuner(job)
            except Exception as exc:  # a failed job must not stop the next ones
                log.warning("fa2tune.torch: tuning %s failed: %s", job.problem.study_name, exc)
                with self._lock:
                    self._failed[job.key] = str(exc)
            else:
                log.info("fa2tune.torch: tuned %s", job.problem.study_name)
            for listener in list(_listeners):
                try:
                    listener(job)
                except Exception:  # pragma: no cover - listeners are ours and simple
                    log.exception("fa2tune.torch: autotune listener failed")
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()


_state_lock = threading.Lock()
_state: list[AutoTuner] = []
_listeners: list[Listener] = []


def current() -> AutoTuner:
    """The process's :class:`AutoTuner`; the first one follows the settings
    (``FA2TUNE_AUTOTUNE``, ``FA2TUNE_AUTOTUNE_BUDGET_S``)."""
    with _state_lock:
        if not _state:
            from core.settings import get_settings

            settings = get_settings()
            _state.append(AutoTuner(settings.autotune, settings.autotune_budget_s))
        return _state[0]


def autotune(
    mode: str = "on_first_call", budget_s: float | None = None, *, tuner: Tuner | None = None
) -> AutoTuner:
    """Set the process's first-use tuning (see the module's docstring for the modes).

    Jobs already started keep running; shapes already tuned or started are not tuned again
    by the new setting.

    Args:
        mode: ``off``, ``cached`` or ``on_first_call``.
        budget_s: seconds per tuning job; default ``FA2TUNE_AUTOTUNE_BUDGET_S`` (30).
        tuner: what runs a job (tests); default :func:`run_campaign_process`.

    Raises:
        ValueError: an unknown mode or a budget that is not a positive number.
    """
    checked = check_mode(mode)
    if budget_s is None:
        from core.settings import get_settings

        budget_s = get_settings().autotune_budget_s
    new = AutoTuner(checked, budget_s, tuner)
    with _state_lock:
        if _state:
            old = _state[0]
            with old._lock:
                new._started.update(old._started)  # once per shape and process
            _state[0] = new
        else:
            _state.append(new)
    return new


def add_listener(listener: Listener) -> None:
    """Call ``listener(job)`` after every job ends (the op drops the shape's decision)."""
    with _state_lock:
        if listener not in _listeners:
            _listeners.append(listener)


def reset() -> None:
    """Forget the process's tuner (tests); running jobs finish on their own thread."""
    with _state_lock:
        _state.clear()
