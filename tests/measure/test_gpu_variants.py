"""Attention variants on a real GPU, through the product (marker ``gpu``).

For each family (fa2; fa3 on sm_90a; splitkv on decode shapes) a sample of configs built with
each switch alone (``local``, ``softcap``, ``sinks``) and all together, on the variants that
switch serves: windows (left only, two-sided, with causal), chunks (alone and with a window),
softcap 15 and 50, sinks, and combinations; odd lengths, Nq != Nk both ways (leading rows
that see no key, with and without causality), GQA and MQA, both layouts, decode rows
(Nq = 1..4), packed varlen batches where the family has them. Every (batch, head) pair is
value-checked against the float32 reference (O and LSE; rows that see no key: O = 0 and LSE
= -inf, or the head's sink logit), outputs NaN-poisoned, each binding launched twice.

The worker path (build -> load -> verify -> time in the isolated child) measures one variant
problem per family and refuses a config whose switches do not fit the problem.

Until a family's kernels take a switch (its space's ``VARIANT_SWITCHES``), its tests skip
with that reason. Skipped too, with the reason, without torch, cuda-bindings, nvcc or the
family's GPU. Run on the GPU machine: ``pytest -m gpu tests/measure/test_gpu_variants.py``.
"""

from __future__ import annotations

import importlib
import random
from typing import Any

import pytest

from core.config import Dtype
from core.records import MeasureStatus
from core.variant import Variant
from tests.support.gpu import (
    family_skip_reason,
    gpu_skip_reason,
    run_configs,
    run_varlen_configs,
    shape_problems,
    variant_skip_reason,
    with_switches,
)

_GPU = gpu_skip_reason()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_GPU is not None, reason=f"GPU tests: {_GPU}"),
]

FAMILIES = ("fa2", "fa3", "splitkv")
VARLEN_FAMILIES = ("fa2", "fa3")

#: The variants each switch set serves (the configs are built with exactly that set).
VARIANTS: dict[str, list[Variant]] = {
    "local": [
        Variant(window_left=100),  # left only (with causal: a causal window)
        Variant(window_left=64, window_right=32),  # two-sided (causal: right 0)
        Variant(window_right=7),  # right only: leading rows of Nq > Nk see nothing
        Variant(chunk=128),
        Variant(window_left=50, chunk=96),
        Variant(window_left=0, window_right=0),  # the diagonal alone
    ],
    "softcap": [Variant(softcap=15.0), Variant(softcap=50.0)],
    "sinks": [Variant(sinks=True)],
    "all": [
        Variant(window_left=80, chunk=192, softcap=15.0, sinks=True),
        Variant(window_left=33, window_right=17, softcap=50.0, sinks=True),
    ],
}
SWITCH_SETS: dict[str, tuple[str, ...]] = {
    "local": ("local",),
    "softcap": ("softcap",),
    "sinks": ("sinks",),
    "all": ("local", "softcap", "sinks"),
}

# (batch, heads, kv_heads, nq, nk)
PREFILL_SHAPES = [
    (2, 4, 2, 257, 257),  # odd N, GQA
    (1, 4, 1, 100, 700),  # MQA, more keys
    (1, 2, 2, 700, 100),  # fewer keys: leading rows see none (causal, right bound, chunk)
    (1, 2, 2, 1000, 1000),
    (2, 8, 2, 4, 1500),  # decode rows
    (1, 4, 4, 1, 333),
]
DECODE_SHAPES = [
    (1, 32, 8, 1, 8192),
    (3, 8, 2, 1, 1000),
    (2, 8, 1, 3, 4099),  # MQA, odd Nk
    (1, 4, 4, 4, 540),
    (1, 4, 2, 2, 77),
    (1, 4, 2, 50, 20),  # Nq > Nk
]
SHAPES = {"fa2": PREFILL_SHAPES, "fa3": PREFILL_SHAPES, "splitkv": DECODE_SHAPES}
#: (head dim, dtype) of each family's sample.
POINTS: list[tuple[int, Dtype]] = [(128, "fp16"), (64, "bf16")]
LAYOUTS = ["bnhd", "bhnd"]

VARLEN_CASES: list[tuple[list[int], list[int] | None]] = [
    ([1, 17, 255, 1000, 3, 64, 129], None),
    ([300, 5, 77], [1000, 5, 40]),  # more keys; fewer keys than queries (dead rows)
    ([4, 1, 2], [700, 33, 2048]),  # decode-like rows
]


