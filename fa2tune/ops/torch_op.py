"""``torch.ops.fa2tune.attention``: the custom op, its fake implementation and the fallback.

The op's real implementation (:func:`forward`) looks the call up in a dict keyed by (device,
dtype, Q and K shapes, mask, layout); the first call of a key decides (config choice,
build, load: :func:`_decide`) and every later call only allocates the output and launches.
No store query, logging or warning runs on that path. Calls the kernels cannot serve run on
``torch.nn.functional.scaled_dot_product_attention`` (:func:`sdpa_fallback`) with a warning
once per reason, or raise :class:`~fa2tune.ops.choice.Unsupported` with ``fallback=False``.

The op is registered with :func:`torch.library.custom_op` and a fake implementation, so
``torch.compile(fullgraph=True)`` traces it as one node, and FakeTensor / meta tensors get
the output's shape and dtype without a GPU. The output is always a fresh contiguous tensor of
Q's shape; the LSE is ``[B, Hq, Nq]`` float32, or an empty float32 tensor when not asked for.

Imports torch (and registers the op) at import: :mod:`fa2tune.torch` imports it.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import warnings
from dataclasses import replace

import torch

from core.settings import get_settings
from core.shape import Shape, effective_causal
from fa2tune.ops import autotune
from fa2tune.ops.choice import (
    DTYPE_NAMES,
    FallbackWarning,
    Unsupported,
    call_reason,
    choose_config,
)
from fa2tune.ops.kernels import Launcher, device_info, load_kernel
from fa2tune.ops.selection import Call, job_tag, reset_service_state, select
from measure.loader import CudaError
from measure.params import LAYOUTS, Layout

log = logging.getLogger("fa2tune.torch")

#: (device index, dtype, q shape, k shape, causal, layout) -> a launcher, or why not.
_decisions: dict[tuple[object, ...], Launcher | str] = {}
_decide_lock = threading.Lock()
_warned: set[str] = set()


def _dims(t: torch.Tensor, layout: Layout) -> tuple[int, int, int, int]:
    """(batch, rows, heads, head dim) of a 4-d tensor in ``layout``."""
    b, x, y, d = (int(s) for s in t.shape)
    return (b, x, y, d) if layout == "bnhd" else (b, y, x, d)


def lse_shape(q: torch.Tensor, layout: Layout) -> tuple[int, int, int]:
    """``[B, Hq, Nq]``: the LSE's shape (the op's real and fake implementations)."""
    b, nq, h, _ = _dims(q, layout)
    return (b, h, nq)


def no_lse(q: torch.Tensor) -> torch.Tensor:
    """The empty float32 tensor returned in the LSE's place when it was not asked for."""
    return q.new_empty((0,), dtype=torch.float32)


# torch.cuda.current_device() without its Python wrapper (the device is initialised by then).
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)


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


def _warn_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(
            f"fa2tune.torch: running on SDPA instead of a tuned kernel: {reason}",
            FallbackWarning,
            stacklevel=4,
        )


def _show_choice(line: str) -> None:
    """Log a choice where it will be seen: with no logging configured, INFO records would be
    dropped, so the logger gets a stderr handler of its own the first time."""
    if not logging.getLogger().hasHandlers() and not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    log.info("%s", line)


