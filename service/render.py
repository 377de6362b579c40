"""Reading and rendering the slow answers (result pages, headers) off the server's interpreter.

A page of 1000 measurements or a header takes tens to hundreds of milliseconds of Python
(SQL rows to objects, objects to JSON, the exporter's text). Run in a thread of the server,
that work holds the interpreter lock, and ``/v1/best``, answered on the event loop in
microseconds, waits behind it: on two cores its p99 went from 3 ms to 100 ms and more as
soon as the slow clients asked for pages or headers that were not cached. So :class:`Renderer`
runs each job in a pool of worker processes (``FA2TUNE_SERVICE_RENDER_PROCESSES``, default 1)
that open the same database themselves; only the finished bytes come back.

A job is a module-level function ``job(store, *args) -> Rendered``: it gets a store and plain
picklable arguments, and returns its outcome as data (a body, or a status and message:
404 for an unknown GPU, 503 for a missing template or a database error), never an exception
the server would have to unpickle. The same functions run in the server's threads when the
pool is off (``0``), when the database is in memory (a worker could not see it), or when the
pool cannot start.

Workers open SQLite files read-write but never create them, and open a connection per job
(no pool): a file replaced under the server is read at once, a deleted one is a 503 rather
than a new empty database at its path (:mod:`service.dbfile`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import multiprocessing
import sqlite3
import urllib.parse
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi import HTTPException, status
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool
from starlette.concurrency import run_in_threadpool

from codegen.export import ExportError
from core.config import Dtype
from db.session import make_engine, sqlite_file
from db.store import Store
from service.header import UnknownGpuError, export_header
from service.schemas import ResultOut, ResultPageOut

log = logging.getLogger(__name__)

#: The 503 of a database error, as :func:`service.main._database_error` words it.
DATABASE_UNAVAILABLE = "database unavailable; try again later"


@dataclass(frozen=True)
class Rendered:
    """A job's outcome: ``body`` when ``status`` is 200, else ``detail`` says why."""

    status: int
    body: bytes = b""
    detail: str = ""

    def raise_for_status(self) -> bytes:
        """The body; an HTTP error with the job's status and message otherwise.

        Raises:
            HTTPException: 404, 503 (a database error: ``Retry-After`` as for every one).
        """
        if self.status == status.HTTP_200_OK:
            return self.body
        unavailable = self.status == status.HTTP_503_SERVICE_UNAVAILABLE
        headers = {"Retry-After": "5"} if unavailable else None
        raise HTTPException(self.status, self.detail, headers=headers)


@dataclass(frozen=True)
class PageQuery:
    """One page's parameters and the index generation: the key of the page cache."""

    gpu: str | None
    d: int | None
    n: int | None
    dtype: str | None
    causal: bool | None
    status: str | None
    offset: int
    limit: int
    generation: int


def _guarded(job: Callable[[], bytes]) -> Rendered:
    try:
        return Rendered(status.HTTP_200_OK, job())
    except SQLAlchemyError as exc:
        log.error("database error while rendering: %s", exc)
        return Rendered(status.HTTP_503_SERVICE_UNAVAILABLE, detail=DATABASE_UNAVAILABLE)


def render_page(store: Store, key: PageQuery) -> Rendered:
    """One ``/v1/results`` page as JSON bytes."""

    def job() -> bytes:
        page = store.results(
            key.gpu,
            key.d,
            key.n,
            dtype=key.dtype,
            causal=key.causal,
            status=key.status,
            offset=key.offset,
            limit=key.limit,
        )
        end = page.offset + len(page.items)
        return (
            ResultPageOut(
                total=page.total,
                offset=page.offset,
                limit=page.limit,
                next_offset=end if end < page.total else None,
                items=[ResultOut.of(r) for r in page.items],
            )
            .model_dump_json()
            .encode()
        )

    return _guarded(job)


def render_header(
    store: Store,
    gpu: str,
    ds: tuple[int, ...] | None,
    dtypes: tuple[Dtype, ...],
    kv_pages: tuple[int, ...] = (),
) -> Rendered:
    """The tuned header of ``gpu`` as UTF-8 bytes (with KV-cache kernels of ``kv_pages``);
    404 for a GPU without results, 503 when the kernel templates cannot be inlined."""
    try:
        return _guarded(
            lambda: export_header(store, gpu, ds, dtypes=dtypes, kv_pages=kv_pages).encode()
        )
    except UnknownGpuError as exc:
        return Rendered(status.HTTP_404_NOT_FOUND, detail=str(exc))
    except ExportError as exc:
        return Rendered(status.HTTP_503_SERVICE_UNAVAILABLE, detail=str(exc))


