"""``torch.ops.fa2tune.attention`` and ``attention_varlen``: the op, its fake implementations
and the fallback, one call path for dense calls and packed variable-length batches.

The op's real implementation (:func:`run`) looks the call up in a dict of decisions; the
first call of a key decides (config choice, build, load: :func:`_decide`) and every later call
only checks what it must, allocates the output and launches. No store query, logging or
warning runs on that path. The mode is an argument of the one path: a dense call
(``q`` ``[B, Nq, Hq, D]`` or ``[B, Hq, Nq, D]``) is keyed by (device, dtype, Q and K shapes,
mask, layout); a packed batch (``seqs``: ``cu_seqlens`` and the longest lengths, as
``flash_attn_varlen_func`` takes them; ``q`` ``[total_q, Hq, D]``, causal bottom-right aligned
per sequence) by :func:`~fa2tune.ops.choice.decision_key`, its arguments checked on every
call (shapes, dtypes and devices only: the offsets are never read on the host) and its grid
worked out per call from ``max_seqlen_q`` and the number of sequences. Calls the kernels
cannot serve run on torch (:mod:`fa2tune.ops.fallback`) with a warning once per reason, or
raise :class:`~fa2tune.ops.choice.Unsupported` with ``fallback=False``; bad arguments raise
ValueError either way.

Attention variants (``window_size``, ``attention_chunk``, ``softcap``, ``sinks``; semantics
in :mod:`core.variant`) are arguments of both entries and of both ops. A call's variant is
normalised (:func:`~fa2tune.ops.choice.normalize_call`, cached) and, when it is not plain,
is part of the call's decision key (a plain one leaves the key as it always was, and a
call with only default variant arguments normalises nothing); the decision is a config
built with the variant's switches, or a fallback that computes the variant on torch
(:mod:`fa2tune.ops.fallback`): a variant is never dropped. Sinks are a ``[Hq]`` tensor on
q's device, float32 (bf16 or fp16 are converted to float32 once per call).

The two entries are registered with :func:`torch.library.custom_op` and fake
implementations, so ``torch.compile(fullgraph=True)`` traces each as one node, and FakeTensor /
meta tensors get the outputs' shapes and dtypes without a GPU. The output is always a fresh
contiguous tensor of Q's shape; the LSE is ``[B, Hq, Nq]`` (packed: ``[Hq, total_q]``) float32,
or an empty float32 tensor when not asked for.

Imports torch (and registers the ops) at import: :mod:`fa2tune.torch` imports it.
"""

from __future__ import annotations

import logging
import math
import operator
import sys
import threading
import warnings
from dataclasses import replace
from typing import Any

import torch

from core.lookup import Packed
from core.settings import get_settings
from core.shape import Shape, effective_causal
from core.variant import PLAIN, Variant
from fa2tune.ops import autotune
from fa2tune.ops.choice import (
    DTYPE_NAMES,
    Call,
    FallbackWarning,
    Unsupported,
    call_reason,
    check_varlen_shapes,
    decision_key,
    default_choice,
    effective_varlen_causal,
    forget_results,
    mean_bucket,
    normalize_call,
)
from fa2tune.ops.fallback import no_lse, sdpa_fallback, varlen_fallback
from fa2tune.ops.kernels import (
    CuSeqlens,
    Launcher,
    PackedLauncher,
    device_info,
    load_kernel,
    make_launcher,
)
from fa2tune.ops.selection import job_tag, reset_service_state, select
from measure.loader import CudaError
from measure.params import LAYOUTS, Layout

log = logging.getLogger("fa2tune.torch")

#: A dense call's (device, dtype, q shape, k shape, causal, layout), or a packed call's
#: decision_key(...) -> a launcher, or why the key falls back. At most MAX_DECISIONS, the
#: oldest forgotten first (a decode loop over growing lengths makes a key per length; its
#: group's candidates stay read, so a forgotten key costs a match in memory, not a lookup).
_decisions: dict[tuple[object, ...], Launcher | PackedLauncher | str] = {}
MAX_DECISIONS = 4096
_decide_lock = threading.Lock()
_warned: set[str] = set()

_FALLBACK = "fa2tune.torch: running on SDPA instead of a tuned kernel: "
_PACKED_FALLBACK = "fa2tune.torch: attention_varlen running on torch instead of a tuned kernel: "


