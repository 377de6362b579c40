"""``torch.ops.fa2tune.attention_with_kvcache``: attention over a KV cache whose lengths live
on the device, with an optional in-place append, paged or contiguous.

A serving engine keeps K/V in a cache (``[rows, capacity, Hkv, D]``, or pages
``[pages, page size, Hkv, D]`` reached through an int32 block table ``[B, max_pages]``) and
each sequence's length in an int32 tensor on the GPU. A call here

1. appends ``k``/``v`` (``[B, Nnew, Hkv, D]``) at each sequence's length, in place
   (:func:`append_kv`: index arithmetic and one ``index_put_`` per cache, on the device, no
   host read), then
2. attends ``q`` (``[B, Nq, Hq, D]``) to each sequence's ``cache_seqlens[b] + Nnew`` keys,
   causal masks and windows bottom-right aligned at that length (FlashAttention's
   ``flash_attn_with_kvcache`` semantics), on the split-KV family's cache kernels, a
   chunked prefill on an H100/H200 on the Hopper family's (``Settings.fa3_cache``, on by
   default; :mod:`fa2tune.ops.cache_choice`).

Nothing on the per-call path depends on the lengths' values: the decision is keyed by the
shapes (capacity, page size, batch, heads, head dim, new rows), dtype, mask and variant, made
once (config choice, build, load) and kept; a call checks shapes, patches pointers and
launches. So one CUDA graph captured around a call replays every decode step as the lengths
grow, and ``torch.compile(fullgraph=True)`` traces the op as one node (it is a
``torch.library`` custom op that mutates the caches).

Where the kernels cannot serve (no GPU, no cuda-bindings or nvcc, another dtype), the call
runs on :mod:`fa2tune.ops.kvcache_fallback` (torch ops, the same semantics, also free of host
reads) with a warning once per reason, or raises with ``fallback=False``.

Imports torch: :mod:`fa2tune.torch` imports this module.
"""

from __future__ import annotations

import logging
import math
import threading
import warnings
from typing import NamedTuple

import torch

from core.settings import get_settings
from core.shape import Shape, effective_causal
from core.variant import Variant
from fa2tune.ops import autotune
from fa2tune.ops.cache_choice import cache_choice
from fa2tune.ops.choice import (
    DTYPE_NAMES,
    Call,
    FallbackWarning,
    Unsupported,
    normalize_call,
    open_store,
)
from fa2tune.ops.fallback import no_lse
from fa2tune.ops.kernels import (
    capturing,
    device_info,
    load_kernel,
)
from fa2tune.ops.kvcache_args import (
    append_kv,
    capacity_of,
    check_cache_args,
    check_cache_values,
    lengths_tensor,
)
from fa2tune.ops.kvcache_fallback import gathered_cache, kvcache_fallback, sequence_lengths
from fa2tune.ops.kvcache_launch import CacheLauncher
from fa2tune.ops.torch_op import NO_WINDOW, check_sinks, current_device_index, window_pair
from measure.loader import CudaError

log = logging.getLogger("fa2tune.torch")

_FALLBACK = "fa2tune.torch: attention_with_kvcache running on torch instead of a kernel: "
#: Most cached decisions (a serving process has a few cache shapes per model).
MAX_DECISIONS = 1024
_decisions: dict[tuple[object, ...], _Decision] = {}
_lock = threading.Lock()
_warned: set[str] = set()


def _decide(
    q: torch.Tensor, capacity: int, page: int, causal: bool, variant: Variant,
    table_stride: int, added: int, kv_heads: int, table_gaps: bool,
) -> CacheLauncher | str:  # fmt: skip
    """The launcher of a cache decision, or why it falls back (its key's first call)."""
    if q.device.type != "cuda":
        return f"tensors on {q.device.type}, not a CUDA device"
    name = str(q.dtype).removeprefix("torch.")
    if name not in DTYPE_NAMES:
        return f"dtype {name} (the kernels take float16 and bfloat16)"
    b, nq, hq, d = (int(x) for x in q.shape)
    device = device_info(q.device.index if q.device.index is not None else 0)
    shape = Shape(nq, capacity, b, hq, kv_heads)
    call = Call(device.index, device.name, device.sm_count, device.compute_capability, shape,
                DTYPE_NAMES[name], causal, d, variant=variant)  # fmt: skip
    try:
        off = autotune.current().mode == "off"
        choice = cache_choice(None if off else open_store(), call, page,
                              hopper=get_settings().fa3_cache)  # fmt: skip
        kernel = load_kernel(choice.config, device)
        with torch.cuda.device(device.index):
            launcher = CacheLauncher(kernel, choice.config, choice.source, shape, variant,
                                     table_stride, added, page, table_gaps)  # fmt: skip
    except Unsupported as exc:
        return exc.reason
    except CudaError as exc:  # the append kernel did not load
        return f"loading {choice.config.name}_append failed: {exc}"
    if get_settings().print_choice:
        log.warning("fa2tune.torch: kvcache %s", call.describe(choice.describe(shape), "bnhd"))
    return launcher


