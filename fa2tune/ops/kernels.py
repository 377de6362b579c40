"""Building, loading and launching a chosen config for :mod:`fa2tune.ops.torch_op`.

A config is built on first use (:func:`codegen.build.build_configs`, cached on disk as for
every other stage), loaded once per process and device (:class:`measure.loader.LoadedKernel`
in torch's primary context) and launched with the worker's ABI: :func:`measure.params.
make_params`, then the family's extra arguments, on torch's current stream.

Per-call work is kept small (:class:`Launcher`): everything that does not change between
calls of one decision (kernel, grid, block, shared memory, the packed ``FaParams`` with its
strides and sizes, the ``void*`` argument array, one bound launch per stream) is made once,
and a call patches the five pointers and the scale and calls ``cuLaunchKernel``. The Hopper
family's TMA descriptors (which hold the Q, K and V addresses) are encoded once per pointer
triple and stride pattern, the last 64 kept.

A packed batch's decision is a :class:`PackedLauncher` (:func:`make_launcher` picks): the
loader's packed mode, its grid from each call's longest query length and number of
sequences, the offsets and lengths patched per call. Split-KV's workspace is
:mod:`fa2tune.ops.workspace`'s.

A decision with an attention variant has a config built with the variant's switches, whose
kernel takes :class:`measure.params.FaVariant` as its last argument: one per launcher
(:func:`measure.params.variant_arg` of the decision's normalised variant), every bound
launch pointing at it, the sinks pointer patched per call like the tensors' pointers.

Imports torch: only :mod:`fa2tune.ops.torch_op` imports this module.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from codegen.build import NvccNotFoundError, build_configs
from codegen.families import family_of
from core.family import AnyConfig
from core.shape import Shape
from core.variant import PLAIN, Variant
from fa2tune.ops.choice import Call, Choice, Unsupported, arch_of
from fa2tune.ops.workspace import SplitKvWorkspace
from measure.loader import (
    GRID_YZ_LIMIT,
    BoundLaunch,
    CudaError,
    HostPrep,
    LoadedKernel,
    ensure_context,
    host_prep,
    launch_geometry,
    packed_extra_args,
)
from measure.params import (
    ALIGN_BYTES,
    FaParams,
    FaVarlen,
    Layout,
    PackedSeqs,
    make_params,
    packed_params,
)

log = logging.getLogger(__name__)

# The current stream's handle without building a torch.cuda.Stream object (a few µs a call);
# torch's own code generators use it. The public path stands in where it is missing.
raw_stream: Callable[[int], int] | None = getattr(torch._C, "_cuda_getCurrentRawStream", None)
# torch.cuda.is_current_stream_capturing() without its Python wrapper.
capturing: Callable[[], bool] = getattr(
    torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing
)


def current_stream(device: torch.device) -> int:
    """The raw handle of ``device``'s current stream."""
    index = device.index
    if raw_stream is not None and index is not None:
        return raw_stream(index)
    return int(torch.cuda.current_stream(device).cuda_stream)


_lock = threading.Lock()
_loaded: dict[tuple[int, str], LoadedKernel] = {}


@dataclass(frozen=True)
class DeviceInfo:
    """What the choice needs to know about one CUDA device."""

    index: int
    name: str
    sm_count: int
    compute_capability: str


_devices: dict[int, DeviceInfo] = {}


def device_info(index: int) -> DeviceInfo:
    """Name, SM count and compute capability of CUDA device ``index`` (cached)."""
    info = _devices.get(index)
    if info is None:
        props = torch.cuda.get_device_properties(index)
        info = DeviceInfo(
            index, str(props.name), int(props.multi_processor_count),
            f"{props.major}.{props.minor}",
        )  # fmt: skip
        _devices[index] = info
    return info


class CuSeqlens(NamedTuple):
    """A packed call's sequences as the op takes them: int32 offsets on q's device
    (``num_seqs + 1`` entries each) and the longest lengths."""

    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int


def make_launcher(kernel: LoadedKernel, choice: Choice, call: Call) -> Launcher | PackedLauncher:
    """The launcher of one decision: :class:`Launcher` for a dense call (its geometry is the
    call's), :class:`PackedLauncher` for a packed one (its grid is worked out per call)."""
    if call.packed is None:
        return Launcher(kernel, choice.config, choice.source, call.shape, call.tag, call.variant)
    s = call.shape
    return PackedLauncher(kernel, choice.config, choice.source, s.heads, s.kv_heads,
                          call.variant)  # fmt: skip


