"""Packed queries and packed new keys over a KV cache (FlashAttention's ``cu_seqlens_q`` and
``cu_seqlens_k_new`` in ``flash_attn_with_kvcache``), on the dense cache path.

Sequence ``b`` has ``nq_b = cu_seqlens_q[b + 1] - cu_seqlens_q[b]`` queries, packed
``[total_q, Hq, D]``, each attending bottom-right aligned at the sequence's length (query
``i`` at key position ``i + L_b - nq_b``). The dense cache kernels take ``[B, Nq, Hq, D]``
queries aligned the same way at ``Nq``: a sequence's queries placed in the *last* ``nq_b``
rows of a ``max_seqlen_q``-row block sit at exactly their packed positions (row
``max_seqlen_q - nq_b + i`` has position ``i + L_b - nq_b``), so the packed call is the dense
call on right-aligned padding, its padding rows computed and dropped. Packed new keys
(``[total_new, Hkv, D]``) are appended per sequence at its cached length and the lengths the
attention reads become ``cache_seqlens + new_b``.

Everything here is index arithmetic on the device (no ``.item()``), so a packed call is
captured in a CUDA graph as a dense one is, and traced by ``torch.compile(fullgraph=True)``
(the attention then goes through the ``fa2tune::attention_with_kvcache`` op). The padding
costs the rows it adds: a batch of very uneven query counts pays for ``B * max_seqlen_q``
rows.
"""

from __future__ import annotations

import torch

from core.settings import get_settings
from fa2tune.ops.choice import Unsupported
from fa2tune.ops.kernels import capturing
from fa2tune.ops.kvcache import cache_refusal, run_with_kvcache
from fa2tune.ops.kvcache_args import (
    capacity_of,
    check_cache_args,
    check_cache_values,
    lengths_tensor,
)
from fa2tune.ops.varlen_used import sequence_of


def _checking(q: torch.Tensor) -> bool:
    """The debug mode is on and the values may be read (not during a capture or a trace)."""
    if torch.compiler.is_compiling() or not get_settings().check_kvcache:  # settings: untraceable
        return False
    return not (q.is_cuda and capturing())


def padded_rows(cu_seqlens_q: torch.Tensor, max_seqlen_q: int, total: int) -> torch.Tensor:
    """For each packed query row: its row in the flattened ``[B * max_seqlen_q]`` padded
    block, right-aligned (sequence ``b``'s rows end at row ``(b + 1) * max_seqlen_q``)."""
    cu = cu_seqlens_q.long()
    seq, offset = sequence_of(cu, total)
    count = cu[1:] - cu[:-1]
    return seq * max_seqlen_q + (max_seqlen_q - count[seq]) + offset


def pad_queries(q: torch.Tensor, rows: torch.Tensor, batch: int, max_seqlen_q: int) -> torch.Tensor:
    """Packed ``q`` ``[total_q, Hq, D]`` as ``[B, max_seqlen_q, Hq, D]`` (zeros in the padding
    rows, which the call computes and :func:`unpad` drops)."""
    hq, d = int(q.shape[1]), int(q.shape[2])
    dense = q.new_zeros((batch * max_seqlen_q, hq, d))
    dense.index_copy_(0, rows, q)
    return dense.view(batch, max_seqlen_q, hq, d)


