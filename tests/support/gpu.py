"""What tests that need a real GPU share: the rule that skips them elsewhere, and the
configs' build-and-check loops (any family; fa2's as :func:`run_fa2_configs`).

A GPU test module sets ``pytestmark = gpu_marks()``: it is marked ``gpu`` and skipped, with
the reason, where torch, cuda-bindings or a visible CUDA GPU is missing. torch and the
measure modules are imported inside the functions, so importing this module needs neither.

Attention variants: a problem's ``variant`` (:func:`shape_problems`' ``variant``) reaches the
reference, the sinks and the launch (``bind_config(..., variant=, sinks=)``) in
:func:`run_configs` and :func:`run_varlen_configs`; :func:`variant_skip_reason` says when a
family's kernels do not have a switch yet, :func:`with_switches` turns configs into the
variant's.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

from core.config import Dtype
from core.fa2_config import Fa2Config
from core.family import AnyConfig
from core.problem import Problem
from core.variant import PLAIN, SWITCHES, Variant

#: full_limit of an input set whose reference covers every (batch, head) pair.
EVERY_PAIR = 2**62


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


def family_skip_reason(family: str) -> str | None:
    """Why ``family``'s kernels cannot be built with nvcc and run here (no GPU, no nvcc, or
    a compute capability the family does not take: fa3 needs 9.0, the others 8.0+), or None
    when they can."""
    reason = gpu_skip_reason()
    if reason is not None:
        return reason
    import shutil

    import torch

    from core.settings import get_settings

    if shutil.which(get_settings().nvcc) is None:
        return "nvcc is not on PATH"
    cc = torch.cuda.get_device_capability(0)
    if family == "fa3" and cc != (9, 0):
        return f"the fa3 family needs an sm_90 GPU, found {torch.cuda.get_device_name(0)}"
    if cc < (8, 0):
        return f"the {family} family needs sm_80+, found {torch.cuda.get_device_name(0)}"
    return None


def compiler_skip_reason() -> str | None:
    """Why the product cannot build kernels here (nvcc not on PATH and NVRTC not loadable),
    or None: the torch op's GPU tests build through either (codegen.compiler)."""
    import shutil

    from core.settings import get_settings

    if shutil.which(get_settings().nvcc) is not None:
        return None
    try:
        from codegen.nvrtc_compile import nvrtc_release

        nvrtc_release()
    except ImportError as exc:
        return f"nvcc is not on PATH and NVRTC is not available ({exc})"
    return None


def torch_op_skip_reason() -> str | None:
    """Why the torch op's GPU tests cannot run here (no GPU stack, a GPU older than sm_80, no
    kernel compiler), or None."""
    reason = gpu_skip_reason()
    if reason is not None:
        return reason
    import torch

    if torch.cuda.get_device_capability(0) < (8, 0):
        return f"fa2tune's kernels need sm_80+, found {torch.cuda.get_device_name(0)}"
    return compiler_skip_reason()  # nvcc, else NVRTC


def gpu_marks() -> list[pytest.MarkDecorator]:
    """The ``gpu`` marker plus a skip when :func:`gpu_skip_reason` gives a reason."""
    reason = gpu_skip_reason()
    return [
        pytest.mark.gpu,
        pytest.mark.skipif(reason is not None, reason=f"GPU tests: {reason}"),
    ]


def shape_problems(
    d: int,
    dtype: Dtype,
    causal: bool,
    shapes: Iterable[tuple[int, ...]],
    variant: Variant = PLAIN,
) -> list[Problem]:
    """Problems from ``(batch, heads, kv_heads, nq, nk)`` shapes (Nq = Nk and Hkv = H stored
    as None, as the campaign does), all of ``variant``."""
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
            variant=variant,
        )
        for b, h, hkv, nq, nk in shapes
    ]


def device_arch() -> str:
    """``sm_XY`` of GPU 0 (the registry makes it sm_90a for the Hopper family)."""
    import torch

    major, minor = torch.cuda.get_device_capability(0)
    return f"sm_{major}{minor}"


def variant_skip_reason(family: str, switches: Iterable[str]) -> str | None:
    """Why ``family``'s kernels cannot be tested with ``switches`` yet (its space's
    ``VARIANT_SWITCHES`` lacks one), or None when they can."""
    space = importlib.import_module(f"codegen.families.{family}.space")
    have = tuple(getattr(space, "VARIANT_SWITCHES", ()))
    missing = [name for name in switches if name not in have]
    if not missing:
        return None
    return (
        f"the {family} family's kernels have no {', '.join(missing)} switch yet "
        f"(codegen.families.{family}.space.VARIANT_SWITCHES = {have})"
    )