def variant_argument(config: AnyConfig, variant: Variant) -> Any | None:
    """The kernel's last argument for a config built with variant switches (the variant's
    run-time values, its sinks pointer null until a call patches it), or None for a config
    without (its kernel takes no such argument). The decision's variant is normalised with
    the call's lengths already; :func:`measure.params.launch_variant` gives the window the
    kernel takes (a causal config's right bound 0)."""
    if not getattr(config, "has_variant", False):
        return None
    from measure.params import FaVariant, launch_variant

    w = launch_variant(config.causal, variant)
    return FaVariant(w.window_left, w.window_right, w.chunk, float(w.softcap), None)


def load_kernel(config: AnyConfig, device: DeviceInfo) -> LoadedKernel:
    """``config``'s kernel on ``device``: built on first use, loaded once per process.

    Raises:
        Unsupported: no cuda-bindings, no nvcc for a first build, a failed build or load.
    """
    key = (device.index, config.name)
    with _lock:
        kernel = _loaded.get(key)
        if kernel is not None:
            return kernel
        try:
            from measure.loader import driver

            driver()
        except ImportError:
            raise Unsupported("cuda-bindings is not installed") from None
        arch = arch_of(device.compute_capability)
        if arch is None:  # choose_config refuses these first; kept for direct callers
            raise Unsupported(f"no fa2tune build for {device.name}")
        start = time.perf_counter()
        try:
            (report,) = build_configs([config], arch)
        except NvccNotFoundError as exc:
            why = (f"a compiler is needed for the first build of {config.name} (nvcc, or NVRTC "
                   f"from the cuda-bindings and nvidia-cuda-nvrtc wheels): {exc}")  # fmt: skip
            raise Unsupported(why) from exc
        took = time.perf_counter() - start
        if took >= 0.5:  # compiled now, not read from the build cache: say what took so long
            log.info("fa2tune.torch: built %s for %s on first use in %.1f s (%s)", config.name,
                     arch, took, report.nvcc_version)  # fmt: skip
        if not report.usable or report.cubin is None:
            raise Unsupported(f"build of {config.name} for {arch} failed: {report.error}")
        with torch.cuda.device(device.index):  # restores the caller's current device
            ensure_context(device.index)
            try:
                kernel = LoadedKernel.for_config(config, report.cubin)
            except CudaError as exc:
                raise Unsupported(f"loading {config.name} failed: {exc}") from exc
        log.debug("loaded %s on cuda:%d from %s", config.name, device.index, report.cubin)
        _loaded[key] = kernel
        return kernel


#: Bound launches with their TMA descriptors kept per stride pattern (fa3), by pointers.
_TMA_CACHE = 64


class _Variant:
    """One stride pattern of a launcher: its packed argument, a bound launch per stream and
    (fa3) bound launches with their TMA descriptors per (q, k, v pointers, stream)."""

    __slots__ = ("bound", "params", "tma")

    def __init__(self, params: FaParams) -> None:
        self.params = params
        #: by stream, or (split-KV) by (stream, counters pointer, partials pointer)
        self.bound: dict[object, BoundLaunch] = {}
        self.tma: dict[tuple[int, int, int, int], BoundLaunch] = {}


