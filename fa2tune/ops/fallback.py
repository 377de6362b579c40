"""The op's semantics on torch alone: what runs when the kernels cannot serve a call.

:func:`sdpa_fallback` serves a dense call (``torch.nn.functional.scaled_dot_product_attention``,
or float32 math where SDPA's semantics differ), :func:`varlen_fallback` a packed batch
(torch's own FlashAttention-2 varlen kernel where it applies, else one sequence at a time on
:func:`sdpa_fallback`). Both keep the kernels' semantics: bottom-right aligned causal masks,
O = 0 and LSE = -inf for rows that see no key.

Imports torch: only :mod:`fa2tune.ops.torch_op` imports this module.
"""

from __future__ import annotations

import logging

import torch

from core.variant import PLAIN, Variant
from measure.params import ALIGN_BYTES, Layout

log = logging.getLogger("fa2tune.torch")


def no_lse(q: torch.Tensor) -> torch.Tensor:
    """The empty float32 tensor returned in the LSE's place when it was not asked for."""
    return q.new_empty((0,), dtype=torch.float32)


def visible_keys(
    nq: int, nk: int, causal: bool, variant: Variant, device: torch.device | str
) -> torch.Tensor | None:
    """``[nq, nk]`` bool, True where query ``i`` sees key ``j``, or None when every key is
    seen: with ``pos = i + nk - nq``, causal keeps ``j <= pos``, a window ``pos - left <= j
    <= pos + right`` (a bound -1 is none), a chunk ``j`` in ``pos``'s chunk ``[pos - pos mod
    chunk, + chunk)`` (mod rounding down, so rows before the first key see none)."""
    if not causal and not variant.local:
        return None
    pos = torch.arange(nq, device=device).unsqueeze(1) + (nk - nq)
    j = torch.arange(nk, device=device).unsqueeze(0)
    return mask_keys(torch.ones(nq, nk, dtype=torch.bool, device=device), pos, j, causal, variant)


def mask_keys(
    seen: torch.Tensor, pos: torch.Tensor, j: torch.Tensor, causal: bool, variant: Variant
) -> torch.Tensor:
    """``seen`` with the keys ``j`` that the rows at key positions ``pos`` do not see under
    causality and the variant's window and chunk cleared (broadcasting ``pos`` against
    ``j``; in place)."""
    left, right, chunk = variant.window_left, variant.window_right, variant.chunk
    if causal:
        seen &= j <= pos
    if right >= 0:
        seen &= j <= pos + right
    if left >= 0:
        seen &= j >= pos - left
    if chunk > 0:
        start = pos - torch.remainder(pos, chunk)  # remainder rounds down, as the kernels do
        seen &= (j >= start) & (j < start + chunk)
    return seen


def sdpa_fallback(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    layout: Layout,
    return_lse: bool,
    variant: Variant = PLAIN,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The op's semantics on torch alone: SDPA, or float32 math where SDPA differs.

    The kernels' causal mask is bottom-right aligned (key ``j`` seen by query ``i`` iff
    ``j <= i + nk - nq``) and a row that sees no key gives O = 0, LSE = -inf; SDPA's
    ``is_causal`` is top-left aligned. So a causal call with ``nq != nk`` gets an explicit
    mask, and calls asking for the LSE (SDPA does not return it) or with rows that see no key
    are computed in float32 here, and so is every call with a ``variant`` (``sinks``: the
    float32 ``[Hq]`` sink logits of a variant with sinks).
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
    plain = variant.plain
    mask = None
    if not plain:
        mask = visible_keys(nq, nk, causal, variant, q.device)
    elif causal and nq != nk:
        mask = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(diagonal=nk - nq)
    if plain and not return_lse and not (causal and nq > nk):
        o = torch.nn.functional.scaled_dot_product_attention(
            qh, kh, vh, attn_mask=mask, is_causal=causal and mask is None, scale=scale
        )
        lse = no_lse(q)
    else:
        visible = mask
        if visible is None and causal:
            visible = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril()
        o, lse_full = float_attention(qh, kh, vh, scale, visible, variant, sinks)
        o = o.to(q.dtype)
        lse = lse_full.contiguous() if return_lse else no_lse(q)
    out = o if layout == "bhnd" else o.transpose(1, 2)
    return out.contiguous(), lse


def float_attention(
    qh: torch.Tensor,
    kh: torch.Tensor,
    vh: torch.Tensor,
    scale: float,
    visible: torch.Tensor | None,
    variant: Variant = PLAIN,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention in float32 on ``[B, H, N, D]`` tensors (K and V already at Q's heads):
    ``(O, LSE)``, O float32. ``visible``: True where a query sees a key (broadcast against
    ``[B, H, Nq, Nk]``), or None for all; the variant's softcap and ``sinks`` (float32
    ``[H]``) apply. A row that sees no key gets O = 0 and LSE = -inf (its sink's logit with
    sinks)."""
    s = torch.matmul(qh.float(), kh.float().transpose(-1, -2)) * scale
    if variant.softcap > 0:
        s = torch.tanh(s / variant.softcap) * variant.softcap
    if visible is not None:
        s = s.masked_fill(~visible, float("-inf"))
    if variant.sinks and sinks is not None:
        # The sink joins each row's denominator as one more logit with a zero value row.
        b, h, nq = (int(x) for x in s.shape[:3])
        sink = sinks.float().view(1, h, 1, 1).expand(b, h, nq, 1)
        lse = torch.logsumexp(torch.cat((s, sink), dim=-1), dim=-1)
    else:
        lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)  # dead rows: -inf - -inf
    return torch.matmul(p, vh.float()), lse


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
    variant: Variant = PLAIN,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The op's semantics one sequence at a time on :func:`sdpa_fallback`
    (SDPA, or float32 math for the LSE, rows that see no key and variants: each sequence's
    mask bottom-right aligned on its own lengths). Reads the offsets on the host (a sync).
    Rows no sequence covers get O = 0 and LSE = -inf; the rows of a sequence with no keys
    O = 0 and LSE = -inf, or their head's sink logit with sinks.

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
            if lse is not None and e > s and variant.sinks and sinks is not None:
                lse[:, s:e] = sinks.float().unsqueeze(1)  # only the sink in the denominator
            continue
        o_i, lse_i = sdpa_fallback(q[s:e].unsqueeze(0), k[ks:ke].unsqueeze(0),
                                   v[ks:ke].unsqueeze(0), causal, scale, "bnhd",
                                   return_lse, variant, sinks)  # fmt: skip
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
    variant: Variant = PLAIN,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The op's semantics on torch alone: ``aten._flash_attention_forward`` (torch's
    FlashAttention-2 varlen kernel, bottom-right causal as the kernels here) when it applies,
    the call is plain and no LSE is asked for (its LSE layout differs between torch
    versions), else :func:`_per_sequence` (reads the offsets on the host)."""
    if variant.plain and not return_lse and _aten_flash_applies(q, k, v):
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
    return _per_sequence(q, k, v, cu_q, cu_k, causal, scale, return_lse, variant, sinks)
