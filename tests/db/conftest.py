"""The store tests' fixtures: a fresh, migrated store on every backend (``db_url``'s params);
``target`` is a second name for it where a test copies from a ``source`` store into it."""

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
