"""``torch.ops.fa2tune.attention_varlen``: packed variable-length batches (FA2's varlen ABI).

``q`` ``[total_q, Hq, D]``, ``k``/``v`` ``[total_k, Hkv, D]``, ``cu_seqlens_q``/``_k`` int32
``[num_seqs + 1]`` on q's device and the longest lengths as Python ints, as
``flash_attn_varlen_func`` takes them; causal is bottom-right aligned per sequence. The output
is a fresh contiguous ``[total_q, Hq, D]``; the LSE ``[Hq, total_q]`` float32, or an empty
float32 tensor when not asked for.

The fast path never reads the offsets on the host. A call's decision is cached under
:func:`~fa2tune.ops.varlen_choice.decision_key` (device, dtype, D, heads, effective mask,
number of sequences, mean length bucket); the first call of a key chooses the config
(:func:`~fa2tune.ops.varlen_choice.select_varlen`), builds and loads it; every call then
checks its arguments (shapes, dtypes and devices only), allocates O (and the LSE) and
launches a :class:`VarlenLauncher` on torch's current stream with the grid from
``max_seqlen_q`` and ``num_seqs``.

Calls the kernels cannot serve (a dtype or head dim, CPU tensors, no build for the GPU,
gradients recorded, strides or alignment the ABI does not take) run on
:func:`varlen_fallback` with a :class:`~fa2tune.ops.choice.FallbackWarning` once per reason,
or raise :class:`~fa2tune.ops.choice.Unsupported` with ``fallback=False``. Bad arguments raise
ValueError either way.

Imports torch (and registers the op) at import: :mod:`fa2tune.torch` imports it.
"""

from __future__ import annotations

import logging
import math
import operator
import threading
import warnings
from typing import Any

import torch

from core.family import AnyConfig
from core.settings import get_settings
from fa2tune.ops.choice import DTYPE_NAMES, FallbackWarning, Unsupported
from fa2tune.ops.kernels import current_stream, device_info, load_kernel
from fa2tune.ops.torch_op import _current_device, _show_choice, no_lse, sdpa_fallback
from fa2tune.ops.varlen_choice import (
    VarlenCall,
    check_varlen_shapes,
    choose_varlen_config,
    decision_key,
    effective_varlen_causal,
    mean_bucket,
    select_varlen,
    varlen_reason,
)
from measure.loader import GRID_YZ_LIMIT, BoundLaunch, LoadedKernel, launch_geometry
from measure.params import ALIGN_BYTES, FaParams, FaVarlen, make_params

log = logging.getLogger("fa2tune.torch")

#: decision_key(...) -> a launcher, or why the key falls back.
_decisions: dict[tuple[object, ...], VarlenLauncher | str] = {}
_decide_lock = threading.Lock()
_warned: set[str] = set()


#: Bound launches kept per stride pattern: fa2 by (stream, grid x), fa3 (whose TMA
#: descriptors hold the pointers and the packed row counts) by pointers, rows, stream, grid x.
_BOUND_CACHE = 64


def lse_shape(q: torch.Tensor) -> tuple[int, int]:
    """``[Hq, total_q]``: the packed LSE's shape (the op's real and fake implementations)."""
    return (q.shape[1], q.shape[0])


def check_varlen_args(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
) -> None:
    """Refuse calls no implementation takes (metadata only: never reads device memory).

    Raises:
        ValueError: see :func:`~fa2tune.ops.varlen_choice.check_varlen_shapes`; q, k and v of
            different dtypes or devices; offsets that are not int32 on q's device.
    """
    check_varlen_shapes(
        tuple(q.shape), tuple(k.shape), tuple(v.shape), tuple(cu_seqlens_q.shape),
        tuple(cu_seqlens_k.shape), max_seqlen_q, max_seqlen_k,
    )  # fmt: skip
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if cu.dtype != torch.int32:
            raise ValueError(f"{name} must be int32, got {cu.dtype}")
        if cu.device != q.device:
            raise ValueError(f"{name} is on {cu.device}, q on {q.device}: same device needed")


def _max_len(name: str, value: Any) -> int:
    """A max length as a Python int (a tensor would need a device sync: refused)."""
    if isinstance(value, (torch.Tensor, bool)):
        raise ValueError(f"{name} must be a Python int, got {type(value).__name__}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be a Python int, got {type(value).__name__}") from None


