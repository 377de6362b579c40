"""Loading cubins and launching kernels through the CUDA driver API (``cuda.bindings``).

Holds the driver calls (:func:`driver`, :func:`call`, :class:`CudaError`, context set-up and
health), module loading (:class:`LoadedKernel`) and launching (:class:`BoundLaunch`,
:meth:`LoadedKernel.bind_config`). Every kernel family's kernels take one by-value
:class:`~measure.params.FaParams` first (the ABI of ``docs/architecture.md``, built from
tensors by :func:`measure.params.make_params`), then whatever the family's ``host_prep``
returns (the Hopper family: three ``CUtensorMap`` descriptors, :mod:`codegen.families.fa3.host`;
docs/fa3_kernel.md); grid and block are the family's (:mod:`measure.launch_args`) and the
dynamic shared memory is the config's ``smem_bytes``, to which the kernel's limit is raised
when it is loaded. A packed variable-length launch is the same path in its packed mode
(``bind_config(..., packed=...)``): :func:`measure.params.packed_params`, then the
:class:`~measure.params.FaVarlen`, then :func:`~measure.launch_args.packed_extra_args`.
A config built with an attention-variant switch takes its
:class:`~measure.params.FaVariant` last in either mode (``bind_config(..., variant=,
sinks=)``, :func:`~measure.launch_args.variant_args`); a config whose switches do not fit the
variant is refused there, so no launch of the product runs a kernel with the wrong mask.
Modules are loaded into torch's primary context so that torch tensors and our kernels share
one address space and one stream.

Contract: every failing driver call raises :class:`CudaError` naming the call and the
``CUresult`` (``sticky`` says whether the context is lost). Neither torch nor
``cuda.bindings`` is imported at module import time (nor a family's ``host_prep`` module before
its first launch); CPU machines can import this module (for :func:`grid_for`,
:class:`CudaError`).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codegen.cuda_driver import STICKY_ERRORS as STICKY_ERRORS
from codegen.cuda_driver import CudaError as CudaError
from codegen.cuda_driver import call as call
from codegen.cuda_driver import check as check
from codegen.cuda_driver import driver as driver
from codegen.cuda_driver import error_name as _error_name
from core.family import AnyConfig
from measure.launch_args import (
    HostPrep,
    extra_args,
    grid_for,
    host_prep,
    launch_geometry,
    packed_extra_args,
    variant_args,
)
from measure.params import FaParams, FaVarlen, Layout, PackedSeqs, make_params, packed_params

if TYPE_CHECKING:
    from core.variant import Variant

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


def ensure_context(device: int) -> None:
    """Make torch's primary context of ``device`` current on this thread.

    torch creates the primary context lazily; a tiny allocation forces it. Should the context
    still not be current (some torch versions defer), the primary context is retained and set
    explicitly, which is the same context torch uses.
    """
    import torch

    torch.cuda.init()
    torch.cuda.set_device(device)
    torch.cuda.current_device()
    torch.empty(1, device=f"cuda:{device}")
    call("cuInit", 0)
    ctx = call("cuCtxGetCurrent")
    if ctx is None or int(ctx) == 0:
        dev = call("cuDeviceGet", device)
        ctx = call("cuDevicePrimaryCtxRetain", dev)
        call("cuCtxSetCurrent", ctx)
        log.debug("primary context of device %d set current explicitly", device)


def context_healthy(stream_handle: int | None = None) -> bool:
    """Probe whether the current context still works after an error.

    A sticky error (trap, illegal address) makes every later call fail; a plain launch error
    (bad launch configuration) does not. Synchronising the context and running a tiny torch
    op tells the two apart.
    """
    try:
        cu = driver()
        (err,) = cu.cuCtxSynchronize()
        if int(err) != 0:
            log.warning("context unhealthy: cuCtxSynchronize -> %s", _error_name(cu, err))
            return False
        import torch

        t = torch.ones(4, device="cuda")
        ok = float((t + 1).sum().item()) == 8.0
        torch.cuda.synchronize()
        return ok
    except Exception as exc:
        log.warning("context unhealthy: %s", exc)
        return False


def synchronize(stream_handle: int) -> None:
    """Wait for ``stream_handle``; a kernel fault surfaces as :class:`CudaError` by name."""
    cu = driver()
    check("cuStreamSynchronize", cu.cuStreamSynchronize(cu.CUstream(stream_handle)))


class BoundLaunch:
    """One prepared ``cuLaunchKernel`` call; calling it launches asynchronously.

    Holds the :class:`FaParams`, the family's extra arguments (ctypes values, e.g. TMA
    descriptors) and the ``void*`` array pointing at them in kernel-parameter order (the
    params first), so all of them stay alive as long as the launcher does. Without extra
    arguments the array has the one entry of the ``fa2`` ABI.
    """

    __slots__ = (
        "_args",
        "_args_addr",
        "_cu",
        "_fn",
        "_geometry",
        "_stream",
        "extra",
        "params",
        "symbol",
    )

    def __init__(
        self,
        cu: Any,
        fn: Any,
        symbol: str,
        params: FaParams,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        smem: int,
        stream_handle: int,
        extra: Sequence[Any] = (),
    ) -> None:
        self._cu = cu
        self._fn = fn
        self.symbol = symbol
        self.params = params
        self.extra = tuple(extra)
        addresses = [ctypes.addressof(params), *(ctypes.addressof(x) for x in self.extra)]
        self._args = (ctypes.c_void_p * len(addresses))(*addresses)
        self._args_addr = ctypes.addressof(self._args)
        self._stream = cu.CUstream(stream_handle)
        self._geometry = (*(int(x) for x in grid), *(int(x) for x in block), int(smem))

    def __call__(self) -> None:
        """Launch once.

        Raises:
            CudaError: when the driver refuses the launch.
        """
        cu = self._cu
        (err,) = cu.cuLaunchKernel(self._fn, *self._geometry, self._stream, self._args_addr, 0)
        if int(err) != 0:
            raise CudaError("cuLaunchKernel", int(err), _error_name(cu, err), self.symbol)


#: Most blocks a launch grid may have in y and in z (x allows 2^31 - 1).
GRID_YZ_LIMIT = 65535


class ChainedLaunch:
    """Several bound launches called in order on one stream (a batch cut into slices)."""

    __slots__ = ("launches",)

    def __init__(self, launches: Sequence[BoundLaunch]) -> None:
        self.launches = tuple(launches)

    def __call__(self) -> None:
        for launch in self.launches:
            launch()


def _batch_slice(
    config: AnyConfig, q: torch.Tensor, k: torch.Tensor, layout: Layout, batch: int
) -> int:
    """The largest batch slice whose grid fits :data:`GRID_YZ_LIMIT` in y and z (``batch``
    itself when the whole grid fits).

    Raises:
        ValueError: when even one sequence's grid does not fit (heads past the limit).
    """
    seq_dim, head_dim = (1, 2) if layout == "bnhd" else (2, 1)
    nq, heads = int(q.shape[seq_dim]), int(q.shape[head_dim])
    nk, kv_heads = int(k.shape[seq_dim]), int(k.shape[head_dim])

    def fits(b: int) -> bool:
        grid, _ = launch_geometry(config, nq, heads, b, nk=nk, kv_heads=kv_heads)
        return grid[1] <= GRID_YZ_LIMIT and grid[2] <= GRID_YZ_LIMIT

    if fits(batch):
        return batch
    if not fits(1):
        raise ValueError(
            f"{config.name}: {heads} heads need a launch grid past {GRID_YZ_LIMIT} blocks "
            "in y or z even for one sequence"
        )
    step = min(batch, GRID_YZ_LIMIT)
    while not fits(step):  # grids grow with the batch in y or z: halve until it fits
        step //= 2
    return step


class LoadedKernel:
    """One kernel of a cubin, loaded into the current context.

    Attributes:
        symbol: the kernel's extern "C" name.
        smem_bytes: dynamic shared memory it is launched with (attribute raised to this).
        num_regs: registers per thread the driver reports (``CU_FUNC_ATTRIBUTE_NUM_REGS``).
        local_bytes: local memory per thread (``CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES``), i.e.
            spills and stack.
        max_threads: most threads per block this kernel can be launched with.
        static_smem: static shared memory of the kernel.
    """

    def __init__(self, image: bytes, symbol: str, smem_bytes: int = 0, *, source: str = "") -> None:
        """Load ``image`` (cubin bytes) and look up ``symbol``.

        Raises:
            CudaError: when loading, the lookup or setting the shared-memory limit fails
                (e.g. ``CUDA_ERROR_NO_BINARY_FOR_GPU``, ``CUDA_ERROR_NOT_FOUND``,
                ``CUDA_ERROR_INVALID_VALUE`` for more shared memory than the device has).
        """
        cu = driver()
        self.symbol = symbol
        self.smem_bytes = int(smem_bytes)
        self.source = source
        self._cu = cu
        # The driver copies the image; a ctypes buffer's address is accepted by every
        # cuda-python version (bytes objects only by some).
        buf = ctypes.create_string_buffer(bytes(image), len(image))
        self._module: Any = call("cuModuleLoadData", ctypes.addressof(buf))
        try:
            self._function: Any = call("cuModuleGetFunction", self._module, symbol.encode())
            attr = cu.CUfunction_attribute
            if self.smem_bytes > 0:
                call(
                    "cuFuncSetAttribute",
                    self._function,
                    attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    self.smem_bytes,
                )
            self.num_regs = int(
                call("cuFuncGetAttribute", attr.CU_FUNC_ATTRIBUTE_NUM_REGS, self._function)
            )
            self.local_bytes = int(
                call("cuFuncGetAttribute", attr.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, self._function)
            )
            self.max_threads = int(
                call(
                    "cuFuncGetAttribute",
                    attr.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                    self._function,
                )
            )
            self.static_smem = int(
                call(
                    "cuFuncGetAttribute",
                    attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                    self._function,
                )
            )
        except BaseException:
            self.unload()
            raise

    @classmethod
    def from_file(cls, path: str | Path, symbol: str, smem_bytes: int = 0) -> LoadedKernel:
        """Load kernel ``symbol`` from the cubin at ``path``."""
        p = Path(path)
        return cls(p.read_bytes(), symbol, smem_bytes, source=str(p))

    @classmethod
    def for_config(
        cls, config: AnyConfig, cubin: str | Path, symbol: str | None = None
    ) -> LoadedKernel:
        """Load ``config``'s kernel (symbol ``config.name`` unless ``symbol`` is given), its
        dynamic shared memory limit raised to ``config.smem_bytes``."""
        return cls.from_file(cubin, symbol or config.name, config.smem_bytes)

    def launch(
        self,
        params: FaParams,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        smem: int,
        stream_handle: int,
        extra: Sequence[Any] = (),
    ) -> None:
        """Launch once (asynchronously) on the stream with handle ``stream_handle``.

        Raises:
            CudaError: when the launch is refused (bad geometry, too much shared memory, or a
                sticky error from earlier work).
        """
        self.bind(params, grid, block, smem, stream_handle, extra)()

    def bind(
        self,
        params: FaParams,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        smem: int,
        stream_handle: int,
        extra: Sequence[Any] = (),
    ) -> BoundLaunch:
        """A zero-argument launcher with everything prepared, for timing loops.

        ``extra`` are the kernel's arguments after ``params`` (ctypes values, see
        :func:`extra_args`). The driver copies the arguments at each launch, so later edits to
        ``params`` apply to later launches.
        """
        if self._module is None:
            raise RuntimeError(f"kernel {self.symbol} was unloaded")
        return BoundLaunch(
            self._cu, self._function, self.symbol, params, grid, block, smem, stream_handle, extra
        )

    def bind_config(
        self,
        config: AnyConfig,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        o: torch.Tensor,
        lse: torch.Tensor | None,
        scale: float,
        layout: Layout,
        stream_handle: int,
        packed: PackedSeqs | None = None,
        *,
        variant: Variant | None = None,
        sinks: torch.Tensor | None = None,
    ) -> BoundLaunch | ChainedLaunch:
        """Everything one launch of ``config``'s kernel on these tensors needs, bound.

        :func:`make_params`, the family's extra arguments (:func:`extra_args`), its grid and
        block (:func:`launch_geometry`) and ``config.smem_bytes`` of dynamic shared memory.
        When the grid's y or z would pass :data:`GRID_YZ_LIMIT` (the split-Q families put the
        batch in z), the batch is cut into slices that fit and each slice is bound on its own:
        the result launches them in order (batch 70,000 runs; without this the driver refuses).

        With ``packed`` (a ``_vl`` config; q ``[total_q, Hq, D]``, k and v
        ``[total_k, Hkv, D]``, lse ``[Hq, total_q]``, ``layout`` unused): the arguments of
        :func:`~measure.params.packed_params`, then :func:`packed_extra_args`; more sequences
        than the grid's z allows run as launches over slices of the offsets.

        ``variant`` (plain when ``None``) and ``sinks`` (its ``[q_heads]`` float32 logits on
        the device, with ``variant.sinks``): a config built with a variant switch gets the
        :class:`~measure.params.FaVariant` last (normalised with the call's lengths; a packed
        batch's only where no length matters, its sequences having their own).

        Raises:
            ValueError: on tensors the ABI does not take (see :func:`make_params` and the
                family's ``host_prep``), or heads alone past the grid limit; ``packed`` with
                a config that is not a varlen one; a config whose variant switches do not fit
                ``variant``, or sinks that do not fit it
                (:func:`~measure.launch_args.variant_args`).
            CudaError: when the family's preparation fails in the driver.
        """
        if packed is not None:
            heads = int(q.shape[1]) if q.dim() == 3 else None
            tail = variant_args(config, variant, sinks, nq=None, nk=None, q_heads=heads)
            return self._bind_packed(config, q, k, v, o, lse, scale, packed, stream_handle, tail)
        seq_dim, head_dim = (1, 2) if layout == "bnhd" else (2, 1)
        four = q.dim() == 4 and k.dim() == 4  # else make_params refuses them below
        tail = variant_args(
            config, variant, sinks, nq=int(q.shape[seq_dim]) if four else None,
            nk=int(k.shape[seq_dim]) if four else None,
            q_heads=int(q.shape[head_dim]) if four else None,
        )  # fmt: skip
        batch = int(q.shape[0])
        step = _batch_slice(config, q, k, layout, batch)
        if step >= batch:
            return self._bind_slice(config, q, k, v, o, lse, scale, layout, stream_handle, tail)
        slices = []
        for b in range(0, batch, step):
            part = slice(b, b + step)
            part_lse = None if lse is None else lse[part]
            bound = self._bind_slice(
                config, q[part], k[part], v[part], o[part], part_lse, scale, layout,
                stream_handle, tail,
            )  # fmt: skip
            slices.append(bound)
        return ChainedLaunch(slices)

    def _bind_slice(
        self,
        config: AnyConfig,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        o: torch.Tensor,
        lse: torch.Tensor | None,
        scale: float,
        layout: Layout,
        stream_handle: int,
        tail: tuple[Any, ...] = (),
    ) -> BoundLaunch:
        params = make_params(q, k, v, o, lse, scale, layout)
        extra = (*extra_args(config, q, k, v, layout), *tail)
        grid, block = launch_geometry(
            config, params.nq, params.q_heads, params.batch, nk=params.nk,
            kv_heads=params.kv_heads,
        )  # fmt: skip
        return self.bind(params, grid, block, config.smem_bytes, stream_handle, extra)

    def _bind_packed(
        self,
        config: AnyConfig,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        o: torch.Tensor,
        lse: torch.Tensor | None,
        scale: float,
        packed: PackedSeqs,
        stream_handle: int,
        tail: tuple[Any, ...] = (),
    ) -> BoundLaunch | ChainedLaunch:
        if not getattr(config, "varlen", False):
            raise ValueError(
                f"{config.name} is not a varlen config (the _vl kernels take cu_seqlens)"
            )
        params, _ = packed_params(q, k, v, o, lse, scale, packed)
        extra = packed_extra_args(config, q, k, v)
        launches = []
        for b0 in range(0, packed.count, GRID_YZ_LIMIT):
            part = packed.part(b0, min(GRID_YZ_LIMIT, packed.count - b0))
            args = FaParams.from_buffer_copy(params)
            args.batch = part.count
            varlen = FaVarlen(part.cu_seqlens_q, part.cu_seqlens_k, int(q.shape[0]), 0)
            grid, block = launch_geometry(config, args.nq, args.q_heads, part.count, nk=args.nk,
                                          kv_heads=args.kv_heads)  # fmt: skip
            extra_all = (varlen, *extra, *tail)
            launches.append(
                self.bind(args, grid, block, config.smem_bytes, stream_handle, extra_all)
            )
        return launches[0] if len(launches) == 1 else ChainedLaunch(launches)

    def unload(self) -> None:
        """Unload the module (idempotent); errors are logged, not raised."""
        module, self._module = getattr(self, "_module", None), None
        if module is None:
            return
        try:
            (err,) = self._cu.cuModuleUnload(module)
            if int(err) != 0:
                log.debug("cuModuleUnload(%s): %s", self.symbol, _error_name(self._cu, err))
        except Exception as exc:  # the context may be gone already
            log.debug("cuModuleUnload(%s): %s", self.symbol, exc)


__all__ = [
    "GRID_YZ_LIMIT",
    "BoundLaunch",
    "ChainedLaunch",
    "CudaError",
    "HostPrep",
    "LoadedKernel",
    "call",
    "check",
    "context_healthy",
    "driver",
    "ensure_context",
    "extra_args",
    "grid_for",
    "host_prep",
    "launch_geometry",
    "packed_extra_args",
    "synchronize",
]
