"""``fa2tune.flash_attn``: FlashAttention-3's ``flash_attn_interface`` on fa2tune's kernels.

    from fa2tune.flash_attn import flash_attn_func, flash_attn_varlen_func
    out = flash_attn_func(q, k, v, causal=True, window_size=(128, 0))   # q [B, Nq, Hq, D]
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, return_attn_probs=True)

The functions take FlashAttention-3's arguments in its order with its defaults (hopper's
``flash_attn_interface``) and return what it returns, so code written against it (and its
test suite, bench/peer/) runs by changing one import. Underneath is the torch op
(:mod:`fa2tune.ops.torch_op`) with ``fallback=False``: a call the tuned kernels cannot serve
raises :class:`NotImplementedError` with the reason, never runs on another implementation.

What differs, on purpose:

* Forward only. Outputs of inputs that record gradients carry a graph node whose backward
  raises :class:`NotImplementedError` (a loss through them fails loudly instead of training
  with gradients silently missing).
* Arguments fa2tune does not run raise :class:`NotImplementedError` naming them: ``qv``, the
  fp8 descales and fp8 inputs, a V head dim other than Q's, ``deterministic=True``, and in
  :func:`flash_attn_with_kvcache` rotary embedding; paged and contiguous caches, lengths on
  the device, batch indices, left padding, packed queries and new keys over a cache and
  appending K/V run (:func:`fa2tune.torch.attention_with_kvcache`), and so do
  ``seqused_q``/``seqused_k`` in :func:`flash_attn_varlen_func`. Scheduling hints
  (``num_splits``, ``pack_gqa``, ``sm_margin``, ``scheduler_metadata``) are accepted and
  ignored: fa2tune's tuned config decides the schedule.
* The LSE of a row that sees no key is +inf, as FlashAttention returns it (fa2tune's own op
  says -inf; converted here). With sinks such a row's LSE is its sink logit, as in the op.
* ``sinks=`` (keyword only, an fa2tune extension: hopper's interface has no sink argument):
  ``[Hq]`` float32 logits (GPT-OSS's attention sinks), see :func:`fa2tune.torch.attention`.

Importing this module imports torch (and registers the op).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from fa2tune.ops.choice import Unsupported
from fa2tune.ops.kernels import CuSeqlens
from fa2tune.ops.kvcache_varlen import run_packed_with_kvcache
from fa2tune.ops.torch_op import run
from fa2tune.ops.varlen_used import check_used, compact, expand

__all__ = [
    "flash_attn_combine",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "get_scheduler_metadata",
]


def _refuse(what: str) -> NotImplementedError:
    return NotImplementedError(f"fa2tune.flash_attn does not run {what}")


def _window(window_size: Any) -> tuple[int, int]:
    """FlashAttention's ``window_size`` (a pair; its tests pass a 2-element tensor too)."""
    try:
        left, right = (int(x) for x in window_size)
    except (TypeError, ValueError):
        raise ValueError(f"window_size must be (left, right), got {window_size!r}") from None
    return left, right


def _check_common(
    q: torch.Tensor,
    v: torch.Tensor,
    qv: Any,
    q_descale: Any,
    k_descale: Any,
    v_descale: Any,
    deterministic: bool,
) -> None:
    """The arguments every entry refuses (NotImplementedError naming the argument)."""
    if qv is not None:
        raise _refuse("qv (an extra Q-V product, FlashAttention-3's MLA path)")
    for name, value in (("q_descale", q_descale), ("k_descale", k_descale),
                        ("v_descale", v_descale)):  # fmt: skip
        if value is not None:
            raise _refuse(f"{name} (fp8 attention)")
    if q.dtype.is_floating_point and q.dtype.itemsize == 1:
        raise _refuse(f"fp8 inputs ({q.dtype})")
    if int(v.shape[-1]) != int(q.shape[-1]):
        raise _refuse(f"a V head dim ({v.shape[-1]}) other than Q's ({q.shape[-1]})")
    if deterministic:
        raise _refuse("deterministic=True (a backward option; fa2tune has no backward)")


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _fa_lse(lse: torch.Tensor) -> torch.Tensor:
    """fa2tune's LSE in FlashAttention's convention: a row that sees no key is +inf."""
    return lse.masked_fill_(lse == float("-inf"), float("inf"))


