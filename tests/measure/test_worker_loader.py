"""Kernel ABI, launch geometry, driver errors and GPU info parsing (no GPU needed)."""

from __future__ import annotations

import ctypes

import pytest

from core.fa2_config import Fa2Config
from core.problem import Problem
from core.records import GpuInfo
from measure.gpuinfo import arch_for, format_driver_api_version, parse_smi_csv
from measure.loader import CudaError, grid_for
from measure.params import FaParams


def test_fa2params_layout_matches_the_abi() -> None:
    assert ctypes.sizeof(FaParams) == 160
    assert ctypes.alignment(FaParams) == 8
    offsets = {name: getattr(FaParams, name).offset for name, _ in FaParams._fields_}
    assert offsets["q"] == 0 and offsets["lse"] == 32
    assert offsets["q_batch_stride"] == 40
    assert offsets["o_row_stride"] == 128
    assert offsets["batch"] == 136 and offsets["nk"] == 152
    assert offsets["softmax_scale"] == 156


def test_fa2params_null_lse_and_values() -> None:
    p = FaParams(16, 32, 48, 64, None, *range(12), 2, 16, 4, 100, 200, 0.125)
    assert p.lse is None and p.q == 16
    assert p.o_row_stride == 11 and p.kv_heads == 4 and p.softmax_scale == 0.125


def test_grid_for_covers_every_row() -> None:
    cfg = Fa2Config.from_name("fa2_d128_fp16_full_br128_bc64_w4_s1_pad8")
    grid, block = grid_for(cfg, Problem(gpu="g", d=128, n=1000, batch=3, heads=5))
    assert grid == (8, 5, 3)
    assert block == (128, 1, 1)
    grid, _ = grid_for(cfg, Problem(gpu="g", d=128, n=1024, batch=1, heads=1))
    assert grid == (8, 1, 1)


def test_cuda_error_names_and_stickiness() -> None:
    e = CudaError("cuStreamSynchronize", 700, "CUDA_ERROR_ILLEGAL_ADDRESS")
    assert e.sticky and "CUDA_ERROR_ILLEGAL_ADDRESS" in str(e) and "cuStreamSynchronize" in str(e)
    assert not CudaError("cuModuleGetFunction", 500, "CUDA_ERROR_NOT_FOUND").sticky
    assert CudaError("cuLaunchKernel", 719, "CUDA_ERROR_LAUNCH_FAILED", "k").sticky


def test_parse_smi_csv() -> None:
    out = parse_smi_csv("570.86.15, 1980, 2619\n")
    assert out == {"driver_version": "570.86.15", "clocks.sm": "1980", "clocks.mem": "2619"}
    out = parse_smi_csv("570.86.15, [N/A], [Not Supported]")
    assert out["clocks.sm"] is None and out["clocks.mem"] is None
    with pytest.raises(ValueError):
        parse_smi_csv("")
    with pytest.raises(ValueError):
        parse_smi_csv("1, 2")


def test_driver_api_version_and_arch() -> None:
    assert format_driver_api_version(13000) == "13.0"
    assert format_driver_api_version(12080) == "12.8"
    info = GpuInfo(name="H200", compute_capability="9.0", sm_count=132, driver_version="x",
                   cuda_version="13.0")  # fmt: skip
    assert arch_for(info) == "sm_90"


def test_batches_past_the_grid_limit_are_cut_into_slices_that_fit() -> None:
    from types import SimpleNamespace

    from core.splitkv_config import SplitKvConfig
    from measure.loader import GRID_YZ_LIMIT, _batch_slice

    fa2 = Fa2Config.from_name("fa2_d64_fp16_full_br64_bc64_w4_s1_pad8")
    splitkv = SplitKvConfig(64, "fp16", False)

    def tensors(batch: int, heads: int) -> tuple[SimpleNamespace, SimpleNamespace]:
        q = SimpleNamespace(shape=(batch, 16, heads, 64))  # bnhd: [B, N, H, D]
        return q, SimpleNamespace(shape=(batch, 64, heads, 64))

    q, k = tensors(70_000, 1)
    assert _batch_slice(fa2, q, k, "bnhd", 70_000) == GRID_YZ_LIMIT  # batch is grid z
    assert _batch_slice(splitkv, q, k, "bnhd", 70_000) == 70_000  # batch x heads is grid x
    q, k = tensors(5, 3)
    assert _batch_slice(fa2, q, k, "bnhd", 5) == 5
    q, k = tensors(2, 70_000)
    with pytest.raises(ValueError, match="70000 heads need a launch grid past 65535"):
        _batch_slice(fa2, q, k, "bnhd", 2)
