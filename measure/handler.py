"""The GPU job handler: load a cubin, verify its output, then time it, in the worker child.

:class:`GpuJobHandler` is what :data:`measure.worker.DEFAULT_HANDLER` names; it runs only in
the child process (:mod:`measure.child`), which owns the CUDA context. Its contract: every job
gets a :class:`~core.records.MeasureResult`; a failure that leaves the context usable is a
``RUNTIME_FAILED`` result, one that does not is raised as
:class:`~measure.child.FatalJobError` so the worker is replaced. It never writes anywhere but
the GPU and never times an output it has not verified.

A problem with an attention variant (:mod:`core.variant`) is measured the same way: its input
set carries the variant's reference and, with sinks, the sink logits drawn once per problem;
the launch appends the config's ``FaVariant`` (:meth:`measure.loader.LoadedKernel.bind_config`).
A config whose variant switches are not the ones the problem's variant needs is refused
before anything runs (``SKIPPED``, the reason naming the switches); SDPA is not timed for a
variant (it computes none).

A KV-cache problem (:attr:`core.problem.Problem.kv_page`) is measured on the dense problem's
input set (one set for the dense problem and all its layouts and length patterns) laid out as
a cache by :mod:`measure.kvcache`, each sequence's length its
:attr:`~core.problem.Problem.cache_lengths`: with every sequence at ``nk`` (``kv_lengths``
``full``) the dense reference checks it; with ``mixed`` lengths the reference over each
sequence's own keys does (:func:`measure.kvcache.cache_inputset`, cached like the dense sets,
one per dense problem, pattern and seed), and ``extra`` records the pattern and the keys the
batch holds. A config that is not a cache kernel of the problem's layout is refused like one
of other switches (``SKIPPED``).

torch and cuda-bindings are imported when the handler is built or a job runs, never at module
import, so the module imports on a machine without them.
"""

from __future__ import annotations

import logging
import math
import os
import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from core.problem import Problem, kv_page_of
from core.records import MeasureResult, MeasureStatus
from measure.child import FatalJobError, WorkerContext
from measure.jobs import BenchJob, MeasureOptions, failure
from measure.lru import Lru

if TYPE_CHECKING:
    from measure.loader import LoadedKernel
    from measure.reference import InputSet
    from measure.varlen import VarlenInputs
    from measure.verify import CheckResult

log = logging.getLogger(__name__)


