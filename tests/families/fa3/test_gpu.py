"""The Hopper family (``fa3``) on a real sm_90 GPU, through the product (marker ``gpu``).

Every config is built by :func:`codegen.build.build_configs` (for an sm_90 GPU; the registry
compiles the family for sm_90a) and launched by :mod:`measure.loader` with the family's
``host_prep`` (the TMA descriptors of :mod:`codegen.families.fa3.host`), against the float32
reference of :mod:`measure.reference` with :func:`measure.verify.check_output`'s bound (at most 2x
SDPA-flash's error on the same inputs, or a small rounding floor; NaN-poisoned outputs; dead
rows exactly 0 / -inf; LSE). The shapes are the fa2 tier's (tests/families/fa2/test_gpu.py): odd N,
N = 1, Nq != Nk both ways with causal, GQA/MQA, both layouts, LSE.

* ``test_worker_*``: the seed configs of every head dim, dtype and mask measured through
  :class:`measure.worker.BenchWorker` and the :class:`measure.handler.GpuJobHandler` (build ->
  load -> verify -> time): the path a campaign takes.
* ``test_sample_configs``: seeds plus a random sample of the space per (D, dtype, mask),
  checked in-process on every shape through :meth:`LoadedKernel.bind_config` (the handler's
  binding).
* ``test_every_config`` (also ``slow``): the whole space for D 64 and 128, fp16.
* ``test_building_blocks``: the harness's micro-tests (bench/hopper/fa3_micro.cu).

Skipped, with the reason, without torch, cuda-bindings, nvcc or an sm_90 GPU.
Run on the GPU machine: ``pytest -m gpu tests/families/fa3/test_gpu.py`` (``-m "gpu and not slow"``
leaves out the whole-space test).
"""

from __future__ import annotations

import random
import shutil
import sys
from pathlib import Path
from typing import Any, cast

import pytest

from codegen.families.fa3.space import HEAD_DIMS, enumerate_space, seed_configs
from core.build_report import BuildReport
from core.config import Dtype
from core.fa3_config import Fa3Config
from core.problem import Problem
from core.records import MeasureStatus
from core.settings import get_settings
from measure.jobs import BenchJob, MeasureOptions
from measure.params import Layout
from measure.timing import TimingOptions
from tests.support.gpu import gpu_skip_reason, shape_problems

REPO = Path(__file__).resolve().parents[3]


def _hopper_reason() -> str | None:
    reason = gpu_skip_reason()
    if reason is not None:
        return reason
    import torch

    if torch.cuda.get_device_capability(0) != (9, 0):
        return f"the fa3 family needs an sm_90 GPU, found {torch.cuda.get_device_name(0)}"
    if shutil.which(get_settings().nvcc) is None:
        return "nvcc is not on PATH"
    return None


_REASON = _hopper_reason()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_REASON is not None, reason=f"fa3 GPU tests: {_REASON}"),
]

# (batch, heads, kv_heads, nq, nk): the fa2 tier's shapes.
SQUARE_SHAPES = [(1, 2, 2, n, n) for n in (1, 17, 64, 1000, 4096)]
RAGGED_SHAPES = [(2, 2, 2, 300, 1000), (1, 2, 2, 1000, 300)]
SAMPLE_SHAPES = [(2, 4, 2, 257, 257), (1, 4, 1, 100, 700), (1, 2, 2, 700, 100), (1, 2, 2, 1, 33)]
ALL_SHAPES = SQUARE_SHAPES + RAGGED_SHAPES + SAMPLE_SHAPES
LAYOUTS: tuple[Layout, ...] = ("bnhd", "bhnd")
DTYPES: tuple[Dtype, ...] = ("fp16", "bf16")
FAST = TimingOptions(warmup=2, target_ms=10.0, min_reps=3, max_reps=50, flush_l2=False)


def _build(configs: list[Fa3Config], cache: Path) -> list[BuildReport]:
    from codegen.build import build_configs

    reports = build_configs(configs, "sm_90", cache_dir=cache)
    unbuilt = [f"{r.config.name}: {r.status} {r.error}" for r in reports if not r.usable]
    assert not unbuilt, "fa3 configs of the space failed to build:\n" + "\n".join(unbuilt)
    assert {r.arch for r in reports} == {"sm_90a"}
    return reports