class _Variant:
    """One stride pattern of a launcher: the checked kernel argument, the packed-batch
    argument (both patched per call) and bound launches that point at them."""

    __slots__ = ("bound", "params", "varlen")

    def __init__(self, params: FaParams) -> None:
        self.params = params
        self.varlen = FaVarlen(None, None, 0, 0)
        self.bound: dict[tuple[int, ...], BoundLaunch] = {}


class VarlenLauncher:
    """One varlen decision: a loaded ``_vl`` kernel, its config, and its launches.

    Per stride pattern of (q, k, v) (and whether each has 0, 1 or more rows),
    :func:`measure.params.make_params`'s checks run once and the packed :class:`FaParams`
    with batch strides 0 is kept, as :func:`measure.varlen.varlen_params` makes it. A call
    patches pointers, longest lengths, the number of sequences and the scale into it and
    into one :class:`FaVarlen`, and calls a bound launch (fa2: per stream and grid; fa3: per
    pointers, packed rows, stream and grid, holding the TMA descriptors of
    :func:`measure.tma.fa3_varlen_tensor_maps`), the last :data:`_BOUND_CACHE` kept. More
    sequences than the grid's z allows run as launches over slices of the offsets, as
    :func:`measure.varlen.bind_varlen` does.

    Attributes:
        kernel, config, source: what serves the decision and where the choice came from.
    """

    __slots__ = ("_block", "_fa3", "_heads", "_kv_heads", "_lock", "_smem", "_variants",
                 "config", "kernel", "source")  # fmt: skip

    def __init__(
        self, kernel: LoadedKernel, config: AnyConfig, source: str, heads: int, kv_heads: int
    ) -> None:
        self.kernel = kernel
        self.config = config
        self.source = source
        self._heads = heads
        self._kv_heads = kv_heads
        self._fa3 = config.family == "fa3"
        self._block = launch_geometry(config, 1, heads, 1, nk=1, kv_heads=kv_heads)[1]
        self._smem = config.smem_bytes
        self._lock = threading.Lock()
        self._variants: dict[tuple[object, ...], _Variant] = {}

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
        cu_q: torch.Tensor,
        cu_k: torch.Tensor,
        max_seqlen_q: int,
        max_seqlen_k: int,
        scale: float,
    ) -> None:
        """Launch once into ``o`` (and ``lse``), on the current stream of q's device.

        Raises:
            ValueError: tensors the ABI does not take (strides, alignment, empty k): the
                caller falls back or re-raises.
            CudaError: the driver refused the launch.
        """
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
            if count > GRID_YZ_LIMIT:  # rare: launches over slices of the offsets
                if self._fa3:
                    maps = self._maps(q, k, v)
                for b0 in range(0, count, GRID_YZ_LIMIT):
                    n = min(GRID_YZ_LIMIT, count - b0)
                    part = FaParams.from_buffer_copy(p)
                    part.batch = n
                    part_vl = FaVarlen(cqp + 4 * b0, ckp + 4 * b0, total_q, 0)
                    grid = self._grid(max_seqlen_q, max_seqlen_k, n)
                    self.kernel.bind(part, grid, self._block, self._smem, stream,
                                     (part_vl, *maps))()  # fmt: skip
                return
            p.batch = count
            grid = self._grid(max_seqlen_q, max_seqlen_k, count)
            key = (qp, kp, vp, total_q, total_k, stream, grid[0]) if self._fa3 else (
                stream, grid[0])  # fmt: skip
            bound = variant.bound.get(key)
            if bound is None:
                if self._fa3:
                    maps = self._maps(q, k, v)  # may raise ValueError
                bound = self.kernel.bind(p, grid, self._block, self._smem, stream, (vl, *maps))
                if len(variant.bound) >= _BOUND_CACHE:
                    del variant.bound[next(iter(variant.bound))]
                variant.bound[key] = bound
            bound()

    def _maps(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[Any, ...]:
        from measure.tma import fa3_varlen_tensor_maps

        return fa3_varlen_tensor_maps(self.config, q, k, v)

    def _variant(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        o: torch.Tensor,
        pattern: tuple[object, ...],
    ) -> _Variant:
        """make_params's checks on the packed tensors seen as one batch of ``total`` rows (as
        :func:`measure.varlen.varlen_params`); the checked argument is kept for the pattern."""
        params = make_params(
            q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), o.unsqueeze(0), None, 1.0, "bnhd"
        )  # fmt: skip  (raises ValueError on bad input)
        for name in ("q", "k", "v", "o"):
            setattr(params, f"{name}_batch_stride", 0)
        with self._lock:
            variant = self._variants.get(pattern)
            if variant is None:
                variant = _Variant(params)
                if len(self._variants) < 16:  # a few patterns per decision; odd ones stay slow
                    self._variants[pattern] = variant
        return variant