def unpad(
    o: torch.Tensor, lse: torch.Tensor | None, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The dense call's ``o`` ``[B, max_seqlen_q, Hq, D]`` and LSE ``[B, Hq, max_seqlen_q]``
    back to the packed rows: ``o`` ``[total_q, Hq, D]``, LSE ``[Hq, total_q]`` (FlashAttention's
    varlen layout)."""
    b, nq, hq, d = (int(x) for x in o.shape)
    packed = o.reshape(b * nq, hq, d).index_select(0, rows)
    if lse is None:
        return packed, None
    return packed, lse.permute(1, 0, 2).reshape(hq, b * nq).index_select(1, rows)


def append_packed(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_k_new: torch.Tensor,
    cache_seqlens: torch.Tensor,
    page_table: torch.Tensor | None,
    cache_batch_idx: torch.Tensor | None,
) -> torch.Tensor:
    """Write packed ``k``/``v`` ``[total_new, Hkv, D]`` into the caches, sequence ``b``'s rows
    at ``cache_seqlens[b] ..+ new_b`` (in place, bit-exact), and return the lengths after it,
    ``cache_seqlens + new_b`` (int32). The rows must fit the capacity, as for dense appends."""
    seq, offset = sequence_of(cu_seqlens_k_new, int(k.shape[0]))
    pos = cache_seqlens.long()[seq] + offset
    rows = cache_batch_idx.long()[seq] if cache_batch_idx is not None else seq
    if page_table is None:
        k_cache.index_put_((rows, pos), k)
        v_cache.index_put_((rows, pos), v)
    else:
        size = int(k_cache.shape[1])
        pages = page_table.long()[rows, torch.div(pos, size, rounding_mode="floor")]
        slot = torch.remainder(pos, size)
        k_cache.index_put_((pages, slot), k)
        v_cache.index_put_((pages, slot), v)
    cu = cu_seqlens_k_new.long()
    return (cache_seqlens.long() + (cu[1:] - cu[:-1])).to(torch.int32)


def check_packed(
    name: str, cu_seqlens: torch.Tensor, rows: torch.Tensor, batch: int, device: torch.device
) -> None:
    """Shape checks of a packed argument and its offsets (values stay on the device).

    Raises:
        ValueError: naming the argument.
    """
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1:
        raise ValueError(f"cu_seqlens for {name} must be a 1-d int32 tensor")
    if cu_seqlens.dtype != torch.int32:
        raise ValueError(f"cu_seqlens for {name} must be int32, got {cu_seqlens.dtype}")
    if int(cu_seqlens.shape[0]) != batch + 1:
        raise ValueError(f"cu_seqlens for {name} has {cu_seqlens.shape[0]} entries for a batch "
                         f"of {batch} (batch + 1 offsets)")  # fmt: skip
    if cu_seqlens.device != device:
        raise ValueError(f"cu_seqlens for {name} is on {cu_seqlens.device}, q on {device}")
    if rows.dim() != 3:
        raise ValueError(f"packed {name} must be [total, heads, head dim], got "
                         f"{tuple(rows.shape)}")  # fmt: skip


def check_packed_values(name: str, cu: torch.Tensor, total: int, longest: int | None) -> None:
    """The debug mode's check of packed offsets (``FA2TUNE_CHECK_KVCACHE``; reads them on the
    host): ``cu[0] == 0``, never decreasing, ``cu[-1]`` the packed rows, and with ``longest``
    no sequence longer than it.

    Raises:
        ValueError: naming the first bad entry.
    """
    c = cu.long().cpu()
    counts = c[1:] - c[:-1]
    if int(c[0]) != 0 or int(c[-1]) != total:
        raise ValueError(f"cu_seqlens for {name} runs from {int(c[0])} to {int(c[-1])}, not from "
                         f"0 to its {total} packed rows")  # fmt: skip
    bad = torch.nonzero((counts < 0) | (counts > (longest if longest is not None else total)))
    if bad.numel():
        b = int(bad[0, 0])
        raise ValueError(f"sequence {b} of {name} has {int(counts[b])} rows (cu_seqlens "
                         f"{int(c[b])} -> {int(c[b + 1])}; at most "
                         f"{longest if longest is not None else total})")  # fmt: skip


def _check_packed_append(
    k_cache: torch.Tensor,
    k: torch.Tensor,
    cu_seqlens_k_new: torch.Tensor,
    lens: torch.Tensor,
    page_table: torch.Tensor | None,
    cache_batch_idx: torch.Tensor | None,
) -> None:
    """The debug mode's checks before a packed append: the new keys' offsets, every sequence's
    new rows within its capacity, and the cache rows and pages they reach."""
    check_packed_values("k", cu_seqlens_k_new, int(k.shape[0]), None)
    page = int(k_cache.shape[1]) if page_table is not None else 0
    capacity = capacity_of(k_cache, page_table)
    cu = cu_seqlens_k_new.long()
    after = lens.long() + (cu[1:] - cu[:-1])
    over = torch.nonzero(after > capacity)
    if over.numel():
        b = int(over[0, 0])
        raise ValueError(f"sequence {b}'s {int(after[b] - lens[b])} new rows past its "
                         f"{int(lens[b])} cached keys overflow the capacity of "
                         f"{capacity}")  # fmt: skip
    check_cache_values(k_cache, after.to(torch.int32), page_table, cache_batch_idx, 0, capacity,
                       page or 1)  # fmt: skip


def run_packed_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    cache_seqlens: torch.Tensor | int | None,
    page_table: torch.Tensor | None,
    cache_batch_idx: torch.Tensor | None,
    cache_leftpad: torch.Tensor | None,
    cu_seqlens_q: torch.Tensor | None,
    max_seqlen_q: int | None,
    cu_seqlens_k_new: torch.Tensor | None,
    causal: bool,
    scale: float,
    window: tuple[int, int],
    chunk: int,
    softcap: float,
    sinks: torch.Tensor | None,
    return_lse: bool,
    fallback: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`fa2tune.ops.kvcache.run_with_kvcache` with packed queries (``cu_seqlens_q``,
    ``max_seqlen_q``: ``q`` ``[total_q, Hq, D]``, O ``[total_q, Hq, D]``, LSE ``[Hq, total_q]``)
    and/or packed new keys (``cu_seqlens_k_new``: ``k``/``v`` ``[total_new, Hkv, D]``); either
    None leaves that side dense. Every argument is checked before the caches are written;
    with ``Settings.check_kvcache`` the offsets' values too, and that each sequence's new rows
    fit its cache.

    Raises:
        ValueError: bad arguments (also those of the dense call).
        Unsupported: as the dense call, without ``fallback``.
    """
    dense_q = q
    rows = None
    if cu_seqlens_q is not None:
        if max_seqlen_q is None or int(max_seqlen_q) < 1:
            raise ValueError("packed queries (cu_seqlens_q) need max_seqlen_q >= 1, the longest "
                             "sequence's query count")  # fmt: skip
        batch = int(cu_seqlens_q.shape[0]) - 1 if cu_seqlens_q.dim() == 1 else -1
        check_packed("q", cu_seqlens_q, q, batch, q.device)
        if _checking(q):
            check_packed_values("q", cu_seqlens_q, int(q.shape[0]), int(max_seqlen_q))
        rows = padded_rows(cu_seqlens_q, int(max_seqlen_q), int(q.shape[0]))
        dense_q = pad_queries(q, rows, batch, int(max_seqlen_q))
    if cu_seqlens_k_new is None:
        lens = lengths_tensor(cache_seqlens, dense_q, k_cache, k, page_table)
    else:
        if k is None or v is None:
            raise ValueError("cu_seqlens_k_new packs the new keys: give k and v")
        if cache_seqlens is None:
            raise ValueError("appending k/v needs cache_seqlens: the keys each sequence holds "
                             "before the new rows, where they are written")  # fmt: skip
        batch = int(dense_q.shape[0])
        check_packed("k", cu_seqlens_k_new, k, batch, q.device)
        check_packed("v", cu_seqlens_k_new, v, batch, q.device)
        lens = lengths_tensor(cache_seqlens, dense_q, k_cache, None, page_table)
        # The new rows' heads, head dim and dtype checked as one dense append of all of them,
        # and the call's refusal known, before anything is written.
        check_cache_args(dense_q, k_cache, v_cache, k.unsqueeze(0).expand(batch, -1, -1, -1),
                         v.unsqueeze(0).expand(batch, -1, -1, -1), lens, page_table,
                         cache_batch_idx, cache_leftpad)  # fmt: skip
        if _checking(q):
            _check_packed_append(k_cache, k, cu_seqlens_k_new, lens, page_table, cache_batch_idx)
        if not fallback and not torch.compiler.is_compiling():  # traced: the op decides later
            reason = cache_refusal(dense_q, k_cache, v_cache, lens, page_table, cache_batch_idx,
                                   cache_leftpad, causal, window, chunk, softcap,
                                   sinks)  # fmt: skip
            if reason is not None:
                raise Unsupported(reason)
        lens = append_packed(k_cache, v_cache, k, v, cu_seqlens_k_new, lens, page_table,
                             cache_batch_idx)  # fmt: skip
        k = v = None
    if torch.compiler.is_compiling() or type(q) is not torch.Tensor:
        o, traced_lse = torch.ops.fa2tune.attention_with_kvcache(
            dense_q, k_cache, v_cache, k, v, lens, page_table, cache_batch_idx, cache_leftpad,
            causal, float(scale), window[0], window[1], chunk, float(softcap), sinks, return_lse,
            fallback,
        )  # fmt: skip
        lse: torch.Tensor | None = traced_lse if return_lse else None
    else:
        o, lse = run_with_kvcache(dense_q, k_cache, v_cache, k, v, lens, page_table,
                                  cache_batch_idx, cache_leftpad, causal, scale, window, chunk,
                                  softcap, sinks, return_lse, fallback)  # fmt: skip
    if rows is None:
        return o, lse
    return unpad(o, lse, rows)


__all__ = [
    "append_packed",
    "check_packed",
    "pad_queries",
    "padded_rows",
    "run_packed_with_kvcache",
    "unpad",
]