# ------------------------------------------------------------------------ worker process

_worker_store: Store | None = None


def _worker_engine(url: URL) -> Engine:
    path = sqlite_file(url) if url.get_backend_name() == "sqlite" else None
    if path is None:
        return make_engine(url, poolclass=NullPool)
    uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=rw"

    def connect() -> sqlite3.Connection:
        # mode=rw: a missing file is an error, not a new empty database at the path.
        return sqlite3.connect(uri, uri=True, check_same_thread=False)

    return make_engine(url, poolclass=NullPool, creator=connect)


def _init_worker(url: str, log_level: int) -> None:
    global _worker_store
    logging.basicConfig(level=log_level, format="%(levelname)s %(name)s: %(message)s")
    _worker_store = Store(_worker_engine(make_url(url)))


def _run_in_worker(job: Callable[..., Rendered], *args: Any) -> Rendered:
    if _worker_store is None:  # not reached: the initializer sets it
        raise RuntimeError("render worker has no store")
    return job(_worker_store, *args)


def _ready() -> bool:
    return _worker_store is not None


# ------------------------------------------------------------------------ the server side


class Renderer:
    """Runs render jobs in worker processes, or in the server's threads.

    Args:
        store: the server's store: the jobs' database (its URL, for the workers) and the
            store of jobs run in threads.
        processes: worker processes; 0 runs every job in a thread of the server.
    """

    def __init__(self, store: Store, processes: int) -> None:
        self.store = store
        self.processes = processes
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._warming: list[concurrent.futures.Future[bool]] = []
        self._url: str | None = None
        if processes > 0:
            url = store.engine.url
            if url.get_backend_name() == "sqlite" and sqlite_file(url) is None:
                log.info("rendering in threads: an in-memory database is not shared")
            else:
                self._url = url.render_as_string(hide_password=False)

    @property
    def in_processes(self) -> bool:
        """Whether jobs go to worker processes (until the pool fails)."""
        return self._url is not None

    def start(self) -> None:
        """Start the workers (without waiting for them); a no-op in thread mode."""
        if self._url is None or self._pool is not None:
            return
        self._pool = concurrent.futures.ProcessPoolExecutor(
            max_workers=self.processes,
            # Not fork: the server has threads and an event loop a child must not inherit.
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(self._url, logging.getLogger().getEffectiveLevel()),
        )
        # Start them now rather than at the first request.
        self._warming = [self._pool.submit(_ready) for _ in range(self.processes)]

    async def ready(self, timeout_s: float = 60.0) -> None:
        """Wait until the workers :meth:`start` started have opened the database (a
        worker's start takes seconds: the server's first slow requests must not wait for it
        past their queue's wait); a pool that fails or takes longer leaves the jobs to threads.
        """
        warming, self._warming = self._warming, []
        if not warming:
            return
        try:
            with anyio.fail_after(timeout_s):
                for future in warming:
                    await asyncio.wrap_future(future)
        except (BrokenProcessPool, TimeoutError, OSError) as exc:
            log.error("render workers did not start (%r); rendering in threads", exc)
            self.close()
            self._url = None

    def close(self) -> None:
        """Stop the workers; jobs not started are dropped."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    async def run(self, job: Callable[..., Rendered], *args: Any) -> Rendered:
        """``job(store, *args)``, in a worker process or a thread."""
        if self._url is None:
            return await run_in_threadpool(job, self.store, *args)
        self.start()
        assert self._pool is not None
        try:
            future = self._pool.submit(_run_in_worker, job, *args)
            result: Rendered = await asyncio.wrap_future(future)
        except BrokenProcessPool as exc:  # a worker died (killed, out of memory) or never started
            # Threads from now on: a pool that cannot start would otherwise be spawned again
            # for every request.
            log.error("render workers failed (%s); rendering in threads from now on", exc)
            self.close()
            self._url = None
            return await run_in_threadpool(job, self.store, *args)
        return result
