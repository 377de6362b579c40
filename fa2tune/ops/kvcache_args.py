"""The KV-cache call's argument checks and its append on torch (:mod:`fa2tune.ops.kvcache`).

What the host can check from shapes, dtypes and devices alone (:func:`check_cache_args`, on
a cache shape's first call), the debug mode's checks of what lives on the device
(:func:`check_cache_values`), the lengths argument in its accepted forms
(:func:`lengths_tensor`) and the append as torch index arithmetic (:func:`append_kv`, the
torch path's and the gathered-pages route's). Imports torch.
"""

from __future__ import annotations

import torch

_INDEX_DTYPES = (torch.int32, torch.int64)


def _index_tensor(name: str, t: torch.Tensor | None, q: torch.Tensor, dims: int) -> None:
    if t is None:
        return
    if not isinstance(t, torch.Tensor) or t.dtype not in _INDEX_DTYPES or t.dim() != dims:
        what = f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}"
        raise ValueError(f"{name} must be an int32 {dims}-d tensor, got {what}")
    if t.device != q.device:
        raise ValueError(f"{name} is on {t.device}, q on {q.device}")


def capacity_of(k_cache: torch.Tensor, page_table: torch.Tensor | None) -> int:
    """The most keys a sequence's cache holds: the cache's rows (contiguous), or the block
    table's entries per row times the page size (paged)."""
    size = int(k_cache.shape[1])
    return int(page_table.shape[1]) * size if page_table is not None else size


def check_cache_args(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    cache_seqlens: torch.Tensor,
    page_table: torch.Tensor | None,
    cache_batch_idx: torch.Tensor | None,
    cache_leftpad: torch.Tensor | None = None,
) -> tuple[int, int]:
    """``(capacity, page size)`` of a cache call (page size 0: contiguous), after refusing
    arguments no implementation takes. Reads shapes only, never the tensors' values.

    Raises:
        ValueError: the message says which argument and why.
    """
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-d tensor, got {getattr(t, 'shape', t)!r}")
    b, _, hq, d = (int(x) for x in q.shape)
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(f"v_cache {tuple(v_cache.shape)} != k_cache {tuple(k_cache.shape)}")
    rows, size, hkv, dk = (int(x) for x in k_cache.shape)
    if dk != d:
        raise ValueError(f"the caches' head dim {dk} differs from q's {d}")
    if hkv < 1 or hq % hkv:
        raise ValueError(f"q heads {hq} is not a multiple of the caches' {hkv} heads")
    if {q.dtype, k_cache.dtype, v_cache.dtype} != {q.dtype}:
        raise ValueError(f"q and the caches must share a dtype, got {q.dtype}, "
                         f"{k_cache.dtype}, {v_cache.dtype}")  # fmt: skip
    _index_tensor("cache_seqlens", cache_seqlens, q, 1)
    _index_tensor("page_table", page_table, q, 2)
    _index_tensor("cache_batch_idx", cache_batch_idx, q, 1)
    _index_tensor("cache_leftpad", cache_leftpad, q, 1)
    if cache_leftpad is not None and int(cache_leftpad.shape[0]) != b:
        raise ValueError(f"cache_leftpad has {cache_leftpad.shape[0]} entries for a batch of {b}")
    if int(cache_seqlens.shape[0]) != b:
        n = cache_seqlens.shape[0]
        raise ValueError(f"cache_seqlens has {n} entries for a batch of {b}")
    if cache_batch_idx is not None and int(cache_batch_idx.shape[0]) != b:
        raise ValueError(
            f"cache_batch_idx has {cache_batch_idx.shape[0]} entries for a batch of {b}"
        )
    if page_table is None:
        page, capacity = 0, size
        if cache_batch_idx is None and rows < b:
            raise ValueError(f"the caches hold {rows} sequences for a batch of {b}")
    else:
        page = size
        if page < 1 or page & (page - 1):
            raise ValueError(f"the page size (k_cache.shape[1] = {page}) is not a power of two")
        if page_table.dtype != torch.int32:
            raise ValueError(f"page_table must be int32, got {page_table.dtype}")
        if cache_batch_idx is None and int(page_table.shape[0]) < b:
            raise ValueError(f"page_table has {page_table.shape[0]} rows for a batch of {b}")
        capacity = int(page_table.shape[1]) * page
    if (k is None) != (v is None):
        raise ValueError("k and v are appended together: give both or neither")
    if k is not None and v is not None:
        if k.dim() != 4 or tuple(k.shape) != tuple(v.shape):
            raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must be 4-d and alike")
        kb, _, kh, kd = (int(x) for x in k.shape)
        if (kb, kh, kd) != (b, hkv, d) or k.dtype != k_cache.dtype or v.dtype != v_cache.dtype:
            raise ValueError(f"new k/v {tuple(k.shape)} {k.dtype} do not match the batch {b} and "
                             f"the caches' heads, head dim and dtype")  # fmt: skip
    if capacity < 1:
        raise ValueError("the cache holds no keys (capacity 0)")
    return capacity, page