class _ForwardOnly(torch.autograd.Function):  # type: ignore[misc, unused-ignore]
    """A forward whose backward refuses: the output of inputs that need gradients."""

    @staticmethod
    def forward(ctx: Any, compute: Callable[[], tuple[torch.Tensor, torch.Tensor]],
                *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        o, lse = compute()
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        raise NotImplementedError(
            "fa2tune.flash_attn is forward-only: no backward pass (gradients of q, k, v)"
        )


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seqs: CuSeqlens | None,
    softmax_scale: float | None,
    causal: bool,
    window_size: Any,
    attention_chunk: int,
    softcap: float,
    sinks: torch.Tensor | None,
    return_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` in FlashAttention's conventions, from the torch op without fallback
    (``lse`` an empty tensor unless ``return_lse``)."""
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    window = _window(window_size)

    def compute() -> tuple[torch.Tensor, torch.Tensor]:
        try:
            o, lse = run(q, k, v, bool(causal), float(scale), "bnhd", return_lse, False, seqs,
                         window, int(attention_chunk), float(softcap), sinks)  # fmt: skip
        except Unsupported as exc:
            raise NotImplementedError(f"fa2tune does not run this call: {exc.reason}") from exc
        if lse is None:
            return o, o.new_empty((0,), dtype=torch.float32)
        return o, _fa_lse(lse)

    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, sinks)
    )
    if needs_grad:
        tensors = [t for t in (q, k, v, sinks) if t is not None]
        o, lse = _ForwardOnly.apply(compute, *tensors)  # type: ignore[no-untyped-call, unused-ignore]
        return o, lse
    return compute()


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    qv: torch.Tensor | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    window_size: tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: bool | None = None,
    deterministic: bool = False,
    sm_margin: int = 0,
    return_attn_probs: bool = False,
    *,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention-3's ``flash_attn_func`` (forward): ``out`` ``[B, Nq, Hq, D]``, or with
    ``return_attn_probs`` ``(out, softmax_lse)``, the LSE ``[B, Hq, Nq]`` float32.

    q ``[B, Nq, Hq, D]``, k and v ``[B, Nk, Hkv, D]``; causal and windows bottom-right
    aligned; ``num_splits``, ``pack_gqa``, ``sm_margin`` are hints (ignored). ``sinks``: an
    fa2tune extension (see the module docstring).

    Raises:
        NotImplementedError: an argument fa2tune does not run (named), or a call its kernels
            cannot serve (with the reason).
        ValueError: bad arguments.
    """
    del num_splits, pack_gqa, sm_margin  # scheduling hints: the tuned config decides
    _check_common(q, v, qv, q_descale, k_descale, v_descale, deterministic)
    out, lse = _attend(q, k, v, None, softmax_scale, causal, window_size, attention_chunk,
                       softcap, sinks, return_attn_probs)  # fmt: skip
    return (out, lse) if return_attn_probs else out


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    seqused_q: torch.Tensor | None = None,
    seqused_k: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    qv: torch.Tensor | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    window_size: tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: bool | None = None,
    deterministic: bool = False,
    sm_margin: int = 0,
    return_attn_probs: bool = False,
    *,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention-3's ``flash_attn_varlen_func`` (forward) over a packed batch:
    ``out`` ``[total_q, Hq, D]``, or ``(out, softmax_lse)`` with the LSE ``[Hq, total_q]``.

    ``cu_seqlens_*``: int32 ``[num_seqs + 1]`` offsets; masks aligned per sequence.
    ``seqused_q`` / ``seqused_k``: int32 ``[num_seqs]``, the rows each sequence uses of its
    span (the first ones; the rest are ignored, unused query rows get zeros): the used rows
    are gathered into packed copies first (:mod:`fa2tune.ops.varlen_used`).

    Raises:
        NotImplementedError: a refused argument, or a call the kernels cannot serve.
        ValueError: bad arguments.
    """
    del num_splits, pack_gqa, sm_margin  # scheduling hints: the tuned config decides
    _check_common(q, v, qv, q_descale, k_descale, v_descale, deterministic)
    check_used(seqused_q, seqused_k, cu_seqlens_q, cu_seqlens_k)
    cu_q, cu_k = cu_seqlens_q, cu_seqlens_k
    if seqused_k is not None:
        k, cu_k = compact(k, cu_seqlens_k, seqused_k)
        v, _ = compact(v, cu_seqlens_k, seqused_k)
    if seqused_q is not None:
        q, cu_q = compact(q, cu_seqlens_q, seqused_q)
    seqs = CuSeqlens(cu_q, cu_k, max_seqlen_q, max_seqlen_k)
    out, lse = _attend(q, k, v, seqs, softmax_scale, causal, window_size, attention_chunk,
                       softcap, sinks, return_attn_probs)  # fmt: skip
    if seqused_q is not None:
        out, kept_lse = expand(out, lse if return_attn_probs else None, cu_seqlens_q, cu_q,
                               float("inf"))  # fmt: skip
        lse = kept_lse if kept_lse is not None else lse
    return (out, lse) if return_attn_probs else out


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    qv: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: int | torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    page_table: torch.Tensor | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k_new: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    rotary_seqlens: torch.Tensor | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    scheduler_metadata: torch.Tensor | None = None,
    num_splits: int = 0,
    pack_gqa: bool | None = None,
    sm_margin: int = 0,
    return_softmax_lse: bool = False,
    *,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention-3's ``flash_attn_with_kvcache``: attention of ``q`` ``[B, Nq, Hq, D]``
    over a KV cache, contiguous ``[rows, capacity, Hkv, D]`` or paged
    ``[pages, page size, Hkv, D]`` with ``page_table`` (int32 ``[B, max_pages]``), after
    appending ``k``/``v`` ``[B, Nnew, Hkv, D]`` in place at each sequence's length
    (:func:`fa2tune.torch.attention_with_kvcache`). ``cache_seqlens``: int32 ``[B]`` on the
    device, an int for all, or None (every sequence uses the whole capacity; refused with
    ``k``/``v`` to append, whose place it would leave unsaid). ``cache_leftpad``: int32
    ``[B]``, sequence ``b``'s first key (over a paged cache, on a gathered contiguous copy of
    its pages). Packed queries (``cu_seqlens_q`` with
    ``max_seqlen_q``: ``q`` ``[total_q, Hq, D]``, ``out`` alike, LSE ``[Hq, total_q]``) and packed
    new keys (``cu_seqlens_k_new``: ``k``/``v`` ``[total_new, Hkv, D]``) run on the dense cache
    kernels through right-aligned padding (:mod:`fa2tune.ops.kvcache_varlen`).

    Returns:
        ``out``, or with ``return_softmax_lse`` ``(out, softmax_lse)`` (``[B, Hq, Nq]``).

    Raises:
        NotImplementedError: rotary embedding, another refused argument (named), or a call
            the kernels cannot serve (with the reason).
        ValueError: bad arguments.
    """
    del rotary_interleaved, scheduler_metadata, num_splits, pack_gqa, sm_margin  # hints
    refused = {
        "rotary_cos (rotary embedding)": rotary_cos,
        "rotary_sin (rotary embedding)": rotary_sin,
        # rotary_seqlens only matters with rotary_cos (FlashAttention-3 ignores it without)
        "rotary_seqlens (rotary embedding)": rotary_seqlens if rotary_cos is not None else None,
    }
    for what, value in refused.items():
        if value is not None:
            raise _refuse(what)
    _check_common(q, v_cache, qv, q_descale, k_descale, v_descale, False)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, sinks)):
        raise _refuse("gradients through flash_attn_with_kvcache (forward only)")
    try:
        out, lse = run_packed_with_kvcache(
            _last_dim_contiguous(q), k_cache, v_cache, k, v, cache_seqlens, page_table,
            cache_batch_idx, cache_leftpad, cu_seqlens_q, max_seqlen_q, cu_seqlens_k_new,
            bool(causal), float(scale), _window(window_size), int(attention_chunk),
            float(softcap), sinks, return_softmax_lse, False,
        )  # fmt: skip
    except Unsupported as exc:
        raise NotImplementedError(f"fa2tune does not run this call: {exc.reason}") from exc
    return (out, _fa_lse(lse)) if return_softmax_lse else out


def flash_attn_combine(
    out_partial: torch.Tensor,
    lse_partial: torch.Tensor,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention-3's ``flash_attn_combine`` on torch (no kernel: fa2tune's split-KV
    kernels combine their own splits): partial outputs ``[S, ..., D]`` with their LSEs
    ``[S, ...]`` merged into ``(out [..., D], lse [...])``, float32 math; a split whose LSE
    is -inf counts for nothing.

    Args:
        out_partial: each split's normalised output, float32.
        lse_partial: each split's LSE.
        out: where to write the output (its dtype wins), else a new tensor.
        out_dtype: the new output's dtype (default: ``out_partial``'s).
    """
    lse_p = lse_partial.float()
    lse = torch.logsumexp(lse_p, dim=0)
    weight = torch.exp(lse_p - lse.unsqueeze(0)).nan_to_num(0.0, posinf=0.0, neginf=0.0)
    combined = (weight.unsqueeze(-1) * out_partial.float()).sum(dim=0)
    if out is not None:
        out.copy_(combined)
        return out, lse
    return combined.to(out_dtype or out_partial.dtype), lse


def get_scheduler_metadata(
    batch_size: int,
    max_seqlen_q: int,
    max_seqlen_k: int,
    num_heads_q: int,
    num_heads_kv: int,
    headdim: int,
    cache_seqlens: torch.Tensor,
    qkv_dtype: torch.dtype = torch.bfloat16,
    headdim_v: int | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k_new: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    page_size: int | None = None,
    max_seqlen_k_new: int = 0,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    has_softcap: bool = False,
    num_splits: int = 0,
    pack_gqa: bool | None = None,
    sm_margin: int = 0,
) -> torch.Tensor:
    """FlashAttention-3's ``get_scheduler_metadata``: an empty int32 tensor on the cache
    lengths' device. fa2tune schedules when a call's config is decided, so there is nothing
    to precompute; :func:`flash_attn_with_kvcache` accepts the result and ignores it."""
    del batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim, qkv_dtype
    del headdim_v, cu_seqlens_q, cu_seqlens_k_new, cache_leftpad, page_size, max_seqlen_k_new
    del causal, window_size, attention_chunk, has_softcap, num_splits, pack_gqa, sm_margin
    return torch.empty((0,), dtype=torch.int32, device=cache_seqlens.device)