def _decide(q: torch.Tensor, k: torch.Tensor, causal: bool, layout: Layout) -> Launcher | str:
    """The launcher for this call's key, or the reason it falls back (first call of a key)."""
    reason = call_reason(
        device_type=q.device.type, dtype=str(q.dtype).removeprefix("torch."), d=int(q.shape[-1])
    )
    if reason is not None:
        return reason
    b, nq, h, d = _dims(q, layout)
    _, nk, hk, _ = _dims(k, layout)
    causal = effective_causal(causal, nq)  # one causal row sees every key: served unmasked
    device = device_info(q.device.index if q.device.index is not None else 0)
    call = Call(
        device=device.index, gpu=device.name, sm_count=device.sm_count,
        compute_capability=device.compute_capability, shape=Shape(nq, nk, b, h, hk),
        dtype=DTYPE_NAMES[str(q.dtype).removeprefix("torch.")], causal=causal, d=d,
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
            log.warning("fa2tune.torch: %s; trying the default config", first.reason)
            choice = choose_config(
                None, call.gpu, call.sm_count, call.shape, call.dtype, causal, d,
                compute_capability=call.compute_capability,
            )  # fmt: skip
            kernel = load_kernel(choice.config, device)
    except Unsupported as exc:
        return exc.reason
    if get_settings().print_choice:
        _show_choice(f"{device.name} {call.dtype} {'causal' if causal else 'full'} D={d} "
                     f"{layout}: {replace(selected, choice=choice).describe(call)}")  # fmt: skip
    return Launcher(kernel, choice.config, choice.source, call.shape, call.tag)


def _forget_tuned(job: autotune.TuneJob) -> None:
    """A tuning job ended: its shape's decisions are made again on their next call."""
    tag = job_tag(job)
    with _decide_lock:
        for key, entry in list(_decisions.items()):
            if isinstance(entry, Launcher) and entry.tag == tag:
                del _decisions[key]


autotune.add_listener(_forget_tuned)


def sdpa_fallback(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    layout: Layout,
    return_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The op's semantics on torch alone: SDPA, or float32 math where SDPA differs.

    The kernels' causal mask is bottom-right aligned (key ``j`` seen by query ``i`` iff
    ``j <= i + nk - nq``) and a row that sees no key gives O = 0, LSE = -inf; SDPA's
    ``is_causal`` is top-left aligned. So a causal call with ``nq != nk`` gets an explicit
    mask, and calls asking for the LSE (SDPA does not return it) or with rows that see no key
    are computed in float32 here.
    """
    qh, kh, vh = (t if layout == "bhnd" else t.transpose(1, 2) for t in (q, k, v))
    if any(s % 8 for t in (qh, kh, vh) for s in t.stride()[:-1]):
        # SDPA's fused kernels gave wrong results on such strides (16-byte rows they assume;
        # seen with torch 2.11): a dense copy costs little next to a fallback's math.
        qh, kh, vh = qh.contiguous(), kh.contiguous(), vh.contiguous()
    h, nq = int(qh.shape[1]), int(qh.shape[2])
    nk = int(kh.shape[2])
    group = h // int(kh.shape[1])
    if group > 1:
        kh, vh = kh.repeat_interleave(group, dim=1), vh.repeat_interleave(group, dim=1)
    mask = None
    if causal and nq != nk:
        mask = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(diagonal=nk - nq)
    if not return_lse and not (causal and nq > nk):
        o = torch.nn.functional.scaled_dot_product_attention(
            qh, kh, vh, attn_mask=mask, is_causal=causal and mask is None, scale=scale
        )
        lse = no_lse(q)
    else:
        s = torch.matmul(qh.float(), kh.float().transpose(-1, -2)) * scale
        if causal:
            visible = mask if mask is not None else torch.ones(
                nq, nk, dtype=torch.bool, device=q.device).tril()  # fmt: skip
            s = s.masked_fill(~visible, float("-inf"))
        lse_full = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse_full.unsqueeze(-1)).nan_to_num(0.0)  # dead rows: -inf - -inf
        o = torch.matmul(p, vh.float()).to(q.dtype)
        lse = lse_full.contiguous() if return_lse else no_lse(q)
    out = o if layout == "bhnd" else o.transpose(1, 2)
    return out.contiguous(), lse


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    layout: str,
    return_lse: bool,
    fallback: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The op's real implementation: ``(o, lse)``, ``lse`` empty when not asked for.

    Raises:
        Unsupported: the call cannot be served and ``fallback`` is False.
        CudaError: the driver refused the launch.
    """
    o, lse = run(q, k, v, causal, scale, layout, return_lse, fallback)
    return o, (lse if lse is not None else no_lse(q))


def run(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    layout: str,
    return_lse: bool,
    fallback: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`forward` without the empty LSE tensor when none is asked for (the eager path of
    ``fa2tune.torch.attention``: an allocation fewer per call)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    lay: Layout = "bhnd" if layout == "bhnd" else "bnhd"
    device = q.device
    key = (device, q.dtype, q.shape, k.shape, causal, lay)
    entry = _decisions.get(key)
    if entry is None:
        check_shapes(q, k, v, layout)
        with _decide_lock:
            entry = _decisions.get(key)
            if entry is None:
                entry = _decide(q, k, causal, lay)
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
        return sdpa_fallback(q, k, v, causal, scale, lay, return_lse)
    # Contiguous, q's dtype and device; empty_like is about half new_empty's host time
    # (torch 2.11, H200 host) and gives a contiguous tensor for a contiguous q.
    o = torch.empty_like(q) if q.is_contiguous() else q.new_empty(q.shape)
    lse = q.new_empty(lse_shape(q, lay), dtype=torch.float32) if return_lse else None
    try:
        if device.index == _current_device():
            entry(q, k, v, o, lse, scale, lay)
        else:  # the kernel lives in that device's context: make it current for the launch
            with torch.cuda.device(device):
                entry(q, k, v, o, lse, scale, lay)
    except ValueError as exc:  # strides or alignment this call's tensors have
        if not fallback:
            raise Unsupported(str(exc)) from exc
        _warn_once(f"tensor layout the kernels do not take ({exc})")
        return sdpa_fallback(q, k, v, causal, scale, lay, return_lse)
    return o, lse


# Without torch installed (mypy on a CPU machine) the decorators are untyped.
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.ops.fa2tune.attention``: see :func:`forward`."""
    return forward(q, k, v, causal, scale, layout, return_lse, fallback)


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
) -> tuple[torch.Tensor, torch.Tensor]:
    lay: Layout = "bhnd" if layout == "bhnd" else "bnhd"
    lse = q.new_empty(lse_shape(q, lay), dtype=torch.float32) if return_lse else no_lse(q)
    return q.new_empty(q.shape), lse


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
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention forward on the config tuned for this GPU and shape (see :mod:`fa2tune.torch`)."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if torch.compiler.is_compiling() or type(q) is not torch.Tensor:
        # Traced (torch.compile) or a tensor subclass (FakeTensor): through the dispatcher.
        o, lse = torch.ops.fa2tune.attention(q, k, v, causal, scale, layout, return_lse, fallback)
    else:
        # Eager: the dispatcher's custom-op machinery costs more than the launch itself.
        o, lse_or_none = run(q, k, v, causal, float(scale), layout, return_lse, fallback)
        if not return_lse:
            return o
        lse = lse_or_none if lse_or_none is not None else no_lse(q)
    return (o, lse) if return_lse else o


def clear_caches() -> None:
    """Forget every decision and warning (tests; kernels stay loaded)."""
    with _decide_lock:
        _decisions.clear()
        _warned.clear()
    reset_service_state()


__all__ = ["CudaError", "Unsupported", "attention", "attention_op", "clear_caches", "forward"]