def _dims(t: torch.Tensor, layout: Layout) -> tuple[int, int, int, int]:
    """(batch, rows, heads, head dim) of a 4-d tensor in ``layout``."""
    b, x, y, d = (int(s) for s in t.shape)
    return (b, x, y, d) if layout == "bnhd" else (b, y, x, d)


def lse_shape(q: torch.Tensor, layout: Layout, packed: bool = False) -> tuple[int, ...]:
    """The LSE's shape (the op's real and fake implementations): ``[B, Hq, Nq]``, or a packed
    batch's ``[Hq, total_q]``."""
    if packed:
        return (q.shape[1], q.shape[0])
    b, nq, h, _ = _dims(q, layout)
    return (b, h, nq)


# torch.cuda.current_device() without its Python wrapper (the device is initialised by then).
current_device_index = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)


def check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: str) -> None:
    """Refuse calls no attention implementation takes (a caller's error, never a fallback).

    Raises:
        ValueError: a bad layout, tensors not 4-d, K and V of different shapes, a batch or
            head dim that differs between Q and K, or Q heads not a multiple of KV heads.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-d, got {q.dim()}, {k.dim()}, {v.dim()} dims")
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k shape {tuple(k.shape)} != v shape {tuple(v.shape)}")
    lay: Layout = "bhnd" if layout == "bhnd" else "bnhd"
    b, _, h, d = _dims(q, lay)
    bk, _, hk, dk = _dims(k, lay)
    if b != bk or d != dk or hk < 1 or h % hk:
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} ({layout}) do not match: same batch "
            "and head dim, and q heads a multiple of kv heads"
        )


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
        ValueError: see :func:`~fa2tune.ops.choice.check_varlen_shapes`; q, k and v of
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


def window_pair(window_size: Any) -> tuple[int, int]:
    """``window_size`` as two Python ints ``(left, right)``.

    Raises:
        ValueError: not a pair of integers.
    """
    try:
        left, right = window_size
        return operator.index(left), operator.index(right)
    except (TypeError, ValueError):
        raise ValueError(
            f"window_size must be a pair of ints (left, right), -1 for no bound; got "
            f"{window_size!r}"
        ) from None


#: No window (FlashAttention's ``window_size`` default); the entries' default, told by identity.
NO_WINDOW: tuple[int, int] = (-1, -1)

_SINK_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_sinks(sinks: object, q: torch.Tensor, heads: int) -> torch.Tensor:
    """The sink logits as the kernels read them: a contiguous float32 ``[heads]`` tensor on
    q's device (bf16 and fp16 are converted here, once per call).

    Raises:
        ValueError: not a tensor, not 1-d of ``heads`` entries, another dtype, or on another
            device than q (the message names ``sinks`` and what is wrong).
    """
    if not isinstance(sinks, torch.Tensor):
        raise ValueError(f"sinks must be a tensor of {heads} float32 logits, got {type(sinks)}")
    if tuple(sinks.shape) != (heads,):
        raise ValueError(
            f"sinks must have shape [{heads}] (one logit per q head), got {tuple(sinks.shape)}"
        )
    if sinks.dtype not in _SINK_DTYPES:
        raise ValueError(f"sinks must be float32 (or bf16/fp16), got {sinks.dtype}")
    if sinks.device != q.device:
        raise ValueError(f"sinks is on {sinks.device}, q on {q.device}: same device needed")
    logits: torch.Tensor = sinks  # narrowed above (typed so without torch's stubs too)
    if logits.dtype != torch.float32:
        logits = logits.float()
    return logits if logits.is_contiguous() else logits.contiguous()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, FallbackWarning, stacklevel=4)


def _show_choice(line: str) -> None:
    """Log a choice where it will be seen: with no logging configured, INFO records would be
    dropped, so the logger gets a stderr handler of its own the first time."""
    if not logging.getLogger().hasHandlers() and not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    log.info("%s", line)


def _decide(
    q: torch.Tensor,
    k: torch.Tensor,
    causal: bool,
    layout: Layout,
    packed: Packed | None = None,
    variant: Variant = PLAIN,
) -> Launcher | PackedLauncher | str:
    """The launcher for this call's key, or the reason it falls back (first call of a key).

    ``packed``: a packed batch's count of sequences and bucketed mean length (the key's);
    ``causal`` is then the effective mask already. ``variant``: the call's, normalised."""
    d = int(q.shape[-1])
    torch_dtype = str(q.dtype).removeprefix("torch.")
    reason = call_reason(device_type=q.device.type, dtype=torch_dtype, d=d,
                         packed=packed is not None)  # fmt: skip
    if reason is not None:
        return reason
    if packed is None:
        b, nq, h, d = _dims(q, layout)
        _, nk, hk, _ = _dims(k, layout)
        causal = effective_causal(causal, nq)  # one causal row sees every key: served unmasked
        shape = Shape(nq, nk, b, h, hk)
    else:
        shape = packed.shape(int(q.shape[1]), int(k.shape[1]))
    device = device_info(q.device.index if q.device.index is not None else 0)
    call = Call(
        device=device.index, gpu=device.name, sm_count=device.sm_count,
        compute_capability=device.compute_capability, shape=shape,
        dtype=DTYPE_NAMES[torch_dtype], causal=causal, d=d, packed=packed, variant=variant,
    )  # fmt: skip
    try:
        selected = select(call)
        choice = selected.choice
        try:
            kernel = load_kernel(choice.config, device)
        except Unsupported as first:
            if choice.source == "default":
                raise
            # A tuned config that does not build or load here: the default may still do.
            what = "default varlen config" if packed is not None else "default config"
            log.warning("fa2tune.torch: %s; trying the %s", first.reason, what)
            choice = default_choice(call)
            kernel = load_kernel(choice.config, device)
    except Unsupported as exc:
        return exc.reason
    if get_settings().print_choice:
        _show_choice(call.describe(replace(selected, choice=choice).describe(call), layout))
    return make_launcher(kernel, choice, call)


