"""The store tests' fixtures: a fresh, migrated store on every backend (``db_url``'s params);
``target`` is a second name for it where a test copies from a ``source`` store into it;
``file_url`` a fresh database that migrations can be run on (SQLite file, PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from db.store import Store


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    with Store.from_url(db_url) as s:
        yield s


@pytest.fixture
def target(db_url: str) -> Iterator[Store]:
    with Store.from_url(db_url) as store:
        yield store


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def file_url(request: pytest.FixtureRequest) -> str:
    """A fresh database that alembic's own connections share (no in-memory SQLite)."""
    name = "sqlite_url" if request.param == "sqlite" else "postgres_url"
    return str(request.getfixturevalue(name))
