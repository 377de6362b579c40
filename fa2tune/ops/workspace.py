"""Split-KV's workspace for the torch op's launches (torch imported when used).

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
"""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING

from codegen.families import family_of
from core.family import AnyConfig
from core.shape import Shape

if TYPE_CHECKING:
    import torch


class SplitKvWorkspace:
    """A split workspace for one call shape (sizes: the config's family's
    ``workspace_sizes``, :class:`codegen.families.Family`) and the buffers a call uses."""

    __slots__ = ("counters", "d", "floats", "partial_rows")

    def __init__(self, config: AnyConfig, shape: Shape) -> None:
        sizes = family_of(config).workspace_sizes
        if sizes is None:
            raise ValueError(f"{config.name}: its family's kernels take no workspace")
        self.d = config.d
        #: int32 counters, one per row tile (0: one split, no workspace at all); float32
        #: rows of partial O (d each) and LSE (1 each).
        self.counters, self.partial_rows = sizes(config, shape)
        #: float32s of scratch: the partial O rows and their LSEs.
        self.floats = self.partial_rows * (self.d + 1)

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
        import torch

        ws = torch.empty(head + self.partial_rows * (self.d + 1), dtype=torch.float32,
                         device=device)  # fmt: skip
        ws[:head].zero_()
        base = ws.data_ptr()
        return base, base + 4 * head, ws

    def stream_args(self, device: int, stream: int) -> tuple[int, int]:
        """``(counters pointer, partials pointer)`` of ``stream``'s buffers, big enough for
        this shape (:func:`_stream_workspace`)."""
        entry = _workspaces.get((device, stream))  # the per-call case, without a call more
        if entry is not None and entry[1] >= self.counters and entry[3] >= self.floats:
            return entry[0], entry[2]
        return _stream_workspace(device, stream, self.counters, self.floats)

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
    import torch

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
