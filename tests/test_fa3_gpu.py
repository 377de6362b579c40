"""The fa3 (Hopper) family on a real sm_90 GPU: building-block micro-tests and correctness.

Marked ``gpu``; skipped (with the reason) without torch, cuda-bindings, nvcc or an sm_90 GPU.
Uses the harness of bench/hopper/fa3_check.py and its verification rule (fa3_ref.check, the
product's rule: NaN-poisoned outputs, LSE, dead rows, <= 2x SDPA-flash error).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "hopper"))


def _hopper_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    try:
        from cuda.bindings import driver  # noqa: F401
    except ImportError:
        return "cuda-bindings is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible to torch"

    if torch.cuda.get_device_capability(0) != (9, 0):
        return f"needs an sm_90 GPU, found {torch.cuda.get_device_name(0)}"
    if shutil.which("nvcc") is None:
        return "nvcc is not on PATH"
    return None


_REASON = _hopper_reason()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_REASON is not None, reason=f"fa3 GPU tests: {_REASON}"),
]

CONFIGS = [
    ("d128_rs_ov_pp", dict(d=128)),
    ("d128_bf16_causal_n176", dict(d=128, dtype="bf16", causal=True, block_n=176)),
    ("d128_ss_causal", dict(d=128, causal=True, pv_regs=False)),
    ("d128_plain", dict(d=128, overlap=False, pingpong=False)),
    ("d64_m192_ss", dict(d=64, block_m=192, block_n=128, pv_regs=False, pingpong=False,
                         consumer_regs=160)),
    ("d256_causal_n80", dict(d=256, causal=True, block_n=80)),
]


def test_building_blocks(tmp_path: Path) -> None:
    import fa3_check

    rows = fa3_check.run_micro(tmp_path)
    assert rows and all(r["ok"] for r in rows), rows


@pytest.mark.parametrize("kw", [c[1] for c in CONFIGS], ids=[c[0] for c in CONFIGS])
def test_config_correct_on_all_cases(kw: dict, tmp_path: Path) -> None:
    import fa3_check
    from fa3_host import Fa3Config, Fa3Kernel, compile_config, ensure_context

    ensure_context(0)
    config = Fa3Config(**kw)
    build = compile_config(config, tmp_path)
    assert build.ok and build.cubin is not None, build.log[-3000:]
    kernel = Fa3Kernel(config, build.cubin)
    try:
        failures = []
        for case in fa3_check.CASES:
            r = fa3_check.check_case(kernel, case)
            if not r["ok"]:
                failures.append((case, r["message"]))
        assert not failures, failures
    finally:
        kernel.unload()