class _Decision(NamedTuple):
    """A cache key's decision: the launcher (or why the call falls back), what the key's
    shapes and arguments told once (the capacity, page size, mask and variant), and whether
    its calls check the index values first (``Settings.check_kvcache``, read here once)."""

    entry: CacheLauncher | str
    capacity: int
    page: int
    causal: bool
    variant: Variant
    added: int
    check: bool = False


def _spec(t: torch.Tensor | None) -> tuple[object, ...] | None:
    """What a decision key holds of a tensor argument: shape, dtype, device (its index: -1
    for the CPU; cheaper to get than ``t.device``)."""
    return None if t is None else (t.shape, t.dtype, t.get_device())


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, FallbackWarning, stacklevel=4)


def run_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    cache_seqlens: torch.Tensor,
    page_table: torch.Tensor | None,
    cache_batch_idx: torch.Tensor | None,
    cache_leftpad: torch.Tensor | None,
    causal: bool,
    scale: float,
    window: tuple[int, int],
    chunk: int,
    softcap: float,
    sinks: torch.Tensor | None,
    return_lse: bool,
    fallback: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The op's body and the eager path: append, then attend (see the module docstring);
    ``(o, lse)``, ``lse`` None when not asked for (an eager call allocates nothing for it).

    The key holds every tensor argument's shape, dtype and device and the scalar arguments,
    so what the checks and the decision found is known for every later call of the key: a
    call then checks strides and alignment (in the launcher) and launches.

    Raises:
        ValueError: bad arguments (:func:`check_cache_args`, a variant argument, sinks).
        Unsupported: the kernels cannot serve the call and ``fallback`` is False.
    """
    if page_table is not None and cache_leftpad is not None:
        return _padded_pages(q, k_cache, v_cache, k, v, cache_seqlens, page_table,
                             cache_batch_idx, cache_leftpad, causal, scale, window, chunk,
                             softcap, sinks, return_lse, fallback)  # fmt: skip
    index = q.get_device()
    decision = _decision_for(q, k_cache, v_cache, k, v, cache_seqlens, page_table,
                             cache_batch_idx, cache_leftpad, causal, window, chunk, softcap,
                             sinks)  # fmt: skip
    if decision.check and not (q.is_cuda and capturing()):  # values: a capture cannot sync
        check_cache_values(k_cache, cache_seqlens, page_table, cache_batch_idx, decision.added,
                           decision.capacity, decision.page or 1, cache_leftpad)  # fmt: skip
    if sinks is not None and (sinks.dtype != torch.float32 or not sinks.is_contiguous()):
        sinks = sinks.float().contiguous()
    entry = decision.entry
    if not isinstance(entry, str) and torch.is_grad_enabled() and q.requires_grad:
        entry = "gradients are recorded (the kernels are forward-only)"
    if not isinstance(entry, str):
        o = torch.empty_like(q) if q.is_contiguous() else q.new_empty(q.shape)
        lse = None
        if return_lse:
            b, nq, hq, _ = q.shape
            lse = q.new_empty((b, hq, nq), dtype=torch.float32)
        try:
            if index == current_device_index():
                entry(q, k_cache, v_cache, k, v, o, lse, scale, cache_seqlens, page_table,
                      cache_batch_idx, cache_leftpad, sinks, index)  # fmt: skip
            else:  # the kernels live in that device's context
                with torch.cuda.device(index):
                    entry(q, k_cache, v_cache, k, v, o, lse, scale, cache_seqlens, page_table,
                          cache_batch_idx, cache_leftpad, sinks, index)  # fmt: skip
            return o, lse
        except ValueError as exc:
            entry = f"tensor layout the kernels do not take ({exc})"
    if not fallback:
        raise Unsupported(entry)
    _warn_once(_FALLBACK + entry)
    if k is not None and v is not None:
        append_kv(k_cache, v_cache, k, v, cache_seqlens, page_table, cache_batch_idx)
    lengths = sequence_lengths(cache_seqlens, decision.added, decision.capacity)
    o, lse = kvcache_fallback(q, k_cache, v_cache, lengths, page_table=page_table,
                              cache_batch_idx=cache_batch_idx, causal=decision.causal,
                              scale=scale, variant=decision.variant, sinks=sinks,
                              leftpad=cache_leftpad)  # fmt: skip
    return o, (lse if return_lse else None)


def cache_refusal(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    page_table: torch.Tensor | None,
    cache_batch_idx: torch.Tensor | None,
    cache_leftpad: torch.Tensor | None,
    causal: bool,
    window: tuple[int, int],
    chunk: int,
    softcap: float,
    sinks: torch.Tensor | None,
) -> str | None:
    """Why the kernels would not serve this cache call without new rows (its key's decision,
    made now when it is new), or None: a caller that writes the caches itself first asks
    this, so a refused call leaves them as they were.

    Raises:
        ValueError: bad arguments, as :func:`run_with_kvcache`.
    """
    if page_table is not None and cache_leftpad is not None:  # as _padded_pages decides
        k_cache, v_cache = _contiguous_views(k_cache, v_cache, int(q.shape[0]), page_table)
        page_table = cache_batch_idx = None
    entry = _decision_for(q, k_cache, v_cache, None, None, cache_seqlens, page_table,
                          cache_batch_idx, cache_leftpad, causal, window, chunk, softcap,
                          sinks).entry  # fmt: skip
    return entry if isinstance(entry, str) else None


def _contiguous_views(
    k_cache: torch.Tensor, v_cache: torch.Tensor, batch: int, page_table: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tensors of the shape, dtype and device a gathered copy of a paged cache has
    (``[B, capacity, Hkv, D]``), without the copy: what a decision reads of them."""
    shape = (batch, capacity_of(k_cache, page_table), int(k_cache.shape[2]), int(k_cache.shape[3]))
    return k_cache.new_empty(()).expand(shape), v_cache.new_empty(()).expand(shape)


