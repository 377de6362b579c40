"""A KV-cache decision's launcher (:mod:`fa2tune.ops.kvcache`): the loaded cache kernel and
its append kernel with their arguments made once per stride pattern and stream, patched with
each call's pointers. Imports torch.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from codegen.families import family_of
from core.shape import Shape
from core.variant import Variant
from fa2tune.ops.kernels import capturing, current_stream, raw_stream
from fa2tune.ops.workspace import SplitKvWorkspace
from measure.loader import BoundLaunch, LoadedKernel, launch_geometry
from measure.params import (
    ALIGN_BYTES,
    FaKvAppend,
    FaKvCache,
    FaParams,
    FaVariant,
    append_params,
    cache_params,
    launch_variant,
)

#: Bound launches kept per stride pattern of a launcher with TMA descriptors (by pointers).
_TMA_BOUND = 16
_INT32 = torch.int32
#: Threads per block of the append kernel (kv_append.cuh's launch bounds).
_APPEND_THREADS = 256


class _Pattern:
    """One stride pattern of a cache launcher: the checked ``FaParams`` (pointers patched per
    call), the append's argument, and bound launches by (stream, workspace buffers)."""

    __slots__ = ("append", "bound", "params")

    def __init__(self, params: FaParams, append: FaKvAppend | None) -> None:
        self.params = params
        self.append = append
        self.bound: dict[tuple[int, ...], tuple[BoundLaunch, BoundLaunch | None]] = {}