class Launcher:
    """One decision of the op: a loaded kernel, its config and the launch of one call shape.

    Calling it launches on the current stream of the tensors' device. Made once per decision:
    grid, block, shared memory, and per stride pattern of (q, k, v) the checked
    :class:`FaParams` (strides and sizes filled in) with a bound launch per stream. A call
    patches the pointers and the scale in place and launches; the driver copies the argument
    at launch, and a lock keeps two threads from patching one argument at once.

    Attributes:
        kernel, config, source: what serves the decision and where the choice came from.
        tag: the decision's :attr:`fa2tune.ops.selection.Call.tag` (tuning results forget it).
    """

    __slots__ = (
        "_block",
        "_fv",
        "_fv_args",
        "_grid",
        "_lock",
        "_prep",
        "_sliced",
        "_smem",
        "_variant_of_call",
        "_variants",
        "_ws",
        "_ws_args",
        "config",
        "kernel",
        "source",
        "tag",
    )  # fmt: skip

    def __init__(
        self,
        kernel: LoadedKernel,
        config: AnyConfig,
        source: str,
        shape: Shape,
        tag: object = None,
        variant: Variant = PLAIN,
    ) -> None:
        self.kernel = kernel
        self.config = config
        self.source = source
        self.tag = tag
        # The variant kernel's last argument (one object: every bound launch points at it).
        self._fv = variant_argument(config, variant)
        self._fv_args: tuple[Any, ...] = () if self._fv is None else (self._fv,)
        self._variant_of_call = variant
        grid, block = launch_geometry(
            config, shape.nq, shape.heads, shape.batch, nk=shape.nk, kv_heads=shape.kv_heads
        )
        self._grid = grid
        self._block = block
        self._smem = config.smem_bytes
        # A batch past the grid's y/z limit is cut into slices by bind_config (rare: slow path).
        self._sliced = max(grid[1], grid[2]) > GRID_YZ_LIMIT
        self._lock = threading.Lock()
        self._variants: dict[tuple[object, ...], _Variant] = {}
        self._ws: SplitKvWorkspace | None = None
        self._ws_args: tuple[ctypes.c_void_p, ...] = ()
        self._prep: HostPrep | None = None
        if family_of(config).workspace_sizes is not None:  # its kernels merge splits
            self._ws = SplitKvWorkspace(config, shape)
            if self._ws.needed and self._ws.counters != grid[0]:  # pragma: no cover - drift
                raise AssertionError(f"{config.name}: {self._ws.counters} counters, grid {grid}")
            # The kernel's three workspace arguments when it has one split: null pointers (it
            # touches no workspace); otherwise per (stream, buffers), see __call__.
            self._ws_args = (ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p())
        else:
            self._prep = host_prep(config.family)

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        o: torch.Tensor,
        lse: torch.Tensor | None,
        scale: float,
        layout: Layout,
        seqs: CuSeqlens | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        """Launch once into ``o`` (and ``lse``); ``seqs`` is a packed call's (None here);
        ``sinks`` the fp32 ``[Hq]`` sink logits of a variant with sinks.

        Raises:
            ValueError: tensors the ABI does not take (strides, alignment): the caller falls
                back or re-raises.
            CudaError: the driver refused the launch.
        """
        index = q.get_device()  # an int: cheaper than q.device on the per-call path
        stream = raw_stream(index) if raw_stream is not None else current_stream(q.device)
        fv = self._fv
        if self._sliced:
            with self._lock:
                # The slow path binds afresh: the loader builds the FaVariant of the slices.
                self.kernel.bind_config(self.config, q, k, v, o, lse, scale, layout, stream,
                                        variant=self._variant_of_call, sinks=sinks)()  # fmt: skip
            return
        qp, kp, vp, op = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
        variant = self._variants.get((q.stride(), k.stride(), v.stride()))
        if variant is None or (qp | kp | vp | op) % ALIGN_BYTES:
            variant = self._variant(q, k, v, o, lse, scale, layout)  # raises ValueError
        ws = self._ws
        keep: object = None
        ws_key: tuple[int, int, int] | None = None
        if ws is not None and ws.needed:
            if capturing():
                count_ptr, partials_ptr, keep = ws.captured(q.device)
            else:
                # The stream's own buffers: stable between calls, so a bound launch per
                # (stream, buffers) carries them and a call patches nothing for them.
                count_ptr, base = ws.stream_args(index, stream)
                ws_key = (stream, count_ptr, base)
        with self._lock:
            p = variant.params
            p.q, p.k, p.v, p.o = qp, kp, vp, op
            p.lse = lse.data_ptr() if lse is not None else None
            p.softmax_scale = scale
            if fv is not None:
                fv.sinks = sinks.data_ptr() if sinks is not None else None
            if self._prep is not None:
                # fa3: TMA descriptors hold the pointers (and this pattern's shape and
                # strides): encoded once per pointer triple, the last few kept.
                tma_key = (qp, kp, vp, stream)
                bound = variant.tma.get(tma_key)
                if bound is None:
                    prep = self._prep(self.config, q, k, v, layout)  # may raise ValueError
                    bound = self.kernel.bind(p, self._grid, self._block, self._smem, stream,
                                             (*prep, *self._fv_args))  # fmt: skip
                    if len(variant.tma) >= _TMA_CACHE:
                        del variant.tma[next(iter(variant.tma))]
                    variant.tma[tma_key] = bound
                bound()
                return
            if keep is not None:  # captured: a one-off bound launch on this call's workspace
                assert ws is not None
                self.kernel.bind(p, self._grid, self._block, self._smem, stream,
                                 (*ws.args(count_ptr, partials_ptr), *self._fv_args))()  # fmt: skip
                del keep  # the launch is queued: the workspace may go back to the pool
                return
            key: object = ws_key if ws_key is not None else stream
            bound = variant.bound.get(key)
            if bound is None:
                args = self._ws_args  # null pointers with one split; () for fa2
                if ws is not None and ws_key is not None:
                    args = ws.args(ws_key[1], ws_key[2])
                bound = self.kernel.bind(p, self._grid, self._block, self._smem, stream,
                                         (*args, *self._fv_args))  # fmt: skip
                variant.bound[key] = bound
            bound()

    def _variant(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        o: torch.Tensor,
        lse: torch.Tensor | None,
        scale: float,
        layout: Layout,
    ) -> _Variant:
        """:func:`make_params`'s checks for a new stride pattern (or misaligned pointers);
        the checked argument is kept for the pattern's later calls."""
        params = make_params(q, k, v, o, lse, scale, layout)  # raises ValueError on bad input
        key = (q.stride(), k.stride(), v.stride())
        with self._lock:
            variant = self._variants.get(key)
            if variant is None:
                variant = _Variant(params)
                if len(self._variants) < 16:  # a few patterns per shape; odd ones stay slow
                    self._variants[key] = variant
        return variant