def with_switches(configs: Iterable[AnyConfig], variant: Variant) -> list[AnyConfig]:
    """``configs`` built with the switches ``variant`` needs (every other switch off), those
    the family's space accepts, without repeats, in order."""
    out: list[AnyConfig] = []
    needs = variant.needs
    for c in configs:
        v = replace(c, **{name: needs[name] for name in SWITCHES})  # type: ignore[arg-type]
        space = importlib.import_module(f"codegen.families.{v.family}.space")
        if space.is_valid(v)[0] and v not in out:
            out.append(v)
    return out


def build_usable(
    configs: Sequence[AnyConfig], arch: str | None = None, cache_dir: Path | None = None
) -> list[Any]:
    """Build ``configs`` (for GPU 0's arch unless ``arch``); fail listing any not built."""
    from codegen.build import build_configs

    reports = build_configs(configs, arch or device_arch(), cache_dir=cache_dir)
    unbuilt = [f"{r.config.name}: {r.status} {r.error}" for r in reports if not r.usable]
    assert not unbuilt, "configs failed to build:\n" + "\n".join(unbuilt)
    return reports


def _where(config: AnyConfig, p: Problem, layout: str) -> str:
    var = "" if p.variant.plain else f" [{p.variant.describe()}]"
    return (
        f"{config.name} b={p.batch} h={p.heads}/{p.n_kv_heads} nq={p.n} nk={p.n_keys} "
        f"{'causal ' if p.causal else ''}{layout}{var}"
    )


def run_configs(
    configs: Sequence[AnyConfig],
    problems: Sequence[Problem],
    layouts: Sequence[str],
    *,
    arch: str | None = None,
    cache_dir: Path | None = None,
    launches: int = 1,
    every_pair: bool = False,
    match_variant: bool = False,
) -> list[str]:
    """Build ``configs`` and check each on every (problem, layout) through the product's
    binding (geometry, host_prep arguments, batch slices, the variant's FaVariant with the
    input set's sinks); returns one line per wrong result or refused launch.

    Args:
        launches: launches per binding, each checked after poisoning (a second one catches
            state the first left behind, e.g. a split-KV workspace).
        every_pair: the reference covers every (batch, head) pair, whatever the size.
        match_variant: run each config only on the problems whose variant its switches fit
            (plain configs on plain problems).
    """
    import torch

    from measure.launch_args import variant_mismatch
    from measure.loader import LoadedKernel, ensure_context
    from measure.params import Layout
    from measure.reference import FULL_CHECK_WORK, make_inputset
    from measure.verify import check_output, poison

    ensure_context(torch.cuda.current_device())
    reports = build_usable(configs, arch, cache_dir)
    limit = EVERY_PAIR if every_pair else FULL_CHECK_WORK
    inputsets: list[Any] = [
        make_inputset(p, cast(Layout, layout), full_limit=limit)
        for p in problems
        for layout in layouts
    ]
    if every_pair:
        assert all(len(i.pairs) == i.problem.batch * i.problem.heads for i in inputsets)
    stream = torch.cuda.current_stream().cuda_stream
    failures: list[str] = []
    for report in reports:
        assert report.cubin is not None
        kernel = LoadedKernel.for_config(report.config, report.cubin)
        try:
            for inputs in inputsets:
                p = inputs.problem
                if match_variant and variant_mismatch(report.config, p.variant) is not None:
                    continue
                where = _where(report.config, p, inputs.layout)
                out, lse = inputs.outputs()
                try:
                    # The product's launch path: geometry, extra arguments and batch slices.
                    launch = kernel.bind_config(
                        report.config, inputs.q, inputs.k, inputs.v, out, lse, inputs.scale,
                        inputs.layout, stream, variant=p.variant, sinks=inputs.sinks,
                    )  # fmt: skip
                except Exception as exc:  # a refused launch: record it, keep checking
                    failures.append(f"{where}: {type(exc).__name__}: {exc}")
                    continue
                for attempt in range(launches):
                    poison(out, lse)
                    launch()
                    torch.cuda.synchronize()
                    result = check_output(out, lse, inputs)
                    if not result.ok:
                        failures.append(f"{where} (launch {attempt + 1}): {result.message}")
                        break
        finally:
            kernel.unload()
    return failures