def append_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache_seqlens: torch.Tensor,
    page_table: torch.Tensor | None,
    cache_batch_idx: torch.Tensor | None,
) -> None:
    """Write ``k``/``v`` ``[B, Nnew, Hkv, D]`` into the caches at rows
    ``cache_seqlens[b] ..+ Nnew`` of each sequence, in place and bit-exact (a copy). On the
    device only: no value is read on the host, so the append is captured with the call.
    The rows must fit the capacity (FlashAttention's rule; an index past it is a device-side
    error)."""
    b, n_new = int(k.shape[0]), int(k.shape[1])
    pos = cache_seqlens.long().view(b, 1) + torch.arange(n_new, device=k.device).view(1, n_new)
    rows = (cache_batch_idx.long() if cache_batch_idx is not None
            else torch.arange(b, device=k.device)).view(b, 1)  # fmt: skip
    if page_table is None:
        k_cache.index_put_((rows, pos), k)
        v_cache.index_put_((rows, pos), v)
        return
    size = int(k_cache.shape[1])
    pages = page_table.long()[rows.view(b)].gather(1, torch.div(pos, size, rounding_mode="floor"))
    slot = torch.remainder(pos, size)
    k_cache.index_put_((pages, slot), k)
    v_cache.index_put_((pages, slot), v)


def lengths_tensor(
    cache_seqlens: torch.Tensor | int | None,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    k: torch.Tensor | None,
    page_table: torch.Tensor | None,
) -> torch.Tensor:
    """``cache_seqlens`` as the op takes it: a tensor as given, an int (every sequence's
    length, checked here: it is on the host) as an int32 ``[B]`` tensor on q's device, None
    (FlashAttention's "the whole cache") as the capacity.

    Raises:
        ValueError: an int length below 0 or leaving no room for the new rows; None with new
            rows to append (where they go would be a guess).
    """
    if isinstance(cache_seqlens, torch.Tensor):
        return cache_seqlens
    if cache_seqlens is None and k is not None:
        raise ValueError("appending k/v needs cache_seqlens: the keys each sequence holds "
                         "before the new rows, where they are written")  # fmt: skip
    capacity = capacity_of(k_cache, page_table)
    room = capacity - (int(k.shape[1]) if k is not None else 0)
    n = room if cache_seqlens is None else int(cache_seqlens)
    if not 0 <= n <= room:
        raise ValueError(f"cache_seqlens {n} is outside [0, {room}] (a capacity of {capacity} "
                         "keys, less the new rows)")  # fmt: skip
    return torch.full((int(q.shape[0]),), n, dtype=torch.int32, device=q.device)


def _first_bad(bad: torch.Tensor) -> int | None:
    """The first flat index where ``bad`` holds, or None (a host sync)."""
    where = torch.nonzero(bad.flatten())
    return int(where[0, 0]) if where.numel() else None


def check_cache_values(
    k_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    page_table: torch.Tensor | None,
    cache_batch_idx: torch.Tensor | None,
    added: int,
    capacity: int,
    page: int,
    cache_leftpad: torch.Tensor | None = None,
) -> None:
    """The debug mode's checks of what lives on the device (``FA2TUNE_CHECK_KVCACHE``): every
    length in ``[0, capacity - added]``, every left padding in ``[0, length]``, every batch
    index a row of the caches (or of the block table), and every block-table entry a
    sequence reaches (its first ``ceil((length + added) / page)``) a page of the caches.
    Reads the values on the host.

    Raises:
        ValueError: naming the first bad entry and the bound it breaks.
    """
    lens = cache_seqlens.long()
    room = capacity - added
    i = _first_bad((lens < 0) | (lens > room))
    if i is not None:
        raise ValueError(f"cache_seqlens[{i}] = {int(lens[i])} is outside [0, {room}] (a "
                         f"capacity of {capacity} keys, {added} new rows this call)")  # fmt: skip
    if cache_leftpad is not None:
        pad = cache_leftpad.long()
        i = _first_bad((pad < 0) | (pad > lens))
        if i is not None:
            raise ValueError(f"cache_leftpad[{i}] = {int(pad[i])} is outside [0, {int(lens[i])}]"
                             " (its sequence's cached length)")  # fmt: skip
    rows = int(page_table.shape[0]) if page_table is not None else int(k_cache.shape[0])
    index = torch.arange(lens.shape[0], device=lens.device)
    if cache_batch_idx is not None:
        index = cache_batch_idx.long()
        i = _first_bad((index < 0) | (index >= rows))
        if i is not None:
            what = "block-table rows" if page_table is not None else "cache rows"
            raise ValueError(f"cache_batch_idx[{i}] = {int(index[i])} is outside [0, {rows}) "
                             f"({rows} {what})")  # fmt: skip
    if page_table is None:
        return
    pages = int(k_cache.shape[0])
    table = page_table.long()[index]  # [batch, max_pages]: each batch row's own table row
    used = -(-(lens + added) // page)  # pages each sequence reaches
    reached = torch.arange(table.shape[1], device=table.device).view(1, -1) < used.view(-1, 1)
    flat = _first_bad(reached & ((table < 0) | (table >= pages)))
    if flat is not None:
        b, j = divmod(flat, int(table.shape[1]))
        raise ValueError(f"page_table[{int(index[b])}, {j}] = {int(table[b, j])} (batch row "
                         f"{b}'s page {j}) is outside [0, {pages}) ({pages} pages in the "
                         "caches)")  # fmt: skip


__all__ = ["append_kv", "check_cache_args", "check_cache_values", "lengths_tensor"]
