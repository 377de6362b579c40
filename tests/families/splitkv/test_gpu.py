"""The split-KV (decode) family on a real GPU, through the product (marker ``gpu``).

Configs are built by :func:`codegen.build.build_configs` and launched by :mod:`measure.loader`
with the family's ``host_prep`` (the NaN-poisoned workspace of
:mod:`codegen.families.splitkv.host`), against the float32 reference with
:func:`measure.verify.check_output`'s bound (NaN-poisoned outputs, rows that see no key
exactly 0 / -inf, LSE). Shapes: decode with GQA and MQA
(Nq = 1..5), odd Nk that leave some splits empty, Nq > Nk with causal (rows that see no key),
prefill-like shapes the family is not tuned for but must still get right, and a batch of
70,000 (past the 65,535 a grid's y and z allow).

* ``test_worker_measures_seed_configs``: seeds through the worker, as a campaign measures
  (verified twice: before and after timing, so a workspace that did not reset shows up).
* ``test_sample_configs``: seeds plus a random sample per (D, dtype, mask), in-process.
* ``test_more_head_dims``: head dims the tile rounds up (8, 40, 80, 200: columns past the
  head dim zero-filled and never stored, O and the workspace in head-dim units) and 160, 192;
  the default plus two sampled configs per (D, dtype, mask) on the decode shapes and Nq > Nk.
* ``test_every_config`` (also ``slow``): the whole space for D 128, fp16.

Skipped, with the reason, without torch, cuda-bindings, nvcc or an sm_80+ GPU.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any, cast

import pytest

from codegen.families.splitkv.space import default_config, enumerate_space, seed_configs
from core.build_report import BuildReport
from core.config import Dtype
from core.problem import Problem
from core.records import MeasureStatus
from core.settings import get_settings
from core.splitkv_config import SplitKvConfig
from measure.jobs import BenchJob, MeasureOptions
from measure.params import Layout
from measure.timing import TimingOptions
from tests.support.gpu import gpu_skip_reason, shape_problems


def _reason() -> str | None:
    reason = gpu_skip_reason()
    if reason is not None:
        return reason
    import torch

    if torch.cuda.get_device_capability(0) < (8, 0):
        return f"the splitkv family needs sm_80+, found {torch.cuda.get_device_name(0)}"
    if shutil.which(get_settings().nvcc) is None:
        return "nvcc is not on PATH"
    return None


_REASON = _reason()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_REASON is not None, reason=f"splitkv GPU tests: {_REASON}"),
]

# (batch, heads, kv_heads, nq, nk)
DECODE_SHAPES = [
    (1, 32, 8, 1, 8192),  # GQA 4:1, the decode shape at B=1
    (3, 8, 2, 1, 1000),
    (2, 8, 1, 3, 4099),  # MQA, speculative rows, odd Nk
    (1, 4, 4, 5, 540),  # 17 tiles of 32 over 16 splits: some splits see no key
    (1, 2, 2, 1, 1),
]
EDGE_SHAPES = [
    (1, 4, 2, 50, 20),  # Nq > Nk: with causal, the first rows see no key
    (2, 2, 2, 300, 300),  # prefill-like: many row tiles
    (1, 6, 2, 77, 1500),
]
ALL_SHAPES = DECODE_SHAPES + EDGE_SHAPES
DTYPES: tuple[Dtype, ...] = ("fp16", "bf16")
HEAD_DIMS = (64, 128, 256, 96, 32)
#: Head dims of test_more_head_dims: tiles of 32 (8), 64 (40), 96 (80) and 224 (200) with
#: columns past the head dim, and 160 and 192 (whose chunks do not tile a warp).
MORE_HEAD_DIMS = (40, 80, 160, 192, 8, 200)
MORE_SHAPES = DECODE_SHAPES + EDGE_SHAPES[:1]
LAYOUTS: tuple[Layout, ...] = ("bnhd", "bhnd")
FAST = TimingOptions(warmup=2, target_ms=10.0, min_reps=3, max_reps=50, flush_l2=False)


def _build(configs: list[SplitKvConfig], cache: Path) -> list[BuildReport]:
    import torch

    from codegen.build import build_configs

    major, minor = torch.cuda.get_device_capability(0)
    reports = build_configs(configs, f"sm_{major}{minor}", cache_dir=cache)
    unbuilt = [f"{r.config.name}: {r.status} {r.error}" for r in reports if not r.usable]
    assert not unbuilt, "splitkv configs failed to build:\n" + "\n".join(unbuilt)
    return reports


def _sample(d: int, dtype: Dtype, causal: bool, k: int = 8) -> list[SplitKvConfig]:
    space = enumerate_space(d, dtype, causal)
    rng = random.Random(f"splitkv{d}{dtype}{causal}")
    return sorted(set(seed_configs(d, dtype, causal)) | set(rng.sample(space, min(k, len(space)))))


def _few(d: int, dtype: Dtype, causal: bool) -> list[SplitKvConfig]:
    """The default (up to 16 splits: the workspace merge) and two sampled configs."""
    rng = random.Random(f"splitkv-more{d}{dtype}{causal}")
    return sorted(
        {default_config(d, dtype, causal), *rng.sample(enumerate_space(d, dtype, causal), 2)}
    )


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("splitkv-builds")
    every = [c for d in HEAD_DIMS for t in DTYPES for m in (False, True) for c in _sample(d, t, m)]
    _build(every, path)
    return path


@pytest.fixture(scope="module")
def more_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """test_more_head_dims' builds, in one batch of their own (``-k more_head_dims`` builds
    these 72 only)."""
    path = tmp_path_factory.mktemp("splitkv-more-builds")
    more = [c for d in MORE_HEAD_DIMS for t in DTYPES for m in (False, True) for c in _few(d, t, m)]
    _build(more, path)
    return path


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_worker_measures_seed_configs(worker: Any, cache: Path, dtype: Dtype, causal: bool) -> None:
    reports = _build(seed_configs(128, dtype, causal), cache)
    failures: list[str] = []
    for i, problem in enumerate(shape_problems(128, dtype, causal, ALL_SHAPES)):
        options = MeasureOptions(layout=LAYOUTS[i % 2], timing=FAST, recheck=True)
        for report in reports:
            res = worker.measure(BenchJob.from_build(report, problem, options))
            where = f"{report.config.name} {problem.study_name}"
            if res.status != MeasureStatus.OK:
                failures.append(f"{where}: {res.status} {res.error}")
            elif not (res.median_ms and res.median_ms > 0):
                failures.append(f"{where}: OK without a timing")
    assert not failures, f"{len(failures)} failed jobs:\n" + "\n".join(failures[:50])


def test_a_batch_past_the_grid_y_limit_runs(worker: Any, cache: Path) -> None:
    (report,) = _build([seed_configs(64, "fp16", False)[0]], cache)
    problem = Problem(gpu="test", d=64, n=1, nk=64, batch=70_000, heads=1)
    res = worker.measure(BenchJob.from_build(report, problem, MeasureOptions(timing=FAST)))
    assert res.status == MeasureStatus.OK, res


def _run_configs(configs: list[SplitKvConfig], problems: list[Problem], cache: Path) -> None:
    """Build ``configs`` and check each on every (problem, layout), twice per binding (the
    second launch reuses the workspace whose counters the first must have reset)."""
    import torch

    from measure.loader import LoadedKernel, ensure_context
    from measure.reference import make_inputset
    from measure.verify import check_output, poison

    ensure_context(torch.cuda.current_device())
    reports = _build(configs, cache)
    inputsets = [make_inputset(p, cast(Layout, lay)) for p in problems for lay in LAYOUTS]
    stream = torch.cuda.current_stream().cuda_stream
    failures: list[str] = []
    for report in reports:
        assert report.cubin is not None
        kernel = LoadedKernel.for_config(report.config, report.cubin)
        try:
            for inputs in inputsets:
                out, lse = inputs.outputs()
                where = f"{report.config.name} {inputs.problem.study_name} {inputs.layout}"
                try:
                    launch = kernel.bind_config(
                        report.config, inputs.q, inputs.k, inputs.v, out, lse, inputs.scale,
                        inputs.layout, stream,
                    )  # fmt: skip
                except Exception as exc:
                    failures.append(f"{where}: {type(exc).__name__}: {exc}")
                    continue
                for attempt in ("first", "second"):
                    poison(out, lse)
                    launch()
                    torch.cuda.synchronize()
                    result = check_output(out, lse, inputs)
                    if not result.ok:
                        failures.append(f"{where} ({attempt} launch): {result.message}")
                        break
        finally:
            kernel.unload()
    assert not failures, f"{len(failures)} wrong results:\n" + "\n".join(failures[:50])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_sample_configs(d: int, dtype: Dtype, causal: bool, cache: Path) -> None:
    _run_configs(_sample(d, dtype, causal), shape_problems(d, dtype, causal, ALL_SHAPES), cache)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", MORE_HEAD_DIMS)
def test_more_head_dims(d: int, dtype: Dtype, causal: bool, more_cache: Path) -> None:
    problems = shape_problems(d, dtype, causal, MORE_SHAPES)
    _run_configs(_few(d, dtype, causal), problems, more_cache)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_every_config(causal: bool, cache: Path) -> None:
    configs = enumerate_space(128, "fp16", causal)
    _run_configs(
        configs, shape_problems(128, "fp16", causal, DECODE_SHAPES[:4] + EDGE_SHAPES[:1]), cache
    )


@pytest.mark.parametrize("d", [96, 128, 192, 256])
def test_defaults_fitted_to_99kb_gpus(d: int, tmp_path: Path) -> None:
    """The default as the 99 KB targets run it (sm_86, sm_89, sm_120, sm_121: 16-key tiles,
    then fewer warps; ``Family.default_within``), verified here: the same portable code, so
    its results on this GPU are its results there, up to the target's own compilation."""
    from codegen.families import family
    from codegen.targets import ARCH_SMEM_LIMIT

    splitkv = family("splitkv")
    for dtype, causal in (("fp16", False), ("bf16", True)):
        fitted = splitkv.default_within(d, dtype, causal, ARCH_SMEM_LIMIT["sm_120"])
        assert fitted is not None and fitted != default_config(d, dtype, causal)
        problems = shape_problems(d, dtype, causal, ALL_SHAPES)
        _run_configs([cast(SplitKvConfig, fitted)], problems, tmp_path)
