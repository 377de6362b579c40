"""What tests that need a real GPU share: the rule that skips them elsewhere, and the fa2
configs' build-and-check loop.

A GPU test module sets ``pytestmark = gpu_marks()``: it is marked ``gpu`` and skipped, with
the reason, where torch, cuda-bindings or a visible CUDA GPU is missing. torch and the
measure modules are imported inside the functions, so importing this module needs neither.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import pytest

from core.config import Dtype
from core.fa2_config import Fa2Config
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


def run_fa2_configs(configs: list[Fa2Config], problems: list[Problem], layouts: list[str]) -> None:
    """Build ``configs`` and check each on every (problem, layout); fail listing every miss."""
    import torch

    from codegen.build import build_configs
    from measure.loader import LoadedKernel, ensure_context
    from measure.params import Layout
    from measure.reference import make_inputset
    from measure.verify import check_output, poison

    ensure_context(torch.cuda.current_device())
    reports = build_configs(configs, "sm_90")
    unbuilt = [f"{r.config.name}: {r.status} {r.error}" for r in reports if not r.usable]
    assert not unbuilt, "configs of the space failed to build:\n" + "\n".join(unbuilt)

    inputsets: list[Any] = [
        make_inputset(p, cast(Layout, layout)) for p in problems for layout in layouts
    ]
    stream = torch.cuda.current_stream().cuda_stream
    failures: list[str] = []
    for report in reports:
        assert report.cubin is not None
        kernel = LoadedKernel.for_config(report.config, report.cubin)
        try:
            for inputs in inputsets:
                out, lse = inputs.outputs()
                poison(out, lse)
                # The product's launch path: geometry, extra arguments and batch slices.
                kernel.bind_config(
                    report.config, inputs.q, inputs.k, inputs.v, out, lse, inputs.scale,
                    inputs.layout, stream,
                )()  # fmt: skip
                torch.cuda.synchronize()
                result = check_output(out, lse, inputs)
                if not result.ok:
                    p = inputs.problem
                    failures.append(
                        f"{report.config.name} b={p.batch} h={p.heads}/{p.n_kv_heads} "
                        f"nq={p.n} nk={p.n_keys} {inputs.layout}: {result.message}"
                    )
        finally:
            kernel.unload()
    assert not failures, f"{len(failures)} wrong results:\n" + "\n".join(failures[:50])