def _forget_tuned(job: autotune.TuneJob) -> None:
    """A tuning job ended: its shape's decisions are made again on their next call (from the
    store read again: :mod:`fa2tune.ops.selection` forgets what was read)."""
    tag = job_tag(job)
    with _decide_lock:
        for key, entry in list(_decisions.items()):
            if isinstance(entry, Launcher) and entry.tag == tag:
                del _decisions[key]


autotune.add_listener(_forget_tuned)


def _decision(
    key: tuple[object, ...],
    q: torch.Tensor,
    k: torch.Tensor,
    causal: bool,
    layout: Layout,
    packed: Packed | None,
    variant: Variant = PLAIN,
) -> Launcher | PackedLauncher | str:
    """The cached decision of ``key``, made under the lock by its first call."""
    with _decide_lock:
        entry = _decisions.get(key)
        if entry is None:
            entry = _decide(q, k, causal, layout, packed, variant)
            if len(_decisions) >= MAX_DECISIONS:  # dicts keep insertion order: the oldest
                del _decisions[next(iter(_decisions))]
            _decisions[key] = entry
        return entry


def run(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    layout: str,
    return_lse: bool,
    fallback: bool,
    seqs: CuSeqlens | None = None,
    window: tuple[int, int] = NO_WINDOW,
    chunk: int = 0,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(o, lse)``, ``lse`` None when not asked for: the eager path and the ops' body, for a
    dense call, or a packed batch with its sequences ``seqs`` (``layout`` then unused);
    ``window``, ``chunk``, ``softcap``, ``sinks``: the call's attention variant.

    Raises:
        ValueError: bad arguments (:func:`check_shapes`, :func:`check_varlen_args`,
            :func:`check_sinks`, a variant argument out of its domain).
        Unsupported: the call cannot be served and ``fallback`` is False.
        CudaError: the driver refused the launch.
    """
    entry: Launcher | PackedLauncher | str | None
    variant = PLAIN
    # Only the default variant arguments: nothing to normalise (inline: the per-call path).
    plain_args = (window is NO_WINDOW or window == NO_WINDOW) and not chunk and not softcap
    plain_args = plain_args and sinks is None
    if seqs is None:
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        lay: Layout = "bhnd" if layout == "bhnd" else "bnhd"
        if not plain_args:
            check_shapes(q, k, v, layout)
            _, nq, heads, _ = _dims(q, lay)
            nk = _dims(k, lay)[1]
            if sinks is not None:
                sinks = check_sinks(sinks, q, heads)
            causal, variant = normalize_call(causal, window[0], window[1], chunk,
                                             float(softcap), sinks is not None, nq, nk)  # fmt: skip
        key: tuple[object, ...] = (q.device, q.dtype, q.shape, k.shape, causal, lay)
        if not plain_args and not variant.plain:
            key = (*key, variant)
        entry = _decisions.get(key)
        if entry is None:
            check_shapes(q, k, v, layout)
            entry = _decision(key, q, k, causal, lay, None, variant)
        message = _FALLBACK
    else:
        lay = "bnhd"
        max_q, max_k = _max_len("max_seqlen_q", seqs.max_q), _max_len("max_seqlen_k", seqs.max_k)
        if max_q is not seqs.max_q or max_k is not seqs.max_k:  # an int subclass, say
            seqs = CuSeqlens(seqs.cu_q, seqs.cu_k, max_q, max_k)
        check_varlen_args(q, k, v, seqs.cu_q, seqs.cu_k, seqs.max_q, seqs.max_k)
        if not plain_args:
            if sinks is not None:
                sinks = check_sinks(sinks, q, int(q.shape[1]))
            causal, variant = normalize_call(causal, window[0], window[1], chunk, float(softcap),
                                             sinks is not None, seqs.max_q, seqs.max_k,
                                             True)  # fmt: skip
        total_q, count = int(q.shape[0]), int(seqs.cu_q.shape[0]) - 1
        if total_q == 0:  # nothing to compute (and a grid of no blocks is not launchable)
            lse0 = q.new_empty(lse_shape(q, lay, True), dtype=torch.float32) if return_lse else None
            return q.new_empty(q.shape), lse0
        key = decision_key(q.device, q.dtype, int(q.shape[2]), int(q.shape[1]),
                           int(k.shape[1]), causal, count, total_q, seqs.max_q,
                           variant)  # fmt: skip
        entry = _decisions.get(key)
        if entry is None:
            packed = Packed(count, mean_bucket(total_q, count))
            entry = _decision(key, q, k, effective_varlen_causal(causal, seqs.max_q), lay, packed,
                              variant)  # fmt: skip
        message = _PACKED_FALLBACK
    if (
        not isinstance(entry, str)
        and torch.is_grad_enabled()
        and (q.requires_grad or k.requires_grad or v.requires_grad
             or (sinks is not None and sinks.requires_grad))
    ):  # fmt: skip
        entry = "gradients are recorded (the kernels are forward-only)"
    if isinstance(entry, str):
        if not fallback:
            raise Unsupported(entry)
        _warn_once(message + entry)
        return _on_torch(q, k, v, causal, scale, lay, return_lse, seqs, variant, sinks)
    # Contiguous, q's dtype and device; empty_like is about half new_empty's host time
    # (torch 2.11, H200 host) and gives a contiguous tensor for a contiguous q.
    o = torch.empty_like(q) if q.is_contiguous() else q.new_empty(q.shape)
    lse = (q.new_empty(lse_shape(q, lay, seqs is not None), dtype=torch.float32)
           if return_lse else None)  # fmt: skip
    try:
        if q.get_device() == current_device_index():
            if sinks is None:
                entry(q, k, v, o, lse, scale, lay, seqs)
            else:
                entry(q, k, v, o, lse, scale, lay, seqs, sinks)
        else:  # the kernel lives in that device's context: make it current for the launch
            with torch.cuda.device(q.device):
                if sinks is None:
                    entry(q, k, v, o, lse, scale, lay, seqs)
                else:
                    entry(q, k, v, o, lse, scale, lay, seqs, sinks)
    except ValueError as exc:  # strides, alignment (or a packed call's empty k)
        if not fallback:
            raise Unsupported(str(exc)) from exc
        _warn_once(message + f"tensor layout the kernels do not take ({exc})")
        return _on_torch(q, k, v, causal, scale, lay, return_lse, seqs, variant, sinks)
    return o, lse


def _on_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    layout: Layout,
    return_lse: bool,
    seqs: CuSeqlens | None,
    variant: Variant = PLAIN,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The call on torch alone (:mod:`fa2tune.ops.fallback`), in its mode, its variant
    computed there (never dropped)."""
    if seqs is None:
        return sdpa_fallback(q, k, v, causal, scale, layout, return_lse, variant, sinks)
    return varlen_fallback(q, k, v, seqs.cu_q, seqs.cu_k, seqs.max_q, seqs.max_k, causal, scale,
                           return_lse, variant, sinks)  # fmt: skip


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    layout: str,
    return_lse: bool,
    fallback: bool,
    window_left: int = -1,
    window_right: int = -1,
    chunk: int = 0,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The dense op's real implementation: ``(o, lse)``, ``lse`` empty when not asked for.

    Raises:
        Unsupported: the call cannot be served and ``fallback`` is False.
        CudaError: the driver refused the launch.
    """
    o, lse = run(q, k, v, causal, scale, layout, return_lse, fallback, None,
                 (window_left, window_right), chunk, softcap, sinks)  # fmt: skip
    return o, (lse if lse is not None else no_lse(q))


# Without torch installed (mypy on a CPU machine) the decorators are untyped. The variant
# arguments come last with their defaults, so calls of the ops written before them stand.
@torch.library.custom_op(  # type: ignore[untyped-decorator,unused-ignore]
    "fa2tune::attention", mutates_args=()
)
def attention_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    layout: str,
    return_lse: bool,
    fallback: bool,
    window_left: int = -1,
    window_right: int = -1,
    chunk: int = 0,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.ops.fa2tune.attention``: see :func:`forward`."""
    return forward(q, k, v, causal, scale, layout, return_lse, fallback, window_left,
                   window_right, chunk, softcap, sinks)  # fmt: skip


@attention_op.register_fake  # type: ignore[untyped-decorator,unused-ignore]
def _attention_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    layout: str,
    return_lse: bool,
    fallback: bool,
    window_left: int = -1,
    window_right: int = -1,
    chunk: int = 0,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    lay: Layout = "bhnd" if layout == "bhnd" else "bnhd"
    lse = q.new_empty(lse_shape(q, lay), dtype=torch.float32) if return_lse else no_lse(q)
    return q.new_empty(q.shape), lse


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
    window_left: int = -1,
    window_right: int = -1,
    chunk: int = 0,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.ops.fa2tune.attention_varlen``: ``(o, lse)``, ``lse`` empty when not asked for
    (see :func:`run`)."""
    seqs = CuSeqlens(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    o, lse = run(q, k, v, causal, scale, "bnhd", return_lse, fallback, seqs,
                 (window_left, window_right), chunk, softcap, sinks)  # fmt: skip
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
    window_left: int = -1,
    window_right: int = -1,
    chunk: int = 0,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    if q.dim() != 3:
        raise ValueError(f"q must be 3-d packed [total, heads, D], got {q.dim()} dims")
    lse = q.new_empty(lse_shape(q, "bnhd", True), dtype=torch.float32) if return_lse else no_lse(q)
    return q.new_empty(q.shape), lse


_VARIANT_DOC = """
        window_size: ``(left, right)``: query ``i`` sees key ``j`` only if ``pos - left <= j
            <= pos + right`` with ``pos = i + Nk - Nq`` (bottom-right aligned, as
            FlashAttention); -1 is no bound (a causal call's right bound is 0).
        attention_chunk: > 0 keeps only the keys in ``pos``'s chunk of this many keys
            (Llama-4's chunked attention); 0 is none.
        softcap: > 0 replaces each softmax-scaled score ``s`` by ``softcap * tanh(s /
            softcap)`` (Gemma-2); 0 is none.
        sinks: ``[Hq]`` sink logits (GPT-OSS), float32 on q's device (bf16/fp16 are
            converted to float32 once per call): each joins its head's softmax denominator
            and attends to nothing; the LSE includes it, and a row that sees no key has O = 0
            and LSE = its sink logit."""


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
    layout: str = "bnhd",
    fallback: bool = True,
    window_size: tuple[int, int] = NO_WINDOW,
    attention_chunk: int = 0,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention forward on the config tuned for this GPU and shape (see :mod:`fa2tune.torch`).

    Args:
        q: ``[B, Nq, Hq, D]`` (``layout="bnhd"``) or ``[B, Hq, Nq, D]`` (``"bhnd"``); k, v
            the same with ``Nk`` keys and ``Hkv`` heads (``Hq % Hkv == 0``).
        causal: bottom-right aligned (query ``i`` sees key ``j`` iff ``j <= i + Nk - Nq``; a
            row that sees no key gives O = 0, LSE = -inf).
        scale: softmax scale, ``1 / sqrt(D)`` by default.
        return_lse: also return the float32 LSE ``[B, Hq, Nq]``.
        layout: ``"bnhd"`` or ``"bhnd"``.
        fallback: run what the kernels cannot serve on torch (warning once per reason);
            False raises :class:`~fa2tune.ops.choice.Unsupported` instead.{variant}

    Returns:
        ``o`` (fresh, contiguous, q's shape), or ``(o, lse)``.

    Raises:
        ValueError: bad arguments (shapes, layout, a variant argument, sinks' shape, dtype or
            device).
        Unsupported: with ``fallback=False``, a call the kernels cannot serve.
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    window = NO_WINDOW if window_size is NO_WINDOW else window_pair(window_size)
    if torch.compiler.is_compiling() or type(q) is not torch.Tensor:
        # Traced (torch.compile) or a tensor subclass (FakeTensor): through the dispatcher.
        o, lse = torch.ops.fa2tune.attention(q, k, v, causal, scale, layout, return_lse, fallback,
                                             window[0], window[1], attention_chunk, softcap,
                                             sinks)  # fmt: skip
    else:
        # Eager: the dispatcher's custom-op machinery costs more than the launch itself.
        o, lse_or_none = run(q, k, v, causal, float(scale), layout, return_lse, fallback, None,
                             window, attention_chunk, softcap, sinks)  # fmt: skip
        if not return_lse:
            return o
        lse = lse_or_none if lse_or_none is not None else no_lse(q)
    return (o, lse) if return_lse else o


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
    window_size: tuple[int, int] = NO_WINDOW,
    attention_chunk: int = 0,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention forward over a packed batch of variable-length sequences, on the varlen
    config tuned nearest this batch for this GPU (see docs/torch.md): :func:`attention`'s
    path with the sequences.

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
            False raises :class:`~fa2tune.ops.choice.Unsupported` instead.{variant}
            Windows and chunks are aligned per sequence, on its own lengths.

    Returns:
        ``o`` ``[total_q, Hq, D]`` (fresh, contiguous), or ``(o, lse)``.

    Raises:
        ValueError: bad arguments (shapes, offsets' dtype, device or length, heads, a variant
            argument, sinks' shape, dtype or device).
        Unsupported: with ``fallback=False``, a call the kernels cannot serve.
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    window = NO_WINDOW if window_size is NO_WINDOW else window_pair(window_size)
    if torch.compiler.is_compiling() or type(q) is not torch.Tensor:
        # Traced (torch.compile) or a tensor subclass (FakeTensor): through the dispatcher.
        o, lse = torch.ops.fa2tune.attention_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
            return_lse, fallback, window[0], window[1], attention_chunk, softcap, sinks,
        )  # fmt: skip
        return (o, lse) if return_lse else o
    # Eager: the dispatcher's custom-op machinery costs more than the launch itself.
    seqs = CuSeqlens(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    o, lse_or_none = run(q, k, v, causal, float(scale), "bnhd", return_lse, fallback, seqs,
                         window, attention_chunk, softcap, sinks)  # fmt: skip
    if not return_lse:
        return o
    return o, (lse_or_none if lse_or_none is not None else no_lse(q))


for _entry in (attention, attention_varlen):
    if _entry.__doc__:
        _entry.__doc__ = _entry.__doc__.replace("{variant}", _VARIANT_DOC)


def clear_caches() -> None:
    """Forget every decision and warning of both entries and the results read from the store
    (the next call of each group reads it again: results other processes wrote since are
    seen); kernels stay loaded."""
    with _decide_lock:
        _decisions.clear()
        _warned.clear()
    forget_results()
    reset_service_state()


__all__ = [
    "CudaError",
    "Unsupported",
    "attention",
    "attention_op",
    "attention_varlen",
    "attention_varlen_op",
    "check_shapes",
    "check_sinks",
    "check_varlen_args",
    "clear_caches",
    "forward",
    "run",
    "sdpa_fallback",
    "varlen_fallback",
    "window_pair",
]
