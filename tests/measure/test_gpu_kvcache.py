"""KV-cache problems through the worker on a real GPU (marker ``gpu``): build -> load ->
verify -> time in the isolated child, for split-KV cache kernels of several layouts (a
contiguous cache and pages of 1, 16 and 64 tokens) on decode and short-chunk shapes (odd
lengths, GQA, causal, a sinks variant). The kernel reads the dense problem's keys from the
cache through a shuffled block table, every sequence's length on the device, and is checked
against the dense float32 reference (O and LSE, outputs poisoned, rechecked after timing). A
config of another layout, or a dense one, is refused (SKIPPED) before anything runs. Problems
of mixed lengths (``kv_lengths`` ``mixed``: a seeded spread up to nk) are checked against the
reference over each sequence's own keys, a chunk longer than some sequences included (their
leading rows see no key). Each split-KV twin runs with its splits over each sequence's length
and over the cache's capacity (``cap_split``, where a short sequence leaves most splits
empty).

Skipped with the reason without torch, cuda-bindings, nvcc or an sm_80+ GPU. Run on the GPU
machine: ``pytest -m gpu tests/measure/test_gpu_kvcache.py``.
"""

from __future__ import annotations

import dataclasses

import pytest

from codegen.families.splitkv.space import cache_twin, invalid_reasons, seed_configs
from core.family import cache_twin as any_cache_twin
from core.family import cache_twins
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


def _split_kv_jobs(
    cases: list[tuple[int, int, int, int, int, bool, Variant]],
    pages: tuple[int, ...],
    kv_lengths: str,
) -> list[tuple[SplitKvConfig, Problem]]:
    """Two unmasked and two causal split-KV seeds' cache twins on every case and layout, each
    with its splits over the sequence's length and over the capacity (``cap_split``)."""
    bases = seed_configs(128, "fp16", False)[:2] + seed_configs(128, "fp16", True)[:2]
    jobs: list[tuple[SplitKvConfig, Problem]] = []
    for nq, nk, b, h, hkv, causal, variant in cases:
        for page in pages:
            problem = Problem(gpu="", d=128, n=nq, nk=nk, batch=b, heads=h, kv_heads=hkv,
                              causal=causal, variant=variant, kv_page=page,
                              kv_lengths=kv_lengths)  # fmt: skip
            lengths = problem.cache_lengths
            assert lengths is not None and (kv_lengths == "full" or min(lengths) < nk)
            for base in (c for c in bases if c.causal == causal):
                tile = dataclasses.replace(base, **variant.needs)
                twins = [t for t in cache_twins(tile, page) if not invalid_reasons(t)]
                assert twins and all(isinstance(t, SplitKvConfig) for t in twins)
                # Both split spans (a window's twin has the length split only).
                assert len(twins) == (1 if variant.local else 2)
                jobs += [(t, problem) for t in twins]  # type: ignore[misc]
    return jobs


def test_worker_measures_cache_problems_of_every_layout() -> None:
    failures = measure_cache_jobs(_split_kv_jobs(CASES, PAGES, "full"))
    assert not failures, "\n".join(failures)


#: (nq, nk, batch, heads, kv_heads, causal, variant) of mixed lengths: decode GQA, a causal
#: chunk of 64 rows over sequences of 8 keys and more (rows that see no key), sinks.
MIXED_CASES = [
    (1, 4096, 8, 32, 8, False, PLAIN),
    (64, 1000, 6, 16, 4, True, PLAIN),
    (1, 3000, 5, 8, 1, False, Variant(sinks=True)),
]


def test_worker_measures_cache_problems_of_mixed_lengths() -> None:
    failures = measure_cache_jobs(_split_kv_jobs(MIXED_CASES, (0, 16), "mixed"))
    assert not failures, "\n".join(failures)


@pytest.mark.skipif(family_skip_reason("fa3") is not None,
                    reason=f"fa3: {family_skip_reason('fa3')}")  # fmt: skip
def test_worker_measures_hopper_cache_kernels_on_mixed_lengths() -> None:
    """A chunked prefill over a cached prefix of mixed lengths on fa3's cache kernels (some
    sequences shorter than the chunk: rows that see no key)."""
    from codegen.families.fa3.space import default_config

    base = default_config(128, "bf16", True)
    jobs = []
    for page in (0, 256):
        problem = Problem(gpu="", d=128, n=256, nk=4096, batch=4, heads=16, kv_heads=4,
                          dtype="bf16", causal=True, kv_page=page, kv_lengths="mixed")  # fmt: skip
        twin = any_cache_twin(base, page)
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


def _mixed_decode() -> tuple[SplitKvConfig, Problem]:
    twin = cache_twin(seed_configs(128, "fp16", False)[0], 16)
    assert twin is not None
    return twin, Problem(gpu="", d=128, n=1, nk=4096, batch=8, heads=32, kv_heads=8,
                         kv_page=16, kv_lengths="mixed")  # fmt: skip


def test_the_mixed_check_fails_a_launch_over_full_lengths() -> None:
    """The check has teeth: the same cache kernel over the same cache, launched with every
    sequence at nk keys (the rows past a sequence's length are real keys), fails the mixed
    problem's check; with the mixed lengths it passes."""
    import torch

    from measure.kvcache import bind_cache, cache_inputset
    from measure.loader import LoadedKernel, ensure_context
    from measure.reference import make_inputset
    from measure.verify import check_output, poison
    from tests.support.gpu import build_usable

    ensure_context(torch.cuda.current_device())
    twin, mixed = _mixed_decode()
    (report,) = build_usable([twin])
    assert report.cubin is not None and mixed.cache_lengths is not None
    dense = make_inputset(dataclasses.replace(mixed, kv_page=None, kv_lengths="full"))
    check = cache_inputset(dense, mixed.cache_lengths)
    kernel = LoadedKernel.for_config(twin, report.cubin)
    stream = torch.cuda.current_stream().cuda_stream
    results = {}
    try:
        for problem in (mixed, dataclasses.replace(mixed, kv_lengths="full")):
            o, lse = check.outputs()
            launch = bind_cache(kernel, twin, problem, check, o, lse, stream, check.seed)
            poison(o, lse)
            launch()
            torch.cuda.synchronize()
            results[problem.kv_lengths] = check_output(o, lse, check)
    finally:
        kernel.unload()
    assert results["mixed"].ok, results["mixed"].message
    assert not results["full"].ok, results["full"].message


def test_the_worker_records_the_length_pattern() -> None:
    from measure.jobs import BenchJob
    from measure.worker import BenchWorker
    from tests.support.gpu import build_usable

    twin, mixed = _mixed_decode()
    (report,) = build_usable([twin])
    with BenchWorker(device=0, job_timeout_s=120, start_timeout_s=300, kill_wait_s=60) as w:
        res = w.measure(BenchJob.from_build(report, mixed, fast_measure_options()))
    assert res.status == MeasureStatus.OK, res
    assert res.extra["kv_lengths"] == "mixed"
    assert res.extra["kv_keys"] == sum(mixed.cache_lengths or ()) < 8 * 4096
    assert res.median_ms and res.tflops == mixed.tflops(res.median_ms)
