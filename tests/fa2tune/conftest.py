"""Fixtures shared by the fa2tune tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.settings import settings_overridden


@pytest.fixture
def checking() -> Iterator[None]:
    """The KV-cache debug mode on (``FA2TUNE_CHECK_KVCACHE``), for this test's calls only."""
    with settings_overridden(check_kvcache=True):
        yield
