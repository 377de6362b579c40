"""Building, loading and launching a chosen config for :mod:`fa2tune.ops.torch_op`.

A config is built on first use (:func:`codegen.build.build_configs`, cached on disk as for
every other stage), loaded once per process and device (:class:`measure.loader.LoadedKernel`
in torch's primary context) and launched with the worker's ABI: :func:`measure.params.
make_params`, then the family's extra arguments, on torch's current stream.

The extra arguments differ from the worker's in one way: split-KV's workspace is allocated
per call through torch's caching allocator (:class:`Launcher`), not bound once as
:func:`measure.splitkv.splitkv_workspace` does for a timing loop. A per-call allocation is
stream-ordered, free after the first call and recorded in a CUDA graph's private pool, so a
captured call replays with its own workspace; the NaN poisoning the worker uses to catch a
merge bug is left out (two fill kernels per call).

Imports torch: only :mod:`fa2tune.ops.torch_op` imports this module.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from codegen.build import NvccNotFoundError, build_configs
from core.family import AnyConfig
from core.shape import Shape
from core.splitkv_config import SplitKvConfig
from fa2tune.ops.choice import Unsupported, arch_of
from measure.loader import (
    GRID_YZ_LIMIT,
    CudaError,
    LoadedKernel,
    ensure_context,
    host_prep,
    launch_geometry,
)
from measure.params import ALIGN_BYTES, Fa2Params, Layout, make_params
from measure.splitkv import DevicePointer

log = logging.getLogger(__name__)

# The current stream's handle without building a torch.cuda.Stream object (a few µs a call);
# torch's own code generators use it. The public path stands in where it is missing.
_raw_stream: Callable[[int], int] | None = getattr(torch._C, "_cuda_getCurrentRawStream", None)

#: Fa2Params's fields after the five pointers and before the scale: strides and sizes.
_SHAPE_FIELDS = tuple(str(field[0]) for field in Fa2Params._fields_[5:-1])

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


Extra = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Layout], Sequence[Any]]


def _pointer(t: torch.Tensor) -> DevicePointer:
    ptr = DevicePointer(t.data_ptr())
    ptr.owner = t  # alive until the launch has copied the argument
    return ptr


def splitkv_sizes(config: SplitKvConfig, shape: Shape) -> tuple[int, int]:
    """``(partial rows, row tiles)`` of split-KV's workspace for a call's shape (as
    :func:`measure.splitkv.splitkv_workspace` sizes it; 1 partial row when unsplit)."""
    splits = config.splits_for(shape.nk)
    tiles = -(-shape.group * shape.nq // config.rows) * shape.kv_heads * shape.batch
    partial = tiles * splits * config.rows if splits > 1 else 1  # 1: a valid, unused pointer
    return partial, max(tiles, 1)


def _splitkv_extra(config: SplitKvConfig, shape: Shape) -> Extra:
    partial, tiles = splitkv_sizes(config, shape)
    d = config.d

    def extra(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Layout) -> Sequence[Any]:
        # One float32 block for partial O and LSE; the counters must start at zero (the last
        # block of a row tile resets its counter, but fresh memory is not zero).
        ws = torch.empty(partial * (d + 1), dtype=torch.float32, device=q.device)
        count = torch.zeros(tiles, dtype=torch.int32, device=q.device)
        return (_pointer(ws[: partial * d]), _pointer(ws[partial * d :]), _pointer(count))

    return extra


def _no_extra(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Layout) -> Sequence[Any]:
    return ()


class Launcher:
    """One decision of the op: a loaded kernel, its config and the launch geometry of one
    call shape. Calling it launches on the current stream of the tensors' device."""

    __slots__ = (
        "_block", "_extra", "_fast", "_grid", "_sliced", "config", "kernel", "source",
    )  # fmt: skip

    def __init__(self, kernel: LoadedKernel, config: AnyConfig, source: str, shape: Shape):
        self.kernel = kernel
        self.config = config
        self.source = source
        grid, block = launch_geometry(
            config, shape.nq, shape.heads, shape.batch, nk=shape.nk, kv_heads=shape.kv_heads
        )
        self._grid = grid
        self._block = block
        # A batch past the grid's y/z limit is cut into slices by bind_config (rare: slow path).
        self._sliced = max(grid[1], grid[2]) > GRID_YZ_LIMIT
        # (strides of q, k, v and whether an LSE is written) that make_params accepted, with
        # the strides and sizes it computed: a call with the same strides skips its checks.
        self._fast: tuple[object, tuple[int, ...]] | None = None
        self._extra: Extra
        if isinstance(config, SplitKvConfig):
            self._extra = _splitkv_extra(config, shape)
        else:
            prep = host_prep(config.family)
            if prep is None:
                self._extra = _no_extra
            else:
                self._extra = lambda q, k, v, layout: prep(config, q, k, v, layout)

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
        index = q.device.index
        if _raw_stream is not None and index is not None:
            stream = _raw_stream(index)
        else:
            stream = torch.cuda.current_stream(q.device).cuda_stream
        if self._sliced:
            self.kernel.bind_config(self.config, q, k, v, o, lse, scale, layout, stream)()
            return
        params = self._params(q, k, v, o, lse, scale, layout)
        extra = self._extra(q, k, v, layout)
        self.kernel.bind(params, self._grid, self._block, self.config.smem_bytes, stream, extra)()

    def _params(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        o: torch.Tensor,
        lse: torch.Tensor | None,
        scale: float,
        layout: Layout,
    ) -> Fa2Params:
        """:func:`make_params`, its checks run once per stride pattern (the shape, dtype and
        device are the decision's key; ``o`` and ``lse`` are the op's own, contiguous)."""
        strides = (q.stride(), k.stride(), v.stride(), lse is not None)
        fast = self._fast
        ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr())
        if (
            fast is not None
            and fast[0] == strides
            and not ((ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3]) % ALIGN_BYTES)
        ):
            lse_ptr = lse.data_ptr() if lse is not None else None
            return Fa2Params(*ptrs, lse_ptr, *fast[1], float(scale))
        params = make_params(q, k, v, o, lse, scale, layout)  # raises ValueError on bad input
        self._fast = (strides, tuple(getattr(params, name) for name in _SHAPE_FIELDS))
        return params
