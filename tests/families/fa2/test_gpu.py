"""Correctness of the kernel template over its space, on a real GPU (marker ``gpu``).

Every valid config for D in {64, 128}, fp16, causal and not, is built (ninja, cached) and run
against a float32 reference on fresh random inputs, output poisoned with NaN first, at
N in {1, 17, 64, 1000, 4096} and at Nq != Nk. A sample of configs also runs bf16, D in
{32, 96, 256}, GQA/MQA, both [B,N,H,D] and [B,H,N,D] storage and the LSE output. The error
bound is :func:`measure.verify.check_output`'s: at most 2x SDPA-flash's error on the same inputs
(or a small rounding floor). References are computed once per shape and shared by all
configs, so the run is dominated by compilation (about a minute for ~1200 configs on 16
cores).

Run on a GPU machine: ``pytest -m gpu tests/families/fa2/test_gpu.py``.
"""

from __future__ import annotations

import random
from typing import cast

import pytest

from codegen.families.fa2.space import enumerate_space, seed_configs
from core.config import Dtype
from tests.support.gpu import gpu_marks, run_fa2_configs, shape_problems

pytestmark = gpu_marks()

# (batch, heads, kv_heads, nq, nk)
SQUARE_SHAPES = [(1, 2, 2, n, n) for n in (1, 17, 64, 1000, 4096)]
RAGGED_SHAPES = [(2, 2, 2, 300, 1000), (1, 2, 2, 1000, 300)]
SAMPLE_SHAPES = [(2, 4, 2, 257, 257), (1, 4, 1, 100, 700), (1, 2, 2, 700, 100), (1, 2, 2, 1, 33)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_every_config_fp16(d: int, causal: bool) -> None:
    configs = enumerate_space(d, "fp16", causal)
    assert configs
    run_fa2_configs(
        configs, shape_problems(d, "fp16", causal, SQUARE_SHAPES + RAGGED_SHAPES), ["bnhd"]
    )


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    ("d", "dtype"),
    [
        (32, "fp16"),
        (96, "fp16"),
        (256, "fp16"),
        (64, "bf16"),
        (128, "bf16"),
        (32, "bf16"),
        (96, "bf16"),
        (256, "bf16"),
    ],
)
def test_sample_configs(d: int, dtype: str, causal: bool) -> None:
    """Seed configs plus a random sample: other head dims, bf16, GQA/MQA, both layouts, LSE."""
    dt = cast(Dtype, dtype)
    space = enumerate_space(d, dt, causal)
    rng = random.Random(f"{d}{dtype}{causal}")
    sample = rng.sample(space, min(8, len(space)))
    configs = sorted(set(seed_configs(d, dt, causal)) | set(sample))
    run_fa2_configs(configs, shape_problems(d, dt, causal, SAMPLE_SHAPES), ["bnhd", "bhnd"])


def test_a_batch_past_the_grid_z_limit_runs_in_slices() -> None:
    """Batch 70,000 (grid z allows 65,535): the loader cuts the launch into batch slices."""
    cfg = seed_configs(64, "fp16", False)[0]
    run_fa2_configs([cfg], shape_problems(64, "fp16", False, [(70_000, 1, 1, 16, 16)]), ["bnhd"])