def _warn_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(
            f"fa2tune.torch: attention_varlen running on torch instead of a tuned kernel: {reason}",
            FallbackWarning,
            stacklevel=4,
        )


def _decide(
    q: torch.Tensor, k: torch.Tensor, causal: bool, count: int, mean: int
) -> VarlenLauncher | str:
    """The launcher for this call's key, or the reason it falls back (first call of a key).

    ``causal`` is the effective mask, ``mean`` the bucketed mean length (the key's)."""
    d = int(q.shape[-1])
    reason = varlen_reason(
        device_type=q.device.type, dtype=str(q.dtype).removeprefix("torch."), d=d
    )
    if reason is not None:
        return reason
    heads, kv_heads = int(q.shape[1]), int(k.shape[1])
    device = device_info(q.device.index if q.device.index is not None else 0)
    call = VarlenCall(
        device=device.index, gpu=device.name, sm_count=device.sm_count,
        compute_capability=device.compute_capability,
        dtype=DTYPE_NAMES[str(q.dtype).removeprefix("torch.")], causal=causal, d=d,
        heads=heads, kv_heads=kv_heads, count=count, mean=mean,
    )  # fmt: skip
    try:
        choice = select_varlen(call)
        try:
            kernel = load_kernel(choice.config, device)
        except Unsupported as first:
            if choice.source == "default":
                raise
            # A tuned config that does not build or load here: the default may still do.
            log.warning("fa2tune.torch: %s; trying the default varlen config", first.reason)
            choice = choose_varlen_config(None, call)
            kernel = load_kernel(choice.config, device)
    except Unsupported as exc:
        return exc.reason
    if get_settings().print_choice:
        _show_choice(call.describe(choice))
    return VarlenLauncher(kernel, choice.config, choice.source, heads, kv_heads)


def _aten_flash_applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether torch's own varlen kernel (``aten._flash_attention_forward``) can take the
    call: present in this torch, fp16/bf16 CUDA tensors with a contiguous head dim that is a
    multiple of 8 up to 256, an sm_80+ GPU, no gradients recorded."""
    if not hasattr(torch.ops.aten, "_flash_attention_forward"):
        return False
    if q.device.type != "cuda" or q.dtype not in (torch.float16, torch.bfloat16):
        return False
    d = int(q.shape[-1])
    if d % 8 or d > 256 or any(t.stride(-1) != 1 for t in (q, k, v)):
        return False
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return False
    available = getattr(torch.backends.cuda, "is_flash_attention_available", None)
    if available is not None and not available():
        return False
    return tuple(torch.cuda.get_device_capability(q.device)) >= (8, 0)


def _aligned_rows(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a dense copy when a row or head stride is not a multiple of 8 elements or the
    pointer is not 16-byte aligned."""
    if t.data_ptr() % ALIGN_BYTES or any(s % 8 for s in t.stride()[:-1]):
        return t.clone(memory_format=torch.contiguous_format)
    return t


