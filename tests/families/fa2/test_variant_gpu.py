"""The fa2 variant kernels against a brute-force reference, on a real GPU (marker ``gpu``).

Builds ``mma_variant_check.cu`` (next to this file: a host program with its own
double-precision reference of :mod:`core.variant`'s rules, no torch) for the GPU's
architecture and runs its fa2 part: 9 configs (each switch alone and together, dense and
packed, D 40/64/128/256, fp16/bf16, pipeline depths 1-4) times 9 cases (causal and two-sided
windows, chunks, chunk with window, nq > nk rows that see no key, a decode row, a window past
every key, a one-key window, a window far from key 0 with a sinks kernel given no sink
pointer), O and LSE poisoned with NaN.

Run on a GPU machine: ``pytest -m gpu tests/families/fa2/test_variant_gpu.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.families.fa2.mma_variant_check import run_check, skip_reason

REASON = skip_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=str(REASON))]


def test_variant_kernels_match_the_reference(tmp_path: Path) -> None:
    passed, other = run_check("fa2", tmp_path)
    assert passed == 81, "\n".join(other)[-6000:]
