"""The SQLite file the service serves from, watched: a deleted or replaced file is seen.

SQLite keeps an open file descriptor: when the file is deleted under a running server, reads
still answer from the unlinked inode and writes are acknowledged into it, then lost at the
next start. The service therefore remembers the file's identity (device and inode) when it
opens it and asks :meth:`DatabaseFile.check` before a write and on ``/healthz``:

- the file is gone: unhealthy, writes refused (503) until a file is back at the path;
- another file stands at the path (restored from a backup, replaced): the pooled connections
  are closed, so the next ones open the file now there, and its identity is taken as the
  served one (the recovery; the index is rebuilt by its watcher).

Databases that are not a SQLite file (PostgreSQL, in-memory) are never flagged.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import Engine

from db.session import sqlite_file

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FileState:
    """What :meth:`DatabaseFile.check` found: ``ok``, or why not in ``problem``."""

    ok: bool
    problem: str = ""


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


class DatabaseFile:
    """The served SQLite file's identity and the check against it (thread-safe).

    Args:
        engine: the store's engine; its pool is disposed when a new file is adopted.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        file = sqlite_file(engine.url) if engine.url.get_backend_name() == "sqlite" else None
        self.path = file.resolve() if file is not None else None
        self._identity = _identity(self.path) if self.path is not None else None
        self._lock = threading.Lock()

    def check(self) -> FileState:
        """Whether the database file served is the one at its path (adopting a new one)."""
        if self.path is None:
            return FileState(True)
        now = _identity(self.path)
        with self._lock:
            if now is None:
                return FileState(False, f"database file {self.path} is missing (deleted?)")
            if now != self._identity:
                # A file is back, or another one stands there: serve it from now on, rather
                # than reading and writing the unlinked one through pooled connections.
                log.warning("database file %s was replaced; reopening it", self.path)
                self._engine.dispose()
                self._identity = now
        return FileState(True)
