"""A KV-cache call's semantics on torch alone (the op's fallback, and the tests' reference).

What :func:`fa2tune.ops.kvcache.attention_with_kvcache` computes, spelled with torch ops that
read nothing on the host (no ``.item()``, no ``.tolist()``), so the fallback too can be
captured in a CUDA graph: each sequence's keys are gathered from the cache (its cache row,
or its pages through the block table), keys at or past its length are masked, and the mask
is bottom-right aligned at that length (query ``i`` of ``nq`` has key position
``i + len - nq``), the variants' window and chunk applied on those positions; the math is
:func:`fa2tune.ops.fallback.float_attention`'s (float32, softcap, sinks).

Imports torch: only :mod:`fa2tune.ops.kvcache` and the tests import this module.
"""

from __future__ import annotations

import torch

from core.variant import PLAIN, Variant
from fa2tune.ops.fallback import float_attention, mask_keys


def gathered_cache(
    cache: torch.Tensor,
    batch: int,
    page_table: torch.Tensor | None,
    cache_batch_idx: torch.Tensor | None,
) -> torch.Tensor:
    """The cache as ``[batch, capacity, Hkv, D]``: batch row ``b``'s cache row
    (``cache_batch_idx[b]``, or ``b``), or its pages in block-table order (the table's row
    ``cache_batch_idx[b]``, or ``b``) laid end to end. A copy, except for a contiguous cache
    without a row map (then the first ``batch`` rows).

    Entries past a sequence's last page may hold anything (a serving engine leaves unused ones
    as they were; the kernels never read them): each is clamped to a page of the cache before
    the gather, and the keys it brings are past the sequence's length, so masked."""
    if page_table is None:
        return cache[cache_batch_idx.long()] if cache_batch_idx is not None else cache[:batch]
    table = page_table[cache_batch_idx.long()] if cache_batch_idx is not None else page_table
    index = table[:batch].long().clamp(0, int(cache.shape[0]) - 1)
    pages = cache[index]  # [B, max_pages, page size, Hkv, D]
    b, n_pages, size = (int(x) for x in pages.shape[:3])
    return pages.reshape(b, n_pages * size, *pages.shape[3:])


def sequence_lengths(cache_seqlens: torch.Tensor, added: int, capacity: int) -> torch.Tensor:
    """Each sequence's key count after this call's append: ``cache_seqlens + added``,
    clamped to ``[0, capacity]`` as the kernels clamp it (int64, on the lengths' device)."""
    return (cache_seqlens.long() + added).clamp(0, capacity)


def cache_visible(
    nq: int,
    capacity: int,
    lengths: torch.Tensor,
    causal: bool,
    variant: Variant = PLAIN,
    leftpad: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[B, 1, nq, capacity]`` bool: True where query ``i`` of sequence ``b`` sees key ``j``
    (``j < lengths[b]``, then causality, window and chunk at key position
    ``i + lengths[b] - nq``). With ``leftpad`` (a left-padded cache) sequence ``b``'s keys
    start at ``leftpad[b]`` (clamped to ``[0, lengths[b]]``, as the kernels clamp it): keys
    before it are not seen, and positions count from it (``lengths[b] - leftpad[b]`` keys)."""
    device = lengths.device
    length = lengths.view(-1, 1, 1)
    j = torch.arange(capacity, device=device).view(1, 1, capacity)
    if leftpad is None:
        first: torch.Tensor | int = 0
    else:
        first = torch.minimum(leftpad.long().view(-1, 1, 1).clamp(min=0), length)
    rel = j - first  # key positions counted from the sequence's first key
    pos = torch.arange(nq, device=device).view(1, nq, 1) + (length - first - nq)
    seen = ((j < length) & (rel >= 0)).expand(-1, nq, -1).clone()
    return mask_keys(seen, pos, rel, causal, variant).unsqueeze(1)


def kvcache_fallback(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    lengths: torch.Tensor,
    *,
    page_table: torch.Tensor | None,
    cache_batch_idx: torch.Tensor | None,
    causal: bool,
    scale: float,
    variant: Variant = PLAIN,
    sinks: torch.Tensor | None = None,
    leftpad: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(O, LSE)`` of a KV-cache call in float32 maths: O ``[B, Nq, Hq, D]`` in q's dtype,
    LSE ``[B, Hq, Nq]`` float32 (``lengths``: :func:`sequence_lengths`; ``leftpad``: each
    sequence's first key, :func:`cache_visible`). Rows that see no key get O = 0 and LSE =
    -inf (their head's sink logit with sinks)."""
    b, nq, hq, _ = (int(x) for x in q.shape)
    k = gathered_cache(k_cache, b, page_table, cache_batch_idx)
    v = gathered_cache(v_cache, b, page_table, cache_batch_idx)
    capacity, hkv = int(k.shape[1]), int(k.shape[2])
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if hq != hkv:
        kh, vh = kh.repeat_interleave(hq // hkv, dim=1), vh.repeat_interleave(hq // hkv, dim=1)
    visible = cache_visible(nq, capacity, lengths, causal, variant, leftpad)
    o, lse = float_attention(qh, kh, vh, scale, visible, variant, sinks)
    return o.to(q.dtype).transpose(1, 2).contiguous(), lse.contiguous()
