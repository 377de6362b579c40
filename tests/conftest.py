"""Shared, generic fixtures: database URLs for SQLite and (when reachable) PostgreSQL."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.exc import OperationalError

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