def _space(family: str) -> Any:
    return importlib.import_module(f"codegen.families.{family}.space")


def _skip_unless(family: str, switch_set: str) -> None:
    reason = family_skip_reason(family) or variant_skip_reason(family, SWITCH_SETS[switch_set])
    if reason is not None:
        pytest.skip(reason)


def _sample(
    family: str, d: int, dtype: Dtype, causal: bool, variant: Variant, **kw: Any
) -> list[Any]:
    """The family's first seed and one random config of its space, built for ``variant``."""
    space = _space(family)
    rng = random.Random(f"variants{family}{d}{dtype}{causal}{sorted(kw.items())}")
    seeds = list(space.seed_configs(d, dtype, causal, **kw))[:1]
    pool = list(space.enumerate_space(d, dtype, causal, **kw))
    picks = seeds + rng.sample(pool, min(6, len(pool)))
    configs = with_switches(picks, variant)
    return configs[:2]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("switch_set", list(VARIANTS))
@pytest.mark.parametrize("family", FAMILIES)
def test_variant_configs_match_the_reference(family: str, switch_set: str, causal: bool) -> None:
    _skip_unless(family, switch_set)
    variants = VARIANTS[switch_set]
    failures: list[str] = []
    for d, dtype in POINTS:
        configs = _sample(family, d, dtype, causal, variants[0])
        assert configs, f"no {family} config of D {d} {dtype} takes {switch_set}"
        problems = [
            p for v in variants for p in shape_problems(d, dtype, causal, SHAPES[family], v)
        ]
        failures += run_configs(configs, problems, LAYOUTS, launches=2, every_pair=True)
    assert not failures, f"{len(failures)} wrong results:\n" + "\n".join(failures[:50])


@pytest.mark.parametrize("switch_set", list(VARIANTS))
@pytest.mark.parametrize("family", VARLEN_FAMILIES)
def test_varlen_variant_configs_match_the_reference(family: str, switch_set: str) -> None:
    _skip_unless(family, switch_set)
    failures: list[str] = []
    for causal, (d, dtype), (heads, kv_heads) in (
        (True, POINTS[0], (8, 2)),
        (False, POINTS[1], (4, 1)),
    ):
        for variant in VARIANTS[switch_set]:
            configs = _sample(family, d, dtype, causal, variant, varlen=True)[:1]
            assert configs and all(c.varlen for c in configs)
            failures += run_varlen_configs(
                configs, VARLEN_CASES, heads=heads, kv_heads=kv_heads, variant=variant
            )
    assert not failures, f"{len(failures)} wrong results:\n" + "\n".join(failures[:50])


@pytest.mark.parametrize("family", FAMILIES)
def test_worker_measures_a_variant_problem_and_refuses_a_mismatch(family: str) -> None:
    """Build -> load -> verify -> time in the worker child: every switch on, a problem with
    every variant; the same config on a plain problem and a plain config on the variant
    problem are refused (SKIPPED), never run."""
    _skip_unless(family, "all")
    from measure.jobs import BenchJob, MeasureOptions
    from measure.timing import TimingOptions
    from measure.worker import BenchWorker
    from tests.support.gpu import build_usable

    variant = VARIANTS["all"][0]
    shape = SHAPES[family][0]
    (problem,) = shape_problems(128, "fp16", True, [shape], variant)
    (plain_problem,) = shape_problems(128, "fp16", True, [shape])
    (config,) = _sample(family, 128, "fp16", True, variant)[:1]
    plain = _space(family).seed_configs(128, "fp16", True)[0]
    reports = {r.config: r for r in build_usable([config, plain])}
    fast = TimingOptions(warmup=2, target_ms=10.0, min_reps=3, max_reps=50, flush_l2=False)
    opts = MeasureOptions(timing=fast, recheck=True)
    with BenchWorker(device=0, job_timeout_s=60, start_timeout_s=300, kill_wait_s=60) as w:
        res = w.measure(BenchJob.from_build(reports[config], problem, opts))
        assert res.status == MeasureStatus.OK, res
        assert res.median_ms and res.median_ms > 0
        assert res.tflops == problem.tflops(res.median_ms)  # the visible pairs' FLOPs
        assert res.extra.get("variant") == variant.describe()
        for cfg, prob in ((config, plain_problem), (plain, problem)):
            refused = w.measure(BenchJob.from_build(reports[cfg], prob, opts))
            assert refused.status == MeasureStatus.SKIPPED, refused
            assert "variant switches" in (refused.error or ""), refused
