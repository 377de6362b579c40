"""What tests that need a real GPU share: the rule that skips them elsewhere.

A GPU test module sets ``pytestmark = gpu_marks()``: it is marked ``gpu`` and skipped, with
the reason, where torch, cuda-bindings or a visible CUDA GPU is missing.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from core.config import Dtype
from core.problem import Problem


def gpu_skip_reason() -> str | None:
    """Why GPU tests cannot run here, or None when they can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    try:
        from measure.loader import driver

        driver()
    except ImportError:
        return "cuda-bindings is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible to torch"
    return None


def gpu_marks() -> list[pytest.MarkDecorator]:
    """The ``gpu`` marker plus a skip when :func:`gpu_skip_reason` gives a reason."""
    reason = gpu_skip_reason()
    return [
        pytest.mark.gpu,
        pytest.mark.skipif(reason is not None, reason=f"GPU tests: {reason}"),
    ]


def shape_problems(
    d: int, dtype: Dtype, causal: bool, shapes: Iterable[tuple[int, ...]]
) -> list[Problem]:
    """Problems from ``(batch, heads, kv_heads, nq, nk)`` shapes (Nq = Nk and Hkv = H stored
    as None, as the campaign does)."""
    return [
        Problem(
            gpu="test",
            d=d,
            n=nq,
            nk=nk if nk != nq else None,
            batch=b,
            heads=h,
            kv_heads=hkv if hkv != h else None,
            dtype=dtype,
            causal=causal,
        )
        for b, h, hkv, nq, nk in shapes
    ]