def _sample(d: int, dtype: Dtype, causal: bool) -> list[Fa3Config]:
    """Seed configs plus a fixed random sample of 12 of the space."""
    space = enumerate_space(d, dtype, causal)
    rng = random.Random(f"fa3{d}{dtype}{causal}")
    sample = rng.sample(space, min(12, len(space)))
    return sorted(set(seed_configs(d, dtype, causal)) | set(sample))


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build cache for the module, filled with every sampled config in one parallel batch
    (the tests' own builds then find them cached)."""
    path = tmp_path_factory.mktemp("fa3-builds")
    every = [c for d in HEAD_DIMS for t in DTYPES for m in (False, True) for c in _sample(d, t, m)]
    _build(every, path)
    return path


# ------------------------------------------------------------------------------------------
# Through the worker (tests/families/conftest.py): build -> load -> verify -> time, as a
# campaign measures


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_worker_measures_seed_configs(
    worker: Any, cache: Path, d: int, dtype: Dtype, causal: bool
) -> None:
    """Seeds of (D, dtype, mask) on every shape (layouts alternating), each job verified and
    timed by the GpuJobHandler in the worker child (inputs and reference reused per problem)."""
    reports = _build(seed_configs(d, dtype, causal), cache)
    problems = shape_problems(d, dtype, causal, ALL_SHAPES)
    failures: list[str] = []
    measured = 0
    for i, problem in enumerate(problems):
        for layout in (LAYOUTS[i % 2],):
            options = MeasureOptions(layout=layout, timing=FAST, recheck=True)
            for report in reports:
                res = worker.measure(BenchJob.from_build(report, problem, options))
                measured += 1
                p = problem
                where = (
                    f"{report.config.name} b={p.batch} h={p.heads}/{p.n_kv_heads} "
                    f"nq={p.n} nk={p.n_keys} {layout}"
                )
                if res.status != MeasureStatus.OK:
                    failures.append(f"{where}: {res.status} {res.error}")
                elif not (res.median_ms and res.median_ms > 0 and res.tflops):
                    failures.append(f"{where}: OK without a timing ({res.median_ms} ms)")
                elif res.driver_registers is None or res.driver_registers < 24:
                    failures.append(f"{where}: driver reports {res.driver_registers} registers")
    assert measured == len(problems) * len(reports)
    assert not failures, f"{len(failures)} failed jobs:\n" + "\n".join(failures[:50])


def test_worker_refuses_a_config_for_another_problem(worker: Any, cache: Path) -> None:
    (report,) = _build([seed_configs(128, "fp16", False)[0]], cache)
    other = Problem(gpu="test", d=64, n=128, batch=1, heads=2)
    res = worker.measure(BenchJob.from_build(report, other, MeasureOptions(timing=FAST)))
    assert res.status == MeasureStatus.SKIPPED, res


# ------------------------------------------------------------------------------------------
# In-process: many configs, every shape, the handler's binding


def _run_configs(configs: list[Fa3Config], problems: list[Problem], cache: Path) -> None:
    """Build ``configs`` and check each on every (problem, layout); fail listing every miss."""
    import torch

    from measure.loader import LoadedKernel, ensure_context
    from measure.params import Layout
    from measure.reference import make_inputset
    from measure.verify import check_output, poison

    ensure_context(torch.cuda.current_device())
    reports = _build(configs, cache)
    inputsets: list[Any] = [
        make_inputset(p, cast(Layout, layout)) for p in problems for layout in LAYOUTS
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
                p = inputs.problem
                where = (
                    f"{report.config.name} b={p.batch} h={p.heads}/{p.n_kv_heads} "
                    f"nq={p.n} nk={p.n_keys} {inputs.layout}"
                )
                try:
                    kernel.bind_config(
                        report.config, inputs.q, inputs.k, inputs.v, out, lse, inputs.scale,
                        inputs.layout, stream,
                    )()  # fmt: skip
                    torch.cuda.synchronize()
                except Exception as exc:  # a refused launch: record it, keep checking
                    failures.append(f"{where}: {type(exc).__name__}: {exc}")
                    continue
                result = check_output(out, lse, inputs)
                if not result.ok:
                    failures.append(f"{where}: {result.message}")
        finally:
            kernel.unload()
    assert not failures, f"{len(failures)} wrong results:\n" + "\n".join(failures[:50])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_sample_configs(d: int, dtype: Dtype, causal: bool, cache: Path) -> None:
    """Seed configs plus a random sample of the space: every head dim, both dtypes, every
    shape (odd N, N=1, Nq != Nk both ways, GQA/MQA), both layouts, LSE."""
    _run_configs(_sample(d, dtype, causal), shape_problems(d, dtype, causal, ALL_SHAPES), cache)


#: (batch, heads, kv heads, nq, nk) whose (head, batch) pairs span several longest-first
#: chunks (fa3_fwd.cuh: K/V of 2 MB per query head at D=128 make chunks of 8 pairs, the last
#: one smaller), with Nq < Nk and GQA; the last shape fits one chunk.
CHUNKED_SHAPES = [(3, 6, 6, 4096, 4096), (3, 10, 5, 1000, 8192), (2, 8, 2, 700, 2100)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 128])
def test_longest_first_order_over_chunks(d: int, dtype: Dtype, tmp_path: Path) -> None:
    """The `_lf` configs of the sample (the default's twin and sampled ones): every block of
    a grid remapped across chunks computes its own (m-block, head, batch), checked against the
    reference on shapes with several chunks, both layouts, LSE."""
    configs = [c for c in _sample(d, dtype, True) if c.longest_first]
    assert configs
    _run_configs(configs, shape_problems(d, dtype, True, CHUNKED_SHAPES), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_every_config(d: int, causal: bool, cache: Path) -> None:
    """The whole space for D 64 and 128, fp16 (as the fa2 tier): ~1900 configs in all."""
    configs = enumerate_space(d, "fp16", causal)
    assert configs
    _run_configs(configs, shape_problems(d, "fp16", causal, SQUARE_SHAPES + RAGGED_SHAPES), cache)


# ------------------------------------------------------------------------------------------
# The template's building blocks alone (harness micro-tests)


def test_building_blocks(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "bench" / "hopper"))
    import fa3_check

    rows = fa3_check.run_micro(tmp_path)
    assert rows and all(r["ok"] for r in rows), rows


def test_a_batch_past_the_grid_z_limit_runs_in_slices(tmp_path: Path) -> None:
    """Batch 70,000 (grid z allows 65,535): each batch slice gets its own TMA descriptors.
    (Its own build folder: ``-k`` can pick it without building the module's whole sample.)"""
    config = seed_configs(64, "fp16", False)[0]
    problems = shape_problems(64, "fp16", False, [(70_000, 1, 1, 16, 16)])
    _run_configs([config], problems, tmp_path)
