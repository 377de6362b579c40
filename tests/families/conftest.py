"""The family GPU tiers' shared fixture: one bench worker on GPU 0 per module.

Started on first use only (the GPU tests skip before asking for it where there is no GPU);
``measure.worker`` is imported then, so collecting the tests needs no torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def worker() -> Iterator[Any]:
    from measure.worker import BenchWorker

    with BenchWorker(device=0, job_timeout_s=60, start_timeout_s=300, kill_wait_s=60) as w:
        yield w