class CacheLauncher:
    """One cache decision: the loaded cache kernel and its append kernel, their geometry for
    the decision's shapes and the arguments they take (``FaParams``, the workspace,
    ``FaVariant``, ``FaKvCache``; the append ``FaParams``, ``FaKvAppend``, ``FaKvCache``),
    made once per stride pattern and stream and patched per call with the pointers.

    Attributes:
        kernel, config, source: the loaded kernel, its config and where its tile came from.
    """

    __slots__ = ("_append_grid", "_append_kernel", "_block", "_capacity", "_fv", "_grid",
                 "_kc", "_lock", "_page", "_patterns", "_prep", "_smem", "_table_gaps", "_ws",
                 "_ws_needed", "config", "kernel", "source")  # fmt: skip

    def __init__(self, kernel: LoadedKernel, config: Any, source: str, shape: Shape,
                 variant: Variant, table_stride: int, added: int, page: int,
                 table_gaps: bool = False) -> None:  # fmt: skip
        self.kernel = kernel
        # The block table's strides are part of the decision's key: whether its rows need a
        # contiguous copy is known here, once.
        self._table_gaps = table_gaps
        self.config = config
        self.source = source
        grid, block = launch_geometry(config, shape.nq, shape.heads, shape.batch, nk=shape.nk,
                                      kv_heads=shape.kv_heads)  # fmt: skip
        self._grid, self._block, self._smem = grid, block, config.smem_bytes
        self._capacity, self._page = shape.nk, page
        w = launch_variant(config.causal, variant, shape.nq, None)
        self._fv = FaVariant(w.window_left, w.window_right, w.chunk, float(w.softcap), None)
        self._kc = FaKvCache(None, None, None, table_stride, added, None)
        # Split-KV's kernels take a workspace; the Hopper family's take TMA descriptors over
        # the call's tensors (Family.cache_host_prep), made per pointer triple in __call__.
        family = family_of(config)
        self._prep = family.cache_host_prep
        self._ws = SplitKvWorkspace(config, shape) if family.workspace_sizes else None
        self._ws_needed = self._ws is not None and self._ws.needed
        self._lock = threading.Lock()
        self._patterns: dict[tuple[object, ...], _Pattern] = {}
        self._append_kernel: LoadedKernel | None = None
        chunks = shape.batch * added * shape.kv_heads * (config.d // 8) * 2  # K and V
        self._append_grid = (max(1, min(-(-chunks // _APPEND_THREADS), 65535)), 1, 1)
        if added:  # the append kernel lives in the same cubin, named <config>_append
            self._append_kernel = LoadedKernel.from_file(kernel.source, config.name + "_append")

    def _pattern(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 o: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                 key: tuple[object, ...]) -> _Pattern:  # fmt: skip
        """The checked arguments of a new stride pattern (kept for its later calls)."""
        params = cache_params(q, k_cache, v_cache, o, None, 1.0, self._capacity)  # may raise
        append = append_params(k, v, self._page) if k is not None and v is not None else None
        pattern = _Pattern(params, append)
        if len(self._patterns) < 16:  # a few per decision; odd ones are checked every call
            self._patterns[key] = pattern
        return pattern

    def _bind(
        self,
        pattern: _Pattern,
        stream: int,
        ws_ptrs: tuple[int, int],
        tensors: tuple[torch.Tensor, ...],
    ) -> tuple[BoundLaunch, BoundLaunch | None]:
        """The attention's and the append's bound launches on ``stream`` with that
        workspace, or the descriptors over ``tensors`` (q and the caches) for a family that
        takes them (the append's None when the call appends nothing)."""
        p = pattern.params
        if self._prep is not None:
            extra = tuple(self._prep(self.config, *tensors, self._capacity))  # may raise
        else:
            extra = tuple(self._ws.args(*ws_ptrs)) if self._ws is not None else ()
        attend = self.kernel.bind(p, self._grid, self._block, self._smem, stream,
                                  (*extra, self._fv, self._kc))  # fmt: skip
        if pattern.append is None or self._append_kernel is None:
            return attend, None
        add = self._append_kernel.bind(p, self._append_grid, (_APPEND_THREADS, 1, 1), 0, stream,
                                       (pattern.append, self._kc))  # fmt: skip
        return attend, add

    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        o: torch.Tensor,
        lse: torch.Tensor | None,
        scale: float,
        cache_seqlens: torch.Tensor,
        page_table: torch.Tensor | None,
        cache_batch_idx: torch.Tensor | None,
        cache_leftpad: torch.Tensor | None,
        sinks: torch.Tensor | None,
        index: int,
    ) -> None:
        """Append ``k``/``v`` (when given) and attend: one launch each, on the current stream
        of device ``index`` (q's, current).

        Raises:
            ValueError: strides or alignment the kernels do not take (the caller falls back).
            measure.loader.CudaError: the driver refused a launch.
        """
        if not cache_seqlens.is_contiguous() or cache_seqlens.dtype is not _INT32:
            cache_seqlens = cache_seqlens.to(_INT32).contiguous()  # a device-side cast
        if cache_batch_idx is not None and (cache_batch_idx.dtype is not _INT32
                                            or not cache_batch_idx.is_contiguous()):  # fmt: skip
            cache_batch_idx = cache_batch_idx.to(_INT32).contiguous()
        if cache_leftpad is not None and (cache_leftpad.dtype is not _INT32
                                          or not cache_leftpad.is_contiguous()):  # fmt: skip
            cache_leftpad = cache_leftpad.to(_INT32).contiguous()
        if page_table is not None and self._table_gaps:
            page_table = page_table.contiguous()
        qp, kp, vp = q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr()
        if k is None or v is None:
            key: tuple[object, ...] = (q.stride(), k_cache.stride(), v_cache.stride())
            misaligned = (qp | kp | vp) % ALIGN_BYTES
        else:
            key = (q.stride(), k_cache.stride(), v_cache.stride(), k.stride(), v.stride())
            misaligned = (qp | kp | vp | k.data_ptr() | v.data_ptr()) % ALIGN_BYTES
        pattern = self._patterns.get(key)
        if pattern is None or misaligned:
            pattern = self._pattern(q, k_cache, v_cache, o, k, v, key)  # raises ValueError
        stream = raw_stream(index) if raw_stream is not None else current_stream(q.device)
        keep: object = None
        captured = capturing()
        ws = self._ws
        if ws is None or not self._ws_needed:
            ws_ptrs: tuple[int, int] = (0, 0)
        elif captured:
            count_ptr, partials_ptr, keep = ws.captured(q.device)
            ws_ptrs = (count_ptr, partials_ptr)
        else:
            ws_ptrs = ws.stream_args(index, stream)
        with self._lock:
            p = pattern.params
            p.q, p.k, p.v, p.o = qp, kp, vp, o.data_ptr()
            p.lse = lse.data_ptr() if lse is not None else None
            p.softmax_scale = scale
            fv, kc = self._fv, self._kc
            fv.sinks = sinks.data_ptr() if sinks is not None else None
            kc.seqlens = cache_seqlens.data_ptr()
            kc.batch_idx = cache_batch_idx.data_ptr() if cache_batch_idx is not None else None
            kc.leftpad = cache_leftpad.data_ptr() if cache_leftpad is not None else None
            kc.block_table = page_table.data_ptr() if page_table is not None else None
            append = pattern.append
            if append is not None and k is not None and v is not None:
                append.k_new, append.v_new = k.data_ptr(), v.data_ptr()
            # Descriptors hold q's and the caches' addresses: bound per pointer triple, the
            # last few kept (no workspace: a captured launch may keep its bound launch too).
            by_pointers = self._prep is not None
            bound_key = (stream, qp, kp, vp) if by_pointers else (stream, *ws_ptrs)
            launches = None if captured and not by_pointers else pattern.bound.get(bound_key)
            if launches is None:
                launches = self._bind(pattern, stream, ws_ptrs, (q, k_cache, v_cache))
                if not captured or by_pointers:  # a captured workspace belongs to that graph
                    if by_pointers and len(pattern.bound) >= _TMA_BOUND:
                        del pattern.bound[next(iter(pattern.bound))]
                    pattern.bound[bound_key] = launches
            if launches[1] is not None:
                launches[1]()  # the append first: the attention reads the new rows
            launches[0]()
        del keep  # queued: a captured workspace may go back to the graph's pool


__all__ = ["CacheLauncher"]