class GpuJobHandler:
    """The real job handler: load, verify, then time, on the worker's GPU.

    Per job: load the kernel (cached per cubin file and symbol), get the problem's
    :class:`~measure.reference.InputSet` (cached, so the reference is computed once per problem),
    optionally time SDPA, poison the output, launch once, synchronise, check
    (``WRONG_RESULT`` with the figures), and only then time (``OK``, TFLOP/s from the median).

    A failure is ``RUNTIME_FAILED``; when the CUDA context did not survive it (sticky error,
    or the health probe fails) the result is raised as :class:`FatalJobError` so the worker is
    replaced.
    """

    def __init__(
        self, ctx: WorkerContext, *, max_kernels: int = 32, max_inputsets: int = 2
    ) -> None:
        import torch

        from measure.gpuinfo import current_gpu_info
        from measure.loader import ensure_context

        self.ctx = ctx
        self.device = ctx.device
        ensure_context(self.device)
        self.info = current_gpu_info(self.device)
        self.stream = torch.cuda.current_stream(self.device).cuda_stream
        self.phase = "idle"
        self._kernels: Lru[tuple[str, int, int, str, int], LoadedKernel] = Lru(
            max_kernels, on_evict=lambda k: k.unload()
        )
        self._inputs: Lru[tuple[Any, ...], InputSet] = Lru(max_inputsets)
        self._varlen_inputs: Lru[tuple[Any, ...], VarlenInputs] = Lru(max_inputsets)

    def ready_info(self) -> dict[str, Any]:
        return {"gpu": self.info}

    def _enter(self, phase: str) -> None:
        self.phase = phase
        self.ctx.progress(phase)

    def handle(self, job: BenchJob) -> MeasureResult:
        from measure.loader import CudaError, context_healthy

        self.phase = "start"
        try:
            return self._measure(job)
        except Exception as exc:
            msg = f"{type(exc).__name__}: {exc}"
            sticky = isinstance(exc, CudaError) and exc.sticky
            if sticky or not context_healthy():
                log.warning("CUDA context lost in phase %r: %s", self.phase, msg)
                raise FatalJobError(
                    failure(
                        MeasureStatus.RUNTIME_FAILED,
                        f"{msg} [CUDA context lost; worker replaced]",
                        phase=self.phase,
                    )
                ) from exc
            if _is_oom(exc):
                # Not the config's fault most of the time: drop cached inputs and carry on.
                self._inputs.clear()
                self._varlen_inputs.clear()
                _empty_cache()
            return failure(
                MeasureStatus.RUNTIME_FAILED,
                msg,
                phase=self.phase,
                traceback=traceback.format_exc(limit=6),
            )

    def _kernel(self, cubin: str, symbol: str, smem: int) -> LoadedKernel:
        from measure.loader import LoadedKernel

        st = os.stat(cubin)
        # mtime and size catch a cubin rebuilt in place under the same path.
        key = (os.path.realpath(cubin), st.st_mtime_ns, st.st_size, symbol, smem)
        kernel = self._kernels.get(key)
        if kernel is None:
            kernel = LoadedKernel.from_file(cubin, symbol, smem)
            self._kernels.put(key, kernel)
        return kernel

    @staticmethod
    def _inputset_key(problem: Problem, opts: MeasureOptions) -> tuple[Any, ...]:
        spec = {k: v for k, v in problem.to_dict().items() if k != "gpu"}
        return (tuple(sorted(spec.items())), opts.layout, opts.seed, opts.min_pairs)

    def _inputset(self, problem: Problem, opts: MeasureOptions) -> InputSet:
        from measure.reference import make_inputset

        key = self._inputset_key(problem, opts)
        inputs = self._inputs.get(key)
        if inputs is None:
            inputs = make_inputset(
                problem,
                opts.layout,
                device=f"cuda:{self.device}",
                seed=opts.seed,
                min_pairs=opts.min_pairs,
            )
            self._inputs.put(key, inputs)
        return inputs

    def _cache_inputset(self, problem: Problem, opts: MeasureOptions) -> InputSet:
        """A cache problem's inputs and check: its dense problem's set (shared by every layout
        and pattern), for a mixed pattern with the reference over each sequence's own keys
        (:func:`measure.kvcache.cache_inputset`), cached per dense problem and lengths."""
        from measure.kvcache import cache_inputset

        dense = replace(problem, kv_page=None, kv_lengths="full")
        lengths = problem.cache_lengths
        if lengths is None or problem.kv_lengths == "full":
            return self._inputset(dense, opts)
        # The lengths set first: its dense set may have been evicted, and is needed only to
        # build it (the two share their inputs).
        key = ("kv_lengths", lengths, *self._inputset_key(dense, opts))
        inputs = self._inputs.get(key)
        if inputs is None:
            inputs = cache_inputset(self._inputset(dense, opts), lengths)
            self._inputs.put(key, inputs)
        return inputs

    def _measure(self, job: BenchJob) -> MeasureResult:
        from measure.verify import check_output, poison

        config, problem, opts = job.config, job.problem, job.options
        mismatch = [
            f"{name} {a!r} != {b!r}"
            for name, a, b in (
                ("d", config.d, problem.d),
                ("dtype", config.dtype, problem.dtype),
                ("causal", config.causal, problem.causal),
                ("varlen", bool(getattr(config, "varlen", False)), problem.is_varlen),
                ("kv_page", kv_page_of(config), problem.kv_page),
            )
            if a != b
        ]
        from measure.launch_args import variant_mismatch

        switches = variant_mismatch(config, problem.variant)
        if switches is not None:
            mismatch.append(switches)
        if mismatch:
            return failure(
                MeasureStatus.SKIPPED, "config does not fit the problem: " + ", ".join(mismatch)
            )
        optin = self.info.smem_optin_bytes
        if optin and config.smem_bytes > optin:
            return failure(
                MeasureStatus.SMEM_OVERFLOW,
                f"needs {config.smem_bytes} B of dynamic shared memory; "
                f"the device allows {optin} B",
            )

        self._enter("load")
        kernel = self._kernel(job.cubin, opts.symbol or config.name, config.smem_bytes)
        if optin and kernel.static_smem + config.smem_bytes > optin:
            return replace(
                failure(
                    MeasureStatus.SMEM_OVERFLOW,
                    f"static {kernel.static_smem} B + dynamic {config.smem_bytes} B of shared "
                    f"memory exceed the device's {optin} B",
                ),
                driver_registers=kernel.num_regs,
                driver_local_bytes=kernel.local_bytes,
            )
        if config.threads > kernel.max_threads:
            return replace(
                failure(
                    MeasureStatus.RUNTIME_FAILED,
                    f"{config.threads} threads per block requested; with {kernel.num_regs} "
                    f"registers the kernel allows {kernel.max_threads}",
                ),
                driver_registers=kernel.num_regs,
                driver_local_bytes=kernel.local_bytes,
            )

        self._enter("inputs")
        if problem.is_varlen:
            return self._verify_and_time(*self._varlen_case(kernel, job), kernel, problem, opts)
        # A cache problem's inputs are its dense problem's (measure.kvcache).
        if problem.is_cache:
            inputs = self._cache_inputset(problem, opts)
        else:
            inputs = self._inputset(problem, opts)
        extra: dict[str, Any] = {**inputs.describe(), "symbol": kernel.symbol}

        if opts.sdpa and not problem.variant.plain:
            extra["sdpa_note"] = "not timed: torch SDPA computes no attention variant"
        elif opts.sdpa:
            from measure.sdpa import sdpa_times

            self._enter("sdpa")
            extra["sdpa"] = {
                name: t.to_dict()
                for name, t in sdpa_times(
                    inputs, timing=opts.timing, device=self.device, progress=self._enter
                ).items()
            }

        o, lse = inputs.outputs()
        poison(o, lse)
        launch: Callable[[], None]
        if problem.is_cache:
            from measure.kvcache import bind_cache

            cached = bind_cache(kernel, config, problem, inputs, o, lse, self.stream,
                                inputs.seed)  # fmt: skip
            extra.update(cached.cache.describe())
            extra.update(kv_lengths=problem.kv_lengths, kv_keys=sum(problem.cache_lengths or ()))
            launch = cached
        else:
            # The FaParams, the family's extra arguments (fa3: TMA descriptors of these
            # tensors), its grid and block: one bound launch for the check and the timing loop.
            launch = kernel.bind_config(
                config, inputs.q, inputs.k, inputs.v, o, lse, inputs.scale, opts.layout,
                self.stream, variant=problem.variant, sinks=inputs.sinks,
            )  # fmt: skip
        return self._verify_and_time(
            launch, lambda: check_output(o, lse, inputs), extra, kernel, problem, opts,
            ref_err=inputs.ref_err,
        )  # fmt: skip

    def _varlen_case(
        self, kernel: LoadedKernel, job: BenchJob
    ) -> tuple[Callable[[], None], Callable[[], CheckResult], dict[str, Any]]:
        """A packed batch's launch (the loader's packed mode) and check (measure.varlen):
        inputs and references cached per problem like the dense ones, each sequence checked
        by the dense rule."""
        from measure.varlen import check_varlen, make_varlen_inputs
        from measure.verify import poison

        problem, opts = job.problem, job.options
        assert problem.seqlens is not None
        # The dict form, not the study name: the name leaves out a softcap's value.
        spec = {k: v for k, v in problem.to_dict().items() if k != "gpu"}
        key = ("varlen", repr(sorted(spec.items())), opts.seed)
        inputs = self._varlen_inputs.get(key)
        if inputs is None:
            inputs = make_varlen_inputs(
                problem.seqlens, heads=problem.heads, kv_heads=problem.n_kv_heads, d=problem.d,
                dtype=problem.dtype, causal=problem.causal, device=f"cuda:{self.device}",
                seed=opts.seed, variant=problem.variant,
            )  # fmt: skip
            self._varlen_inputs.put(key, inputs)
        o, lse = inputs.outputs()
        poison(o, lse)
        launch = inputs.bind(kernel, job.config, o, lse, self.stream)
        extra: dict[str, Any] = {
            "seed": inputs.seed, "layout": "packed", "sequences": inputs.batch,
            "symbol": kernel.symbol,
        }  # fmt: skip
        return launch, lambda: check_varlen(o, lse, inputs), extra

    def _verify_and_time(
        self,
        launch: Callable[[], None],
        check_fn: Callable[[], CheckResult],
        extra: dict[str, Any],
        kernel: LoadedKernel,
        problem: Problem,
        opts: MeasureOptions,
        *,
        ref_err: float | None = None,
    ) -> MeasureResult:
        """Launch once, verify (``WRONG_RESULT`` with the figures), then time and, with
        ``opts.recheck``, verify again after the timed launches."""
        from measure.loader import synchronize
        from measure.timing import time_with_options

        self._enter("launch")
        launch()
        synchronize(self.stream)

        self._enter("verify")
        check = check_fn()
        base = MeasureResult(
            status=MeasureStatus.WRONG_RESULT,
            max_abs_err=_finite_or_none(check.max_abs_err),
            rel_err=_finite_or_none(check.rel_err),
            ref_err=ref_err,
            driver_registers=kernel.num_regs,
            driver_local_bytes=kernel.local_bytes,
            extra=extra,
        )
        if not check.ok:
            return replace(base, error=check.message)

        self._enter("time")
        t = opts.timing
        stats = time_with_options(launch, t, device=self.device)
        synchronize(self.stream)
        extra.update(
            mean_ms=stats.mean_ms, stdev_ms=stats.stdev_ms, flush_l2=t.flush_l2, flush_by=t.flush_by
        )

        if opts.recheck:
            self._enter("recheck")
            again = check_fn()
            if not again.ok:
                return replace(
                    base,
                    max_abs_err=_finite_or_none(again.max_abs_err),
                    rel_err=_finite_or_none(again.rel_err),
                    error=f"correct after one launch, wrong after {stats.reps + t.warmup} more "
                    f"(race?): {again.message}",
                )

        tflops = problem.tflops(stats.median_ms) if stats.median_ms > 0 else None
        return replace(
            base,
            status=MeasureStatus.OK,
            median_ms=stats.median_ms,
            p10_ms=stats.p10_ms,
            p90_ms=stats.p90_ms,
            reps=stats.reps,
            tflops=tflops,
        )


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _is_oom(exc: BaseException) -> bool:
    return "out of memory" in str(exc).lower() or type(exc).__name__ == "OutOfMemoryError"


def _empty_cache() -> None:
    try:
        import torch

        torch.cuda.empty_cache()
    except Exception as exc:
        log.debug("empty_cache failed: %s", exc)
