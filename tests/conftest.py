"""Shared, generic fixtures: database URLs for SQLite and (when reachable) PostgreSQL, and a
module's store and exported header built from what the module declares.

``store`` (module scope) is a SQLite store filled once by the requesting module's
``fill_store(store)`` (its rows: problems, configs, results; or shipped files);
``seeded_store`` is the same store with what ``fill_store`` returned. ``header`` is
``export_header(store, **HEADER)`` with the module's ``HEADER`` (the export's arguments).
A package's conftest or a module overrides ``store`` where its tests need a fresh one each.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.exc import OperationalError

from db.store import Store
from service.header import export_header
from tests.support.service_data import make_store

# The apps the tests build render result pages and headers in their own threads: a render
# worker process per app would cost a process start (seconds of CPU) for each of hundreds of
# apps. The same render jobs run in worker processes in tests/service/test_render.py.
os.environ.setdefault("FA2TUNE_SERVICE_RENDER_PROCESSES", "0")

#: Test processes when pytest-xdist is installed and the command line names none: ``auto``
#: (one per CPU) on machines without an NVIDIA GPU, where the suite is compile- and CPU-bound;
#: 0 (this process) on GPU machines, whose tests would contend for the one device. Set
#: FA2TUNE_TEST_WORKERS (a count, ``auto`` or 0) to choose; ``-n`` on the command line wins.
_GPU_PRESENT = os.path.exists("/dev/nvidiactl")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Spread the suite over processes by test file (module fixtures are built once per file)."""
    if not config.pluginmanager.hasplugin("xdist") or config.option.numprocesses is not None:
        return
    if hasattr(config, "workerinput") or "PYTEST_XDIST_WORKER" in os.environ:
        return  # a worker runs its share itself (it would otherwise start workers of its own)
    workers = os.environ.get("FA2TUNE_TEST_WORKERS", "0" if _GPU_PRESENT else "auto").strip()
    if workers in ("", "0"):
        return
    config.option.numprocesses = workers if workers == "auto" else int(workers)
    if config.option.dist == "no":
        config.option.dist = "loadfile"


# Trust-auth server of the development machine and CI; override for another server.
POSTGRES_URL = os.environ.get(
    "FA2TUNE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """URL of a fresh SQLite file (in a not-yet-existing directory) under the test's tmp dir."""
    return f"sqlite:///{tmp_path / 'db' / 'fa2tune.db'}"


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL schema, dropped afterwards; skips if no server.

    The schema is selected through ``search_path`` in the URL, so anything that takes a URL
    (engines, alembic, the CLI's ``--db``) works in isolation.
    """
    admin = create_engine(POSTGRES_URL, connect_args={"connect_timeout": 3})
    try:
        with admin.connect() as conn:
            conn.execute(text("SELECT 1"))
    except OperationalError as exc:
        admin.dispose()
        pytest.skip(f"PostgreSQL not reachable at {POSTGRES_URL}: {exc.orig}")
    schema = f"fa2tune_test_{uuid.uuid4().hex[:12]}"
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(POSTGRES_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            # Do not hang on a connection a failed test left in a transaction.
            conn.execute(text("SET LOCAL lock_timeout = '20s'"))
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(
    params=[
        "sqlite-memory",
        "sqlite-file",
        pytest.param("postgresql", marks=pytest.mark.postgres),
    ]
)
def db_url(request: pytest.FixtureRequest) -> str:
    """A fresh database URL, once per backend: in-memory SQLite, SQLite file, PostgreSQL."""
    if request.param == "sqlite-memory":
        return "sqlite://"
    if request.param == "sqlite-file":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture(scope="module")
def seeded_store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Store, Any]]:
    """The module's store, filled by its ``fill_store(store)``, and what that returned."""
    fill = getattr(request.module, "fill_store", None)
    if fill is None:
        pytest.fail(f"{request.module.__name__} uses the shared store but has no fill_store(store)")
    store = make_store(tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2]))
    filled = fill(store)
    yield store, filled
    store.close()


@pytest.fixture(scope="module")
def store(seeded_store: tuple[Store, Any]) -> Store:
    """The module's store (see :func:`seeded_store`)."""
    return seeded_store[0]


@pytest.fixture(scope="module")
def header(request: pytest.FixtureRequest, store: Store) -> str:
    """The header exported from the module's store with the module's ``HEADER`` arguments."""
    return export_header(store, **request.module.HEADER)


@pytest.fixture(autouse=True)
def _fresh_candidate_groups() -> Iterator[None]:
    """The op's choice reads a store once per group of calls (fa2tune.ops.choice): each test
    starts and ends without groups read by another test's store."""
    from fa2tune.ops.choice import forget_results

    forget_results()
    yield
    forget_results()