def _per_sequence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    causal: bool,
    scale: float,
    return_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The op's semantics one sequence at a time on :func:`fa2tune.ops.torch_op.sdpa_fallback`
    (SDPA, or float32 math for the LSE and rows that see no key). Reads the offsets on the
    host (a sync). Rows no sequence covers get O = 0 and LSE = -inf.

    Raises:
        ValueError: offsets that do not start at 0, decrease or pass the packed tensors' rows.
    """
    total_q, total_k = int(q.shape[0]), int(k.shape[0])
    bq = [int(x) for x in cu_q.tolist()]
    bk = [int(x) for x in cu_k.tolist()]
    for name, bounds, total in (("cu_seqlens_q", bq, total_q), ("cu_seqlens_k", bk, total_k)):
        if bounds[0] != 0 or any(b > a for a, b in zip(bounds[1:], bounds, strict=False)):
            raise ValueError(f"{name} must start at 0 and not decrease, got {bounds[:8]}...")
        if bounds[-1] > total:
            raise ValueError(f"{name} ends at {bounds[-1]}, past the {total} packed rows")
    heads = int(q.shape[1])
    o = q.new_zeros(q.shape)
    lse = q.new_full((heads, total_q), float("-inf"), dtype=torch.float32) if return_lse else None
    for i in range(len(bq) - 1):
        s, e, ks, ke = bq[i], bq[i + 1], bk[i], bk[i + 1]
        if e == s or ke == ks:  # no queries, or no keys: O = 0, LSE = -inf (as allocated)
            continue
        o_i, lse_i = sdpa_fallback(q[s:e].unsqueeze(0), k[ks:ke].unsqueeze(0),
                                   v[ks:ke].unsqueeze(0), causal, scale, "bnhd",
                                   return_lse)  # fmt: skip
        o[s:e] = o_i[0]
        if lse is not None:
            lse[:, s:e] = lse_i[0]
    return o, lse


def varlen_fallback(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool,
    scale: float,
    return_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The op's semantics on torch alone: ``aten._flash_attention_forward`` (torch's
    FlashAttention-2 varlen kernel, bottom-right causal as the kernels here) when it applies
    and no LSE is asked for (its LSE layout differs between torch versions), else
    :func:`_per_sequence` (reads the offsets on the host)."""
    if not return_lse and _aten_flash_applies(q, k, v):
        # Its vector loads assume 16-byte aligned rows: a dense copy of other tensors.
        qa, ka, va = (_aligned_rows(t) for t in (q, k, v))
        cq = cu_q if cu_q.is_contiguous() else cu_q.contiguous()
        ck = cu_k if cu_k.is_contiguous() else cu_k.contiguous()
        try:
            out = torch.ops.aten._flash_attention_forward(
                qa, ka, va, cq, ck, max_seqlen_q, max_seqlen_k, 0.0, causal, False,
                scale=scale,
            )  # fmt: skip
            return out[0].contiguous(), None
        except (RuntimeError, TypeError, ValueError, NotImplementedError) as exc:
            log.debug("aten._flash_attention_forward refused the call (%s): per sequence", exc)
    return _per_sequence(q, k, v, cu_q, cu_k, causal, scale, return_lse)


def run_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool,
    scale: float,
    return_lse: bool,
    fallback: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(o, lse)``, ``lse`` None when not asked for: the eager path and the op's body.

    Raises:
        ValueError: bad arguments (:func:`check_varlen_args`).
        Unsupported: the call cannot be served and ``fallback`` is False.
        CudaError: the driver refused the launch.
    """
    max_q = _max_len("max_seqlen_q", max_seqlen_q)
    max_k = _max_len("max_seqlen_k", max_seqlen_k)
    check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k)
    total_q = int(q.shape[0])
    count = int(cu_seqlens_q.shape[0]) - 1
    if total_q == 0:  # nothing to compute (and a grid of no blocks is not launchable)
        lse0 = q.new_empty(lse_shape(q), dtype=torch.float32) if return_lse else None
        return q.new_empty(q.shape), lse0
    key = decision_key(q.device, q.dtype, int(q.shape[2]), int(q.shape[1]), int(k.shape[1]),
                       causal, count, total_q, max_q)  # fmt: skip
    entry = _decisions.get(key)
    if entry is None:
        with _decide_lock:
            entry = _decisions.get(key)
            if entry is None:
                entry = _decide(q, k, effective_varlen_causal(causal, max_q), count,
                                mean_bucket(total_q, count))  # fmt: skip
                _decisions[key] = entry
    if (
        not isinstance(entry, str)
        and torch.is_grad_enabled()
        and (q.requires_grad or k.requires_grad or v.requires_grad)
    ):
        entry = "gradients are recorded (the kernels are forward-only)"
    if isinstance(entry, str):
        if not fallback:
            raise Unsupported(entry)
        _warn_once(entry)
        return varlen_fallback(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, causal,
                               scale, return_lse)  # fmt: skip
    o = q.new_empty(q.shape)  # contiguous, q's dtype and device
    lse = q.new_empty(lse_shape(q), dtype=torch.float32) if return_lse else None
    args = (q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_q, max_k, scale)
    try:
        if q.device.index == _current_device():
            entry(*args)
        else:  # the kernel lives in that device's context: make it current for the launch
            with torch.cuda.device(q.device):
                entry(*args)
    except ValueError as exc:  # strides, alignment or empty k this call's tensors have
        if not fallback:
            raise Unsupported(str(exc)) from exc
        _warn_once(f"tensor layout the kernels do not take ({exc})")
        return varlen_fallback(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, causal,
                               scale, return_lse)  # fmt: skip
    return o, lse


# Without torch installed (mypy on a CPU machine) the decorators are untyped.
@torch.library.custom_op(  # type: ignore[untyped-decorator,unused-ignore]
    "fa2tune::attention_varlen", mutates_args=()
)
def attention_varlen_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool,
    scale: float,
    return_lse: bool,
    fallback: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.ops.fa2tune.attention_varlen``: ``(o, lse)``, ``lse`` empty when not asked for
    (see :func:`run_varlen`)."""
    o, lse = run_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                        causal, scale, return_lse, fallback)  # fmt: skip
    return o, (lse if lse is not None else no_lse(q))


