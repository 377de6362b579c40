"""The split-KV variant kernels against a brute-force reference, on a real GPU (marker ``gpu``).

Runs the splitkv part of ``tests/families/fa2/mma_variant_check.cu`` (the mma.sync families'
check, see :mod:`tests.families.fa2.mma_variant_check`): 7 configs (each switch, 16/32/64
packed rows, 1-4 warps, up to 64 splits, D 40/64/128/256) times 9 decode cases (GQA and MQA
with sliding windows whose tiles are fewer than the splits, chunks, a window past every key,
a row that sees no key, one key tile so one split, a sinks kernel given no sink pointer),
through ``splitkv::launch_variant`` (its own workspace, splits sized from nk).

Run on a GPU machine: ``pytest -m gpu tests/families/splitkv/test_variant_gpu.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.families.fa2.mma_variant_check import run_check, skip_reason

REASON = skip_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=str(REASON))]


def test_variant_kernels_match_the_reference(tmp_path: Path) -> None:
    passed, other = run_check("splitkv", tmp_path)
    assert passed == 63, "\n".join(other)[-6000:]