#: Bound launches kept per stride pattern of a packed launcher: by (stream, grid x), or, for a
#: family with extra arguments (fa3's TMA descriptors hold the pointers and the packed row
#: counts), by pointers, rows, stream and grid x.
_BOUND_CACHE = 64


class _PackedVariant:
    """One stride pattern of a packed launcher: the checked kernel argument, the packed-batch
    argument (both patched per call) and bound launches that point at them."""

    __slots__ = ("bound", "params", "varlen")

    def __init__(self, params: FaParams) -> None:
        self.params = params
        self.varlen = FaVarlen(None, None, 0, 0)
        self.bound: dict[tuple[int, ...], BoundLaunch] = {}


class PackedLauncher:
    """One packed decision: a loaded ``_vl`` kernel, its config, and its launches (the
    loader's packed mode, :meth:`measure.loader.LoadedKernel.bind_config` with ``packed``,
    with its per-call work kept small).

    Per stride pattern of (q, k, v) (and whether each has 0, 1 or more rows),
    :func:`measure.params.packed_params`'s checks run once and its :class:`FaParams` is
    kept. A call patches pointers, longest lengths, the number of sequences and the scale
    into it and into one :class:`FaVarlen`, and calls a bound launch (a family without extra
    arguments: per stream and grid; one with them, whose descriptors hold the pointers and
    the packed row counts: per pointers, packed rows, stream and grid, holding
    :func:`measure.loader.packed_extra_args`), the last :data:`_BOUND_CACHE` kept. More
    sequences than the grid's z allows run as launches over slices of the offsets.

    Attributes:
        kernel, config, source: what serves the decision and where the choice came from.
    """

    __slots__ = ("_block", "_extra", "_fv", "_fv_args", "_heads", "_kv_heads", "_lock", "_smem",
                 "_variants", "config", "kernel", "source")  # fmt: skip

    def __init__(
        self,
        kernel: LoadedKernel,
        config: AnyConfig,
        source: str,
        heads: int,
        kv_heads: int,
        variant: Variant = PLAIN,
    ) -> None:
        self.kernel = kernel
        self.config = config
        self.source = source
        self._fv = variant_argument(config, variant)
        self._fv_args: tuple[Any, ...] = () if self._fv is None else (self._fv,)
        self._heads = heads
        self._kv_heads = kv_heads
        # A family whose packed kernels take extra arguments (TMA descriptors) after FaVarlen.
        self._extra = family_of(config).varlen_host_prep is not None
        self._block = launch_geometry(config, 1, heads, 1, nk=1, kv_heads=kv_heads)[1]
        self._smem = config.smem_bytes
        self._lock = threading.Lock()
        self._variants: dict[tuple[object, ...], _PackedVariant] = {}

    def _grid(self, max_seqlen_q: int, max_seqlen_k: int, count: int) -> tuple[int, int, int]:
        grid, _ = launch_geometry(self.config, max_seqlen_q, self._heads, count,
                                  nk=max(max_seqlen_k, 1), kv_heads=self._kv_heads)  # fmt: skip
        return grid

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        o: torch.Tensor,
        lse: torch.Tensor | None,
        scale: float,
        layout: Layout,
        seqs: CuSeqlens | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        """Launch once into ``o`` (and ``lse``), on the current stream of q's device
        (:class:`Launcher`'s call with the sequences; ``layout`` is unused: packed).

        Raises:
            ValueError: tensors the ABI does not take (strides, alignment, empty k): the
                caller falls back or re-raises.
            CudaError: the driver refused the launch.
        """
        assert seqs is not None  # the op passes a packed call's sequences
        cu_q, cu_k, max_seqlen_q, max_seqlen_k = seqs
        stream = current_stream(q.device)
        total_q, total_k = int(q.shape[0]), int(k.shape[0])
        count = int(cu_q.shape[0]) - 1
        if self._heads > GRID_YZ_LIMIT:
            raise ValueError(f"{self._heads} heads: past the grid's y limit {GRID_YZ_LIMIT}")
        qp, kp, vp, op = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
        # Row counts 0, 1 and more than 1 are told apart: a one-row tensor's row stride is
        # never checked, and no keys at all is refused (make_params).
        pattern = (q.stride(), k.stride(), v.stride(), min(total_q, 2), min(total_k, 2))
        variant = self._variants.get(pattern)
        if variant is None or (qp | kp | vp | op) % ALIGN_BYTES:
            variant = self._variant(q, k, v, o, pattern)  # raises ValueError
        if not cu_q.is_contiguous():
            cu_q = cu_q.contiguous()  # the kernel reads entries b and b + 1 of a flat array
        if not cu_k.is_contiguous():
            cu_k = cu_k.contiguous()
        cqp, ckp = cu_q.data_ptr(), cu_k.data_ptr()
        maps: tuple[Any, ...] = ()
        with self._lock:
            p = variant.params
            p.q, p.k, p.v, p.o = qp, kp, vp, op
            p.lse = lse.data_ptr() if lse is not None else None
            p.softmax_scale = scale
            p.nq, p.nk = max_seqlen_q, max_seqlen_k
            vl = variant.varlen
            vl.cu_seqlens_q, vl.cu_seqlens_k, vl.total_q = cqp, ckp, total_q
            if self._fv is not None:
                self._fv.sinks = sinks.data_ptr() if sinks is not None else None
            if count > GRID_YZ_LIMIT:  # rare: launches over slices of the offsets
                if self._extra:
                    maps = self._maps(q, k, v)
                for b0 in range(0, count, GRID_YZ_LIMIT):
                    n = min(GRID_YZ_LIMIT, count - b0)
                    part = FaParams.from_buffer_copy(p)
                    part.batch = n
                    part_vl = FaVarlen(cqp + 4 * b0, ckp + 4 * b0, total_q, 0)
                    grid = self._grid(max_seqlen_q, max_seqlen_k, n)
                    self.kernel.bind(part, grid, self._block, self._smem, stream,
                                     (part_vl, *maps, *self._fv_args))()  # fmt: skip
                return
            p.batch = count
            grid = self._grid(max_seqlen_q, max_seqlen_k, count)
            key = (qp, kp, vp, total_q, total_k, stream, grid[0]) if self._extra else (
                stream, grid[0])  # fmt: skip
            bound = variant.bound.get(key)
            if bound is None:
                if self._extra:
                    maps = self._maps(q, k, v)  # may raise ValueError
                bound = self.kernel.bind(p, grid, self._block, self._smem, stream,
                                         (vl, *maps, *self._fv_args))  # fmt: skip
                if len(variant.bound) >= _BOUND_CACHE:
                    del variant.bound[next(iter(variant.bound))]
                variant.bound[key] = bound
            bound()

    def _maps(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[Any, ...]:
        return packed_extra_args(self.config, q, k, v)

    def _variant(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        o: torch.Tensor,
        pattern: tuple[object, ...],
    ) -> _PackedVariant:
        """:func:`packed_params`'s checks on the packed tensors; the checked argument is kept
        for the pattern (pointers, lengths and scale are patched per call)."""
        seqs = PackedSeqs(0, 0, 1, 1, 1)
        params, _ = packed_params(q, k, v, o, None, 1.0, seqs)  # raises ValueError on bad input
        with self._lock:
            variant = self._variants.get(pattern)
            if variant is None:
                variant = _PackedVariant(params)
                if len(self._variants) < 16:  # a few patterns per decision; odd ones stay slow
                    self._variants[pattern] = variant
        return variant
