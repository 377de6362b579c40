"""Packed variable-length batches and head dims that are not multiples of 32, on a real GPU.

Varlen (``_vl`` configs): sequences of odd lengths (1, 3, 17, 255, 1000, ...), query and key
lengths that differ per sequence (causal is bottom-right per sequence, so a sequence with
fewer keys than queries has rows that see no key), GQA and MQA, fp16 and bf16, LSE
``[heads, total_q]``; every sequence is checked against its own float32 reference with the
dense rule (measure.verify). More sequences than grid z allows run in offset slices.

Head dims 8..256 that are multiples of 8 (40, 80, 160, 192, ...): the tile is rounded up to a
multiple of 32 and the extra columns must neither change the result nor be written (outputs
are poisoned, and O is allocated exactly d wide).

The Hopper family's varlen kernels (fa3 ``_vl``, sm_90a: an H100/H200) take the same cases,
plus empty sequences (no queries, or no keys: O = 0 and LSE = -inf), which the product's
inputs refuse but the kernel's ABI allows; they are skipped on other GPUs.

Run on a GPU machine: ``pytest -m gpu tests/test_gpu_varlen.py``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from codegen.families.fa2.space import enumerate_space, seed_configs
from codegen.families.fa3 import space as fa3_space
from core.config import Dtype
from core.family import AnyConfig
from tests.support.gpu import gpu_marks, shape_problems

pytestmark = gpu_marks()

# (query lengths, key lengths or None for the same)
VARLEN_CASES: list[tuple[list[int], list[int] | None]] = [
    ([1, 17, 255, 1000, 3, 64, 129], None),
    ([300, 5, 77], [1000, 5, 40]),  # more keys; fewer keys than queries (dead rows if causal)
    ([4000, 100], None),
]


def _build(configs: Sequence[AnyConfig]) -> dict[AnyConfig, Any]:
    from codegen.build import build_configs

    reports = build_configs(configs, "sm_90")
    unbuilt = [f"{r.config.name}: {r.status} {r.error}" for r in reports if not r.usable]
    assert not unbuilt, "configs failed to build:\n" + "\n".join(unbuilt)
    return {r.config: r for r in reports}


def _check_varlen(configs: Sequence[AnyConfig], heads: int, kv_heads: int) -> list[str]:
    import torch

    from measure.loader import LoadedKernel, ensure_context
    from measure.varlen import check_varlen, make_varlen_inputs
    from measure.verify import poison

    ensure_context(torch.cuda.current_device())
    reports = _build(configs)
    stream = torch.cuda.current_stream().cuda_stream
    failures = []
    by_key: dict[tuple[int, str, bool], list[AnyConfig]] = {}
    for c in configs:
        by_key.setdefault((c.d, c.dtype, c.causal), []).append(c)
    for (d, dtype, causal), group in by_key.items():
        for lens_q, lens_k in VARLEN_CASES:
            inputs = make_varlen_inputs(
                lens_q, lens_k, heads=heads, kv_heads=kv_heads, d=d, dtype=dtype, causal=causal
            )
            for cfg in group:
                kernel = LoadedKernel.for_config(cfg, reports[cfg].cubin)
                try:
                    for with_lse in (True, False):
                        o, lse = inputs.outputs()
                        poison(o, lse)
                        launch = inputs.bind(kernel, cfg, o, lse if with_lse else None,
                                             stream)  # fmt: skip
                        launch()
                        launch()  # twice: nothing may depend on state a launch leaves
                        torch.cuda.synchronize()
                        got = check_varlen(o, lse if with_lse else None, inputs)
                        if not got.ok:
                            failures.append(f"{cfg.name} q={lens_q} k={lens_k}: {got.message}")
                finally:
                    kernel.unload()
    return failures


@pytest.mark.parametrize(
    ("d", "dtype", "causal"),
    [(128, "fp16", True), (128, "fp16", False), (64, "bf16", True), (40, "fp16", True),
     (80, "bf16", False), (192, "fp16", True)],
)  # fmt: skip
def test_varlen_configs_match_the_reference(d: int, dtype: str, causal: bool) -> None:
    dt: Dtype = dtype  # type: ignore[assignment]
    seeds = seed_configs(d, dt, causal, varlen=True)
    rng = random.Random(f"vl{d}{dtype}{causal}")
    space = enumerate_space(d, dt, causal, varlen=True)
    configs = sorted(set(seeds) | set(rng.sample(space, min(3, len(space)))))
    assert configs and all(c.varlen for c in configs)
    failures = _check_varlen(configs, heads=8, kv_heads=2)
    assert not failures, "\n".join(failures)


def test_varlen_mqa_and_one_head() -> None:
    cfg = seed_configs(128, "fp16", True, varlen=True)[0]
    assert not _check_varlen([cfg], heads=4, kv_heads=1)
    assert not _check_varlen([replace(cfg, causal=False)], heads=1, kv_heads=1)


@pytest.mark.parametrize("family", ["fa2", "fa3"])
def test_varlen_past_the_grid_z_limit_runs_in_offset_slices(family: str) -> None:
    """70,000 sequences of 1-3 tokens: more than grid z's 65,535, cut into offset slices (fa3:
    one set of descriptors over the whole packed tensors serves every slice)."""
    import torch

    from measure.loader import LoadedKernel, ensure_context
    from measure.varlen import make_varlen_inputs, sequence_inputs
    from measure.verify import check_output, poison

    if family == "fa3":
        _needs_sm90()
    ensure_context(torch.cuda.current_device())
    seeds = fa3_space.seed_configs if family == "fa3" else seed_configs
    cfg = seeds(64, "fp16", True, varlen=True)[0]
    report = _build([cfg])[cfg]
    rng = random.Random(7)
    lens = [rng.randint(1, 3) for _ in range(70_000)]
    inputs = make_varlen_inputs(lens, heads=1, d=64, dtype="fp16", causal=True, reference=False)
    kernel = LoadedKernel.for_config(cfg, report.cubin)
    o, lse = inputs.outputs()
    poison(o, lse)
    stream = torch.cuda.current_stream().cuda_stream
    inputs.bind(kernel, cfg, o, lse, stream)()
    torch.cuda.synchronize()
    assert bool(torch.isfinite(o).all()) and bool(torch.isfinite(lse).all())
    # Sequences on both sides of the slice boundary against their reference.
    offs = inputs.offsets_q
    for i in (0, 1, 65_534, 65_535, 65_536, 69_999):
        seq = sequence_inputs(inputs, i, sdpa_ref=False)
        s, e = offs[i], offs[i + 1]
        got = check_output(o[s:e].unsqueeze(0), lse[:, s:e].unsqueeze(0), seq)
        assert got.ok, f"sequence {i}: {got.message}"
    kernel.unload()


@pytest.mark.parametrize("d", [8, 24, 40, 72, 80, 136, 160, 192, 200, 224, 248])
def test_head_dims_not_multiples_of_32(d: int) -> None:
    """Dense calls at head dims the tile is rounded up for: seeds and a sample, GQA, both
    layouts, LSE, square and ragged shapes, causal and not."""
    from tests.support.gpu import run_fa2_configs as _run_configs

    shapes = [(2, 4, 2, 257, 257), (1, 2, 2, 1, 33), (1, 2, 1, 700, 100), (1, 2, 2, 1000, 1000)]
    for causal in (False, True):
        dtype: Dtype = "bf16" if d % 16 else "fp16"
        space = enumerate_space(d, dtype, causal)
        rng = random.Random(f"hd{d}{causal}")
        configs = sorted(set(seed_configs(d, dtype, causal)) | set(rng.sample(space, 2)))
        _run_configs(configs, shape_problems(d, dtype, causal, shapes), ["bnhd", "bhnd"])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_worker_measures_a_varlen_problem(causal: bool) -> None:
    """The campaign's path: a varlen Problem through the isolated worker (measure.handler's
    varlen branch) verifies every sequence and times the packed launch; a dense config given
    a varlen problem is refused, not measured."""
    from core.problem import Problem
    from core.records import MeasureStatus
    from measure.jobs import BenchJob, MeasureOptions
    from measure.timing import TimingOptions
    from measure.worker import BenchWorker

    fast = TimingOptions(warmup=2, target_ms=10.0, min_reps=3, max_reps=50, flush_l2=False)
    cfg = seed_configs(128, "fp16", causal, varlen=True)[0]
    dense = replace(cfg, varlen=False)
    reports = _build([cfg, dense])
    problem = Problem.varlen("test", 128, (300, 1, 77, 1000), heads=8, kv_heads=2,
                             dtype="fp16", causal=causal)  # fmt: skip
    with BenchWorker(device=0, job_timeout_s=60, start_timeout_s=300, kill_wait_s=60) as w:
        opts = MeasureOptions(timing=fast, recheck=True)
        res = w.measure(BenchJob.from_build(reports[cfg], problem, opts))
        assert res.status == MeasureStatus.OK, res
        assert res.median_ms is not None and res.median_ms > 0
        wrong = w.measure(BenchJob.from_build(reports[dense], problem, opts))
        assert wrong.status != MeasureStatus.OK, wrong


# ------------------------------------------------------------------------------------------
# The Hopper family (fa3 _vl): sm_90a only.


def _needs_sm90() -> None:
    import torch

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(
            "the fa3 family's kernels are sm_90a: they need a GPU of compute capability 9.0"
        )


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("d", [64, 128])
def test_fa3_varlen_configs_match_the_reference(d: int, dtype: str, causal: bool) -> None:
    """fa3 `_vl` seeds and a sample of the space on VARLEN_CASES, GQA 8/2, with and without
    LSE, each launched twice into poisoned outputs."""
    _needs_sm90()
    dt: Dtype = dtype  # type: ignore[assignment]
    seeds = fa3_space.seed_configs(d, dt, causal, varlen=True)
    rng = random.Random(f"fa3vl{d}{dtype}{causal}")
    space = fa3_space.enumerate_space(d, dt, causal, varlen=True)
    configs: list[AnyConfig] = sorted(set(seeds) | set(rng.sample(space, min(3, len(space)))))
    assert configs and all(c.family == "fa3" and c.varlen for c in configs)  # type: ignore[union-attr]
    failures = _check_varlen(configs, heads=8, kv_heads=2)
    assert not failures, "\n".join(failures)


def test_fa3_varlen_mqa_and_one_head() -> None:
    _needs_sm90()
    cfg = fa3_space.seed_configs(128, "bf16", True, varlen=True)[0]
    assert not _check_varlen([cfg], heads=4, kv_heads=1)
    assert not _check_varlen([replace(cfg, causal=False)], heads=1, kv_heads=1)


def _reference(q: Any, k: Any, v: Any, causal: bool, scale: float) -> tuple[Any, Any]:
    """Float32 O ``[nq, H, D]`` and LSE ``[H, nq]`` of one sequence, any nq, nk >= 0 (a row
    that sees no key: O = 0, LSE = -inf)."""
    import torch

    group = q.shape[1] // k.shape[1]
    kk = k.float().repeat_interleave(group, dim=1)
    vv = v.float().repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.float(), kk) * scale
    nq, nk = q.shape[0], k.shape[0]
    if causal:
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(nk, device=q.device)[None, :]
        s = s.masked_fill(j > i + nk - nq, float("-inf"))
    lse = torch.logsumexp(s, dim=-1) if nk else s.new_full((s.shape[0], nq), float("-inf"))
    p = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)
    return torch.einsum("hqk,khd->qhd", p, vv), lse


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fa3_varlen_empty_sequences(causal: bool) -> None:
    """Sequences with no queries (no block has work) and with no keys (O = 0, LSE = -inf),
    beside ordinary ones and one with fewer keys than queries, at the start and the end."""
    import torch

    from measure.loader import LoadedKernel, ensure_context
    from measure.reference import softmax_scale, torch_dtype
    from measure.varlen import VarlenInputs, cu_seqlens
    from measure.verify import poison

    _needs_sm90()
    ensure_context(torch.cuda.current_device())
    lens_q = (0, 5, 130, 0, 7, 64, 3, 200)
    lens_k = (9, 6, 0, 0, 200, 0, 1, 0)
    heads, kv_heads, d, dtype = 8, 2, 128, "bf16"
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=dev)
    gen.manual_seed(11)
    tdt = torch_dtype(dtype)
    q = torch.randn((sum(lens_q), heads, d), generator=gen, dtype=tdt, device=dev)
    k = torch.randn((sum(lens_k), kv_heads, d), generator=gen, dtype=tdt, device=dev)
    v = torch.randn((sum(lens_k), kv_heads, d), generator=gen, dtype=tdt, device=dev)
    cu_q = torch.tensor(cu_seqlens(lens_q), dtype=torch.int32, device=dev)
    cu_k = torch.tensor(cu_seqlens(lens_k), dtype=torch.int32, device=dev)
    scale = softmax_scale(d)
    inputs = VarlenInputs(lens_q, lens_k, heads, kv_heads, d, dtype, causal, scale, 11, q, k, v,
                          cu_q, cu_k)  # fmt: skip
    failures = []
    for cfg in fa3_space.seed_configs(d, "bf16", causal, varlen=True):
        report = _build([cfg])[cfg]
        kernel = LoadedKernel.for_config(cfg, report.cubin)
        try:
            o, lse = inputs.outputs()
            poison(o, lse)
            stream = torch.cuda.current_stream().cuda_stream
            launch = inputs.bind(kernel, cfg, o, lse, stream)
            launch()
            launch()
            torch.cuda.synchronize()
            oq, ok = cu_seqlens(lens_q), cu_seqlens(lens_k)
            for i in range(len(lens_q)):
                s, e = oq[i], oq[i + 1]
                ref_o, ref_lse = _reference(
                    q[s:e], k[ok[i] : ok[i + 1]], v[ok[i] : ok[i + 1]], causal, scale
                )
                try:
                    torch.testing.assert_close(o[s:e].float(), ref_o, atol=3e-2, rtol=0)
                    torch.testing.assert_close(lse[:, s:e], ref_lse, atol=1e-2, rtol=0)
                except AssertionError as exc:
                    failures.append(f"{cfg.name} sequence {i} ({lens_q[i]}, {lens_k[i]}): {exc}")
        finally:
            kernel.unload()
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_worker_measures_an_fa3_varlen_problem(causal: bool) -> None:
    """The campaign's path with an fa3 `_vl` config: verified per sequence and timed; its
    dense twin given the varlen problem is refused, not measured."""
    from core.problem import Problem
    from core.records import MeasureStatus
    from measure.jobs import BenchJob, MeasureOptions
    from measure.timing import TimingOptions
    from measure.worker import BenchWorker

    _needs_sm90()
    fast = TimingOptions(warmup=2, target_ms=10.0, min_reps=3, max_reps=50, flush_l2=False)
    cfg = fa3_space.seed_configs(128, "fp16", causal, varlen=True)[0]
    dense = replace(cfg, varlen=False)
    reports = _build([cfg, dense])
    problem = Problem.varlen("test", 128, (300, 1, 77, 1000), heads=8, kv_heads=2,
                             dtype="fp16", causal=causal)  # fmt: skip
    with BenchWorker(device=0, job_timeout_s=60, start_timeout_s=300, kill_wait_s=60) as w:
        opts = MeasureOptions(timing=fast, recheck=True)
        res = w.measure(BenchJob.from_build(reports[cfg], problem, opts))
        assert res.status == MeasureStatus.OK, res
        assert res.median_ms is not None and res.median_ms > 0
        wrong = w.measure(BenchJob.from_build(reports[dense], problem, opts))
        assert wrong.status != MeasureStatus.OK, wrong