def _padded_pages(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    cache_seqlens: torch.Tensor,
    page_table: torch.Tensor,
    cache_batch_idx: torch.Tensor | None,
    cache_leftpad: torch.Tensor,
    causal: bool,
    scale: float,
    window: tuple[int, int],
    chunk: int,
    softcap: float,
    sinks: torch.Tensor | None,
    return_lse: bool,
    fallback: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Left padding over a paged cache: the paged kernels take none (a sequence's first key
    need not start a page), so after the append the sequences' pages are gathered into a
    contiguous copy (one pass over the caches' pages, on the device) that the contiguous
    kernels read with the padding. Every check, and the refusal without ``fallback``, comes
    before the caches are written."""
    b = int(q.shape[0])
    check_cache_args(q, k_cache, v_cache, k, v, cache_seqlens, page_table, cache_batch_idx,
                     cache_leftpad)  # fmt: skip
    added = int(k.shape[1]) if k is not None else 0
    lengths = cache_seqlens if not added else (cache_seqlens + added).to(torch.int32)
    kd, vd = _contiguous_views(k_cache, v_cache, b, page_table)
    entry = _decision_for(q, kd, vd, None, None, lengths, None, None, cache_leftpad, causal,
                          window, chunk, softcap, sinks).entry  # fmt: skip
    if isinstance(entry, str) and not fallback:
        raise Unsupported(entry)
    if get_settings().check_kvcache and not (q.is_cuda and capturing()):
        check_cache_values(k_cache, cache_seqlens, page_table, cache_batch_idx, added,
                           capacity_of(k_cache, page_table), int(k_cache.shape[1]),
                           cache_leftpad)  # fmt: skip
    if k is not None and v is not None:
        append_kv(k_cache, v_cache, k, v, cache_seqlens, page_table, cache_batch_idx)
    kd = gathered_cache(k_cache, b, page_table, cache_batch_idx)
    vd = gathered_cache(v_cache, b, page_table, cache_batch_idx)
    return run_with_kvcache(
        q,
        kd,
        vd,
        None,
        None,
        lengths,
        None,
        None,
        cache_leftpad,
        causal,
        scale,
        window,
        chunk,
        softcap,
        sinks,
        return_lse,
        fallback,
    )


def _decision_for(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    cache_seqlens: torch.Tensor,
    page_table: torch.Tensor | None,
    cache_batch_idx: torch.Tensor | None,
    cache_leftpad: torch.Tensor | None,
    causal: bool,
    window: tuple[int, int],
    chunk: int,
    softcap: float,
    sinks: torch.Tensor | None,
) -> _Decision:
    """The call's key's decision, made on its first call.

    The key holds every tensor argument's shape, dtype and device and the scalar arguments,
    so what the checks and the decision found is known for every later call of the key."""
    # Flat, and the devices as indices: this is most of a steady call's host work.
    index = q.get_device()
    key: tuple[object, ...] = (
        q.shape, q.dtype, index, k_cache.shape, k_cache.dtype, k_cache.get_device(),
        v_cache.shape, v_cache.dtype, v_cache.get_device(), cache_seqlens.shape,
        cache_seqlens.dtype, cache_seqlens.get_device(), causal, window, chunk, softcap,
    )  # fmt: skip
    if k is not None or v is not None:
        key += ("new", _spec(k), _spec(v))
    if page_table is not None:  # _spec inline: a paged decode step passes one every call
        key += ("paged", page_table.shape, page_table.dtype, page_table.get_device(),
                page_table.stride())  # fmt: skip
    if cache_batch_idx is not None or sinks is not None or cache_leftpad is not None:
        key += ("mapped", _spec(cache_batch_idx), _spec(sinks), _spec(cache_leftpad))
    decision = _decisions.get(key)
    if decision is not None:
        return decision
    with _lock:
        found = _decisions.get(key)
        if found is not None:
            return found
        # The key's first call: the argument checks that depend on shapes alone, the variant
        # normalised, the decision (raises ValueError on bad arguments).
        capacity, page = check_cache_args(q, k_cache, v_cache, k, v, cache_seqlens, page_table,
                                          cache_batch_idx, cache_leftpad)  # fmt: skip
        nq, hq = int(q.shape[1]), int(q.shape[2])
        if sinks is not None:
            check_sinks(sinks, q, hq)
        # Lengths are not known on the host: normalised as a packed batch's variant is (on the
        # longest length, here the capacity: a bound past every key a sequence can have is none,
        # and a chunk stays, since a sequence may have fewer keys than queries).
        causal, variant = normalize_call(causal, window[0], window[1], chunk, float(softcap),
                                         sinks is not None, nq, capacity, True)  # fmt: skip
        if variant.plain:
            causal = effective_causal(causal, nq)  # one query row sees every key either way
        added = int(k.shape[1]) if k is not None else 0
        # A block table whose rows have gaps is copied contiguous per call: its rows are then
        # max_pages entries apart, whatever the given table's row stride.
        table_gaps = page_table is not None and int(page_table.stride(1)) != 1
        table_stride = 0
        if page_table is not None:
            table_stride = int(page_table.shape[1] if table_gaps else page_table.stride(0))
        entry = _decide(q, capacity, page, causal, variant, table_stride, added,
                        int(k_cache.shape[2]), table_gaps)  # fmt: skip
        decision = _Decision(entry, capacity, page, causal, variant, added,
                             get_settings().check_kvcache)  # fmt: skip
        if len(_decisions) >= MAX_DECISIONS:
            del _decisions[next(iter(_decisions))]
        _decisions[key] = decision
        return decision


@torch.library.custom_op(  # type: ignore[untyped-decorator,unused-ignore]
    "fa2tune::attention_with_kvcache", mutates_args=("k_cache", "v_cache")
)
def attention_with_kvcache_op(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    cache_seqlens: torch.Tensor,
    page_table: torch.Tensor | None,
    cache_batch_idx: torch.Tensor | None,
    cache_leftpad: torch.Tensor | None,
    causal: bool,
    scale: float,
    window_left: int,
    window_right: int,
    chunk: int,
    softcap: float,
    sinks: torch.Tensor | None,
    return_lse: bool,
    fallback: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.ops.fa2tune.attention_with_kvcache``: :func:`run_with_kvcache`."""
    o, lse = run_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, page_table,
                              cache_batch_idx, cache_leftpad, causal, scale,
                              (window_left, window_right), chunk, softcap, sinks, return_lse,
                              fallback)  # fmt: skip
    return o, (lse if lse is not None else no_lse(q))  # an op returns a tensor in its place


@attention_with_kvcache_op.register_fake  # type: ignore[untyped-decorator,unused-ignore]
def _attention_with_kvcache_fake(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor | None,
    v: torch.Tensor | None, cache_seqlens: torch.Tensor, page_table: torch.Tensor | None,
    cache_batch_idx: torch.Tensor | None, cache_leftpad: torch.Tensor | None, causal: bool,
    scale: float, window_left: int, window_right: int, chunk: int, softcap: float,
    sinks: torch.Tensor | None, return_lse: bool, fallback: bool,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    b, nq, hq, _ = q.shape
    lse = q.new_empty((b, hq, nq), dtype=torch.float32) if return_lse else no_lse(q)
    return q.new_empty(q.shape), lse


def attention_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    *,
    cache_seqlens: torch.Tensor | int,
    page_table: torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    window_size: tuple[int, int] = NO_WINDOW,
    attention_chunk: int = 0,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    return_lse: bool = False,
    fallback: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q`` over a KV cache, after appending ``k``/``v`` to it in place.

    Args:
        q: ``[B, Nq, Hq, D]`` (decode: ``Nq`` 1 or a few speculative tokens; any ``Nq``
            works, a chunk of a prefill over its cached prefix included).
        k_cache, v_cache: ``[rows, capacity, Hkv, D]`` (contiguous), or with ``page_table``
            ``[pages, page size, Hkv, D]`` (any power-of-two page size, 1 included).
        k, v: ``[B, Nnew, Hkv, D]`` new keys and values, written into the caches at each
            sequence's length before the attention (bit-exact, in place); or None.
        cache_seqlens: int32 ``[B]`` on q's device, the keys each sequence has cached before
            this call (or an int for all); the call attends to ``cache_seqlens + Nnew``
            keys, clamped to the capacity. Never read on the host.
        page_table: int32 ``[B, max_pages]``: sequence ``b``'s key ``j`` lies in page
            ``page_table[b, j // page size]``; pages may come in any order and be shared.
        cache_batch_idx: int32 ``[B]``: batch row ``b`` uses cache row (or, paged, block-table
            row) ``cache_batch_idx[b]``; default ``b``.
        cache_leftpad: int32 ``[B]``: sequence ``b``'s keys start at ``cache_leftpad[b]``
            (the keys before it are padding, never seen; positions, masks and windows count
            from it, as FlashAttention's ``cache_leftpad``). A paged cache with it is gathered
            into a contiguous copy first (one pass over its pages: the paged kernels take no
            padding).
        causal: bottom-right aligned at each sequence's length (query ``i`` sees key ``j``
            iff ``j <= i + len - Nq``).
        scale: softmax scale, ``1 / sqrt(D)`` by default.
        window_size, attention_chunk, softcap, sinks: the attention variants, as
            :func:`fa2tune.torch.attention` takes them, aligned at each sequence's length.
        return_lse: also return the float32 LSE ``[B, Hq, Nq]``.
        fallback: run what the kernels cannot serve on torch (warning once per reason);
            False raises :class:`~fa2tune.ops.choice.Unsupported` instead.

    Returns:
        ``o`` (fresh, contiguous, q's shape), or ``(o, lse)``.

    Raises:
        ValueError: bad arguments (shapes, dtypes, devices, page size, a variant argument).
        Unsupported: with ``fallback=False``, a call the kernels cannot serve.
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if not isinstance(cache_seqlens, torch.Tensor):
        cache_seqlens = lengths_tensor(cache_seqlens, q, k_cache, k, page_table)
    left, right = NO_WINDOW if window_size is NO_WINDOW else window_pair(window_size)
    if torch.compiler.is_compiling() or type(q) is not torch.Tensor:
        # Traced (torch.compile) or a tensor subclass (FakeTensor): through the dispatcher.
        o, lse = torch.ops.fa2tune.attention_with_kvcache(
            q, k_cache, v_cache, k, v, cache_seqlens, page_table, cache_batch_idx,
            cache_leftpad, causal, float(scale), left, right, attention_chunk, float(softcap),
            sinks, return_lse, fallback,
        )  # fmt: skip
    else:  # eager: the dispatcher's custom-op machinery costs more than the launch
        o, lse_or_none = run_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens,
                                          page_table, cache_batch_idx, cache_leftpad, causal,
                                          float(scale), (left, right), attention_chunk,
                                          float(softcap), sinks, return_lse,
                                          fallback)  # fmt: skip
        if not return_lse:
            return o
        lse = lse_or_none if lse_or_none is not None else no_lse(q)
    return (o, lse) if return_lse else o


def clear_cache_decisions() -> None:
    """Forget every cache decision and warning (kernels stay loaded)."""
    with _lock:
        _decisions.clear()
        _warned.clear()


__all__ = [
    "CacheLauncher",
    "append_kv",
    "attention_with_kvcache",
    "attention_with_kvcache_op",
    "cache_refusal",
    "check_cache_args",
    "check_cache_values",
    "clear_cache_decisions",
    "run_with_kvcache",
]