@attention_varlen_op.register_fake  # type: ignore[untyped-decorator,unused-ignore]
def _attention_varlen_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool,
    scale: float,
    return_lse: bool,
    fallback: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    if q.dim() != 3:
        raise ValueError(f"q must be 3-d packed [total, heads, D], got {q.dim()} dims")
    lse = q.new_empty(lse_shape(q), dtype=torch.float32) if return_lse else no_lse(q)
    return q.new_empty(q.shape), lse


def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
    fallback: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention forward over a packed batch of variable-length sequences, on the varlen
    config tuned nearest this batch for this GPU (see docs/torch.md).

    Args:
        q: ``[total_q, Hq, D]``; k, v: ``[total_k, Hkv, D]`` (``Hq % Hkv == 0``), fp16 or
            bf16 on a CUDA device for the kernels (anything else falls back).
        cu_seqlens_q, cu_seqlens_k: int32 ``[num_seqs + 1]`` cumulative offsets on q's device
            (sequence ``i``'s rows are ``[cu[i], cu[i + 1])``); not read on the host.
        max_seqlen_q, max_seqlen_k: the longest query and key lengths, Python ints (the grid
            covers ``max_seqlen_q`` rows per sequence: a smaller value leaves rows unwritten).
        causal: bottom-right aligned per sequence (query ``i`` sees key ``j`` iff
            ``j <= i + nk - nq``; a row that sees no key gives O = 0, LSE = -inf).
        scale: softmax scale, ``1 / sqrt(D)`` by default.
        return_lse: also return the float32 LSE ``[Hq, total_q]``.
        fallback: run what the kernels cannot serve on torch (warning once per reason);
            False raises :class:`~fa2tune.ops.choice.Unsupported` instead.

    Returns:
        ``o`` ``[total_q, Hq, D]`` (fresh, contiguous), or ``(o, lse)``.

    Raises:
        ValueError: bad arguments (shapes, offsets' dtype, device or length, heads).
        Unsupported: with ``fallback=False``, a call the kernels cannot serve.
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if torch.compiler.is_compiling() or type(q) is not torch.Tensor:
        # Traced (torch.compile) or a tensor subclass (FakeTensor): through the dispatcher.
        o, lse = torch.ops.fa2tune.attention_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
            return_lse, fallback,
        )  # fmt: skip
        return (o, lse) if return_lse else o
    # Eager: the dispatcher's custom-op machinery costs more than the launch itself.
    o, lse_or_none = run_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, float(scale),
        return_lse, fallback,
    )  # fmt: skip
    if not return_lse:
        return o
    return o, (lse_or_none if lse_or_none is not None else no_lse(q))


def clear_caches() -> None:
    """Forget every varlen decision and warning (tests; kernels stay loaded)."""
    with _decide_lock:
        _decisions.clear()
        _warned.clear()


__all__ = [
    "VarlenLauncher",
    "attention_varlen",
    "attention_varlen_op",
    "check_varlen_args",
    "clear_caches",
    "effective_varlen_causal",
    "mean_bucket",
    "run_varlen",
    "varlen_fallback",
]
