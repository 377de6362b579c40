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

Split-KV's workspace (:class:`SplitKvWorkspace`): one float32 partial O and LSE per (row tile,
split) and an int counter per row tile that must be zero before a launch; the kernel's last
block of a tile resets its counter, so counters that were zero stay zero. Outside CUDA-graph
capture both live in grow-only buffers per (device, stream) (:func:`_stream_workspace`),
allocated with the driver, the counters zeroed once: launches on one stream run in order and
a launch reads its partials only inside itself, so every launch on the stream can reuse them,
as splitkv_launch.cuh's ``launch()`` does, and a call allocates nothing (a ``torch.empty``
per call cost ~10 µs of host time). :func:`free_workspaces` gives them back. During capture a
call allocates one tensor from the graph's private pool and zeroes its counter region, so a
captured graph owns its workspace. With one split the kernel touches no workspace (null
pointers, as the header's launcher passes). The worker's NaN poisoning of partials is left
out.

Imports torch: only :mod:`fa2tune.ops.torch_op` imports this module.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from codegen.build import NvccNotFoundError, build_configs
from core.family import AnyConfig
from core.shape import Shape
from core.splitkv_config import SplitKvConfig
from fa2tune.ops.choice import Unsupported, arch_of, splitkv_workspace_sizes
from measure.loader import (
    GRID_YZ_LIMIT,
    BoundLaunch,
    CudaError,
    HostPrep,
    LoadedKernel,
    ensure_context,
    host_prep,
    launch_geometry,
)
from measure.params import ALIGN_BYTES, FaParams, Layout, make_params

log = logging.getLogger(__name__)

# The current stream's handle without building a torch.cuda.Stream object (a few µs a call);
# torch's own code generators use it. The public path stands in where it is missing.
_raw_stream: Callable[[int], int] | None = getattr(torch._C, "_cuda_getCurrentRawStream", None)
# torch.cuda.is_current_stream_capturing() without its Python wrapper.
_capturing: Callable[[], bool] = getattr(
    torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing
)


def current_stream(device: torch.device) -> int:
    """The raw handle of ``device``'s current stream."""
    index = device.index
    if _raw_stream is not None and index is not None:
        return _raw_stream(index)
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
        try:
            (report,) = build_configs([config], arch)
        except NvccNotFoundError as exc:
            why = f"nvcc is needed for the first build of {config.name}: {exc}"
            raise Unsupported(why) from exc
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


class SplitKvWorkspace:
    """Split-KV's workspace for one call shape (sizes: :func:`~fa2tune.ops.choice.
    splitkv_workspace_sizes`) and the buffers a call uses."""

    __slots__ = ("counters", "d", "partial_rows")

    def __init__(self, config: SplitKvConfig, shape: Shape) -> None:
        self.d = config.d
        #: int32 counters, one per row tile (0: one split, no workspace at all); float32
        #: rows of partial O (d each) and LSE (1 each).
        self.counters, self.partial_rows = splitkv_workspace_sizes(config, shape)

    @property
    def needed(self) -> bool:
        return self.counters > 0

    def captured(self, device: torch.device) -> tuple[int, int, torch.Tensor]:
        """``(counters pointer, partials pointer, owner)`` for a launch being captured into a
        CUDA graph:
        one allocation from the graph's pool, counters first (rounded to 16 bytes so the
        float4 partials stay aligned), counters zeroed; the graph owns its workspace and
        replays on any stream. ``owner`` must live until the launch has been queued."""
        head = -(-self.counters // 4) * 4
        ws = torch.empty(head + self.partial_rows * (self.d + 1), dtype=torch.float32,
                         device=device)  # fmt: skip
        ws[:head].zero_()
        base = ws.data_ptr()
        return base, base + 4 * head, ws

    def stream_args(self, device: int, stream: int) -> tuple[int, int]:
        """``(counters pointer, partials pointer)`` of ``stream``'s buffers, big enough for
        this shape (:func:`_stream_workspace`)."""
        return _stream_workspace(device, stream, self.counters, self.partial_rows * (self.d + 1))

    def args(self, counters_ptr: int, partials_ptr: int) -> tuple[ctypes.c_void_p, ...]:
        """The kernel's three workspace arguments (partial O, partial LSE, counters)."""
        lse_ptr = partials_ptr + 4 * self.partial_rows * self.d
        return (ctypes.c_void_p(partials_ptr), ctypes.c_void_p(lse_ptr),
                ctypes.c_void_p(counters_ptr))  # fmt: skip


_ws_lock = threading.Lock()
# (device index, stream) -> [counters pointer, counters, partials pointer, floats] of that
# stream's split-KV workspace: grow-only, shared by every split-KV launch on the stream.
# Allocated with the driver, outside torch's allocator: a buffer kept across calls must not
# come from a private memory pool (torch.compile's CUDA-graph trees run warm-up calls in one
# and may recycle its blocks).
_workspaces: dict[tuple[int, int], list[int]] = {}


def _stream_workspace(device: int, stream: int, counters: int, floats: int) -> tuple[int, int]:
    """``(counters pointer, partials pointer)`` of ``stream``'s workspace: at least
    ``counters`` int32 counters, all zero, and ``floats`` float32s of scratch."""
    entry = _workspaces.get((device, stream))
    if entry is not None and entry[1] >= counters and entry[3] >= floats:
        return entry[0], entry[2]
    from measure.loader import call

    with _ws_lock:
        old = _workspaces.get((device, stream)) or [0, 0, 0, 0]
        new = list(old)
        if old[1] < counters:
            new[1] = max(counters, 4096, 2 * old[1])
            new[0] = int(call("cuMemAlloc", 4 * new[1]))
            call("cuMemsetD32Async", new[0], 0, new[1], stream)  # before the stream's launches
        if old[3] < floats:
            new[3] = max(floats, 1 << 16, old[3] + old[3] // 2)
            new[2] = int(call("cuMemAlloc", 4 * new[3]))
        if old[0] != new[0] or old[2] != new[2]:
            if old[1] or old[3]:  # the old buffers may still be read by queued launches
                call("cuStreamSynchronize", stream)
            for before, after in ((old[0], new[0]), (old[2], new[2])):
                if before and before != after:
                    call("cuMemFree", before)
        _workspaces[(device, stream)] = new
        return new[0], new[2]


def free_workspaces() -> int:
    """Give every stream's split-KV workspace back to the driver (each device synchronised
    first: a stream may have been destroyed since); the next split-KV call allocates again.
    Returns the bytes freed."""
    from measure.loader import call

    freed = 0
    with _ws_lock:
        for (device, _), (counters_ptr, counters, partials_ptr, floats) in _workspaces.items():
            torch.cuda.synchronize(device)
            with torch.cuda.device(device):
                for ptr in (counters_ptr, partials_ptr):
                    if ptr:
                        call("cuMemFree", ptr)
            freed += 4 * (counters + floats)
        _workspaces.clear()
    return freed


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
        "_block", "_grid", "_lock", "_prep", "_sliced", "_smem", "_variants", "_ws", "_ws_args",
        "config", "kernel", "source", "tag",
    )  # fmt: skip

    def __init__(
        self,
        kernel: LoadedKernel,
        config: AnyConfig,
        source: str,
        shape: Shape,
        tag: object = None,
    ) -> None:
        self.kernel = kernel
        self.config = config
        self.source = source
        self.tag = tag
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
        if isinstance(config, SplitKvConfig):
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
    ) -> None:
        """Launch once into ``o`` (and ``lse``).

        Raises:
            ValueError: tensors the ABI does not take (strides, alignment): the caller falls
                back or re-raises.
            CudaError: the driver refused the launch.
        """
        stream = current_stream(q.device)
        if self._sliced:
            self.kernel.bind_config(self.config, q, k, v, o, lse, scale, layout, stream)()
            return
        qp, kp, vp, op = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
        variant = self._variants.get((q.stride(), k.stride(), v.stride()))
        if variant is None or (qp | kp | vp | op) % ALIGN_BYTES:
            variant = self._variant(q, k, v, o, lse, scale, layout)  # raises ValueError
        ws = self._ws
        keep: object = None
        ws_key: tuple[int, int, int] | None = None
        if ws is not None and ws.needed:
            if _capturing():
                count_ptr, partials_ptr, keep = ws.captured(q.device)
            else:
                # The stream's own buffers: stable between calls, so a bound launch per
                # (stream, buffers) carries them and a call patches nothing for them.
                count_ptr, base = ws.stream_args(q.device.index or 0, stream)
                ws_key = (stream, count_ptr, base)
        with self._lock:
            p = variant.params
            p.q, p.k, p.v, p.o = qp, kp, vp, op
            p.lse = lse.data_ptr() if lse is not None else None
            p.softmax_scale = scale
            if self._prep is not None:
                # fa3: TMA descriptors hold the pointers (and this pattern's shape and
                # strides): encoded once per pointer triple, the last few kept.
                tma_key = (qp, kp, vp, stream)
                bound = variant.tma.get(tma_key)
                if bound is None:
                    extra = self._prep(self.config, q, k, v, layout)  # may raise ValueError
                    bound = self.kernel.bind(p, self._grid, self._block, self._smem, stream,
                                             extra)  # fmt: skip
                    if len(variant.tma) >= _TMA_CACHE:
                        del variant.tma[next(iter(variant.tma))]
                    variant.tma[tma_key] = bound
                bound()
                return
            if keep is not None:  # captured: a one-off bound launch on this call's workspace
                assert ws is not None
                self.kernel.bind(p, self._grid, self._block, self._smem, stream,
                                 ws.args(count_ptr, partials_ptr))()  # fmt: skip
                del keep  # the launch is queued: the workspace may go back to the pool
                return
            key: object = ws_key if ws_key is not None else stream
            bound = variant.bound.get(key)
            if bound is None:
                extra = self._ws_args  # null pointers with one split; () for fa2
                if ws is not None and ws_key is not None:
                    extra = ws.args(ws_key[1], ws_key[2])
                bound = self.kernel.bind(p, self._grid, self._block, self._smem, stream, extra)
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
