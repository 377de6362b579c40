"""Render jobs for the tests of :class:`service.render.Renderer`: module-level, so that a
worker process can import them as it imports the product's jobs."""

from __future__ import annotations

import multiprocessing
import os

from db.store import Store
from service.render import Rendered


def pid_job(store: Store) -> Rendered:
    """The process that ran the job."""
    return Rendered(200, str(os.getpid()).encode())


def dies_in_a_worker(store: Store) -> Rendered:
    """Kills the worker process that runs it (as the kernel's OOM killer would); in the
    server's own process (a thread), answers."""
    if multiprocessing.parent_process() is not None:
        os._exit(3)
    return Rendered(200, b"rendered in a thread")
