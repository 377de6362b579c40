"""KV-cache problems through the worker on a real GPU (marker ``gpu``): build -> load ->
verify -> time in the isolated child, for split-KV cache kernels of several layouts (a
contiguous cache and pages of 1, 16 and 64 tokens) on decode and short-chunk shapes (odd
lengths, GQA, causal, a sinks variant). The kernel reads the dense problem's keys from the
cache through a shuffled block table, every sequence's length on the device, and is checked
against the dense float32 reference (O and LSE, outputs poisoned, rechecked after timing). A
config of another layout, or a dense one, is refused (SKIPPED) before anything runs.

Skipped with the reason without torch, cuda-bindings, nvcc or an sm_80+ GPU. Run on the GPU
machine: ``pytest -m gpu tests/measure/test_gpu_kvcache.py``.
"""

from __future__ import annotations

import dataclasses

import pytest

from codegen.families.splitkv.space import cache_twin, seed_configs
from core.problem import Problem
from core.records import MeasureStatus
from core.splitkv_config import SplitKvConfig
from core.variant import PLAIN, Variant
from tests.support.gpu import family_skip_reason, fast_measure_options, measure_cache_jobs

_WHY = family_skip_reason("splitkv")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_WHY is not None, reason=f"GPU tests: {_WHY}"),
]

#: (nq, nk, batch, heads, kv_heads, causal, variant): decode GQA, a short causal chunk with
#: an odd length, MQA with sinks.
CASES = [
    (1, 1000, 3, 32, 8, False, PLAIN),
    (4, 777, 2, 16, 4, True, PLAIN),
    (1, 4097, 2, 8, 1, False, Variant(sinks=True)),
]
PAGES = (0, 1, 16, 64)


def test_worker_measures_cache_problems_of_every_layout() -> None:
    bases = seed_configs(128, "fp16", False)[:2] + seed_configs(128, "fp16", True)[:2]
    jobs: list[tuple[SplitKvConfig, Problem]] = []
    for nq, nk, b, h, hkv, causal, variant in CASES:
        for page in PAGES:
            problem = Problem(gpu="", d=128, n=nq, nk=nk, batch=b, heads=h, kv_heads=hkv,
                              causal=causal, variant=variant, kv_page=page)  # fmt: skip
            for base in (c for c in bases if c.causal == causal):
                twin = cache_twin(dataclasses.replace(base, **variant.needs), page)
                assert twin is not None
                jobs.append((twin, problem))
    failures = measure_cache_jobs(jobs)
    assert not failures, "\n".join(failures)


def test_worker_refuses_a_config_of_another_layout() -> None:
    from measure.jobs import BenchJob
    from measure.worker import BenchWorker
    from tests.support.gpu import build_usable

    base = seed_configs(128, "fp16", False)[0]
    paged, contiguous = cache_twin(base, 16), cache_twin(base, 0)
    assert paged is not None and contiguous is not None
    reports = {r.config: r for r in build_usable([base, paged, contiguous])}
    problem = Problem(gpu="", d=128, n=1, nk=1000, batch=2, heads=32, kv_heads=8, kv_page=16)
    dense = dataclasses.replace(problem, kv_page=None)
    with BenchWorker(device=0, job_timeout_s=120, start_timeout_s=300, kill_wait_s=60) as w:
        for config, prob in ((base, problem), (contiguous, problem), (paged, dense)):
            res = w.measure(BenchJob.from_build(reports[config], prob, fast_measure_options()))
            assert res.status == MeasureStatus.SKIPPED and "kv_page" in (res.error or ""), res
        ok = w.measure(BenchJob.from_build(reports[paged], problem, fast_measure_options()))
        assert ok.status == MeasureStatus.OK, ok