def run_fa2_configs(configs: list[Fa2Config], problems: list[Problem], layouts: list[str]) -> None:
    """Build ``configs`` and check each on every (problem, layout); fail listing every miss."""
    failures = run_configs(configs, problems, layouts, arch="sm_90")
    assert not failures, f"{len(failures)} wrong results:\n" + "\n".join(failures[:50])


def run_varlen_configs(
    configs: Sequence[AnyConfig],
    cases: Sequence[tuple[Sequence[int], Sequence[int] | None]],
    *,
    heads: int,
    kv_heads: int,
    variant: Variant = PLAIN,
    arch: str | None = None,
) -> list[str]:
    """Build the varlen ``configs`` and check each on packed batches of ``cases`` (query
    lengths, key lengths or None for the same) with ``variant`` (each sequence against its
    own reference, every head; sinks shared by the batch), with LSE and without, two
    launches each; returns one line per miss."""
    import torch

    from measure.loader import LoadedKernel, ensure_context
    from measure.varlen import check_varlen, make_varlen_inputs
    from measure.verify import poison

    ensure_context(torch.cuda.current_device())
    reports = {r.config: r for r in build_usable(configs, arch)}
    stream = torch.cuda.current_stream().cuda_stream
    failures: list[str] = []
    groups: dict[tuple[int, str, bool], list[AnyConfig]] = {}
    for c in configs:
        groups.setdefault((c.d, c.dtype, c.causal), []).append(c)
    for (d, dtype, causal), group in groups.items():
        for lens_q, lens_k in cases:
            inputs = make_varlen_inputs(
                lens_q, lens_k, heads=heads, kv_heads=kv_heads, d=d, dtype=dtype,
                causal=causal, variant=variant,
            )  # fmt: skip
            for cfg in group:
                kernel = LoadedKernel.for_config(cfg, reports[cfg].cubin)
                where = f"{cfg.name} q={list(lens_q)} k={lens_k} [{variant.describe()}]"
                try:
                    for with_lse in (True, False):
                        o, lse = inputs.outputs()
                        poison(o, lse)
                        try:
                            launch = inputs.bind(kernel, cfg, o, lse if with_lse else None,
                                                 stream)  # fmt: skip
                        except Exception as exc:
                            failures.append(f"{where}: {type(exc).__name__}: {exc}")
                            break
                        launch()
                        launch()  # twice: nothing may depend on state a launch leaves
                        torch.cuda.synchronize()
                        got = check_varlen(o, lse if with_lse else None, inputs)
                        if not got.ok:
                            failures.append(f"{where} lse={with_lse}: {got.message}")
                finally:
                    kernel.unload()
    return failures


def fast_measure_options() -> Any:
    """MeasureOptions of a short timing (no L2 flush) with the recheck after it: what the
    GPU tiers measure correctness with, not speed."""
    from measure.jobs import MeasureOptions
    from measure.timing import TimingOptions

    fast = TimingOptions(warmup=2, target_ms=10.0, min_reps=3, max_reps=30, flush_l2=False)
    return MeasureOptions(timing=fast, recheck=True)


def measure_cache_jobs(jobs: Sequence[tuple[AnyConfig, Problem]]) -> list[str]:
    """Build every config of ``jobs`` and measure each (config, KV-cache problem) in one
    isolated worker, with a short timing and the recheck after it; the failures as lines
    (empty when every job is OK), each OK result's ``kv_page`` checked to be its problem's."""
    from core.records import MeasureStatus
    from measure.jobs import BenchJob
    from measure.worker import BenchWorker

    options = fast_measure_options()
    reports = {
        r.config: r for r in build_usable(sorted({c for c, _ in jobs}, key=lambda c: c.name))
    }
    failures = []
    with BenchWorker(device=0, job_timeout_s=120, start_timeout_s=300, kill_wait_s=60) as w:
        for config, problem in jobs:
            res = w.measure(BenchJob.from_build(reports[config], problem, options))
            if res.status != MeasureStatus.OK:
                failures.append(f"{config.name} on {problem.study_name}: {res.status} "
                                f"{res.error}")  # fmt: skip
                continue
            assert res.median_ms and res.tflops == problem.tflops(res.median_ms)
            assert res.extra["kv_page"] == problem.kv_page
    return failures
