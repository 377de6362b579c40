"""Building ahead of the GPU: compile a campaign's configs on a background thread.

Builds do not depend on N, so one build per config serves every problem of its (D, dtype,
causal) group. :class:`BuildAhead` compiles the configs queued with :meth:`BuildAhead.submit`,
in order, in batches (one ``build_fn`` call, i.e. one parallel ninja run, per batch) on a
background thread at lowered priority while the GPU measures. :meth:`BuildAhead.get` returns
a config's build: done already, awaited when its batch is compiling now, or compiled at once
on the calling thread (at normal priority) when it is still queued, so the GPU never waits
behind the queue.

Contract: each config is built at most once per :class:`BuildAhead`; an exception from
``build_fn`` reaches whoever awaits a config of that batch; :meth:`BuildAhead.close` drops the
queue and waits for the batch in progress. This module never records builds (the campaign
drains finished reports with :meth:`BuildAhead.drain_finished` and stores them) and never
touches the GPU.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import Final

from core.build_report import BuildReport
from core.family import AnyConfig

log = logging.getLogger(__name__)

#: Compile a list of configs, one report per config (``codegen.build.build_configs``).
BuildFn = Callable[[Sequence[AnyConfig]], Sequence[BuildReport]]

#: Niceness of the background build thread and the compilers it starts.
BACKGROUND_NICE: Final = 10


def _lower_thread_priority(nice: int) -> None:
    """Renice the calling thread only (Linux: niceness is per thread, inherited by children).

    The background compilers then yield the CPU to the measuring worker (so a busy CPU does
    not open gaps between timed launches) and to builds the GPU is waiting for, which run at
    normal priority on the search thread.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (AttributeError, OSError) as exc:  # not Linux, or not permitted
        log.debug("could not lower the build thread's priority: %s", exc)


class BuildAhead:
    """Compiles queued configs in batches on a background thread; on demand when asked.

    Args:
        build_fn: compiles a batch and returns one report per config.
        batch_size: configs per ``build_fn`` call (the parallel width of one ninja run).
    """

    def __init__(self, build_fn: BuildFn, batch_size: int = 16) -> None:
        self._build_fn = build_fn
        self._batch_size = max(1, batch_size)
        self._cond = threading.Condition()
        self._queue: dict[str, AnyConfig] = {}  # insertion-ordered: the build order
        self._futures: dict[str, Future[BuildReport]] = {}
        self._finished: list[BuildReport] = []
        self._closed = False
        self._busy_s = 0.0
        self._thread = threading.Thread(target=self._run, name="fa2tune-build-ahead", daemon=True)
        self._thread.start()

    @property
    def busy_s(self) -> float:
        """Seconds spent inside ``build_fn`` (background and on demand, summed)."""
        with self._cond:
            return self._busy_s

    def submit(self, configs: Iterable[AnyConfig]) -> None:
        """Queue configs for the background thread (each is built once)."""
        with self._cond:
            for config in configs:
                if config.name not in self._futures:
                    self._futures[config.name] = Future()
                    self._queue[config.name] = config
            self._cond.notify_all()

    def get(self, config: AnyConfig) -> BuildReport:
        """The build of ``config``: done already, awaited, or compiled now.

        Raises:
            Exception: whatever ``build_fn`` raised for the batch holding ``config``.
        """
        with self._cond:
            future = self._futures.get(config.name)
            build_now = future is None or config.name in self._queue
            if build_now:
                # Not started yet: take it out of the queue and compile it on this thread.
                self._queue.pop(config.name, None)
                future = self._futures.setdefault(config.name, Future())
        assert future is not None
        if build_now:
            self._build([config], {config.name: future})
        return future.result()

    def drain_finished(self) -> list[BuildReport]:
        """Reports finished since the last call (so the caller can record them)."""
        with self._cond:
            done, self._finished = self._finished, []
        return done

    def close(self) -> None:
        """Drop the queue and wait for the batch in progress to finish."""
        with self._cond:
            self._closed = True
            for name in self._queue:
                self._futures[name].cancel()
            self._queue.clear()
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        _lower_thread_priority(BACKGROUND_NICE)
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                names = list(self._queue)[: self._batch_size]
                batch = [self._queue.pop(name) for name in names]
                futures = {name: self._futures[name] for name in names}
            self._build(batch, futures)

    def _build(self, batch: list[AnyConfig], futures: dict[str, Future[BuildReport]]) -> None:
        start = time.perf_counter()
        try:
            reports = list(self._build_fn(batch))
        except BaseException as exc:
            # Whoever awaits these builds gets the error; an interrupt still propagates.
            for future in futures.values():
                future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            log.exception("building %d configs failed", len(batch))
            return
        finally:
            with self._cond:
                self._busy_s += time.perf_counter() - start
        by_name = {r.config.name: r for r in reports}
        with self._cond:
            self._finished.extend(reports)
        for config in batch:
            report = by_name.get(config.name)
            if report is None:
                futures[config.name].set_exception(
                    RuntimeError(f"build_fn returned no report for {config.name}")
                )
            else:
                futures[config.name].set_result(report)
