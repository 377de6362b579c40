"""A store holding some of the shipped results files, for the tests of those files."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from db.shipped import load_shipped_results
from db.store import Store


def shipped_store(factory: pytest.TempPathFactory, files: Sequence[Path]) -> Iterator[Store]:
    """A fresh SQLite store with ``files`` ingested (each must load something), disposed of
    after the caller's fixture scope: ``yield from shipped_store(tmp_path_factory, [...])``."""
    s = Store.from_url(f"sqlite:///{factory.mktemp('shipped') / 'results.db'}")
    assert load_shipped_results(s, list(files)) > 0
    yield s
    s.engine.dispose()
