"""Which kernel serves a call over a KV cache (torch-free).

A cache call (:func:`fa2tune.ops.kvcache.attention_with_kvcache`) runs on the split-KV
family's cache kernels (``_kvc``, paged ``_kvc_pg<P>``: codegen/templates/splitkv_fwd.cuh),
whatever its number of query rows: they read each sequence's length on the device, so one
decision serves a whole decode loop. A cache call is known on the host by its capacity, never
by its lengths: its shape's key count is the capacity.

1. When the store holds a tuned cache problem of the call's layout (the same page size, or
   contiguous; ``fa2tune tune --kv-page``) for the call's GPU, head dim, dtype, mask and
   variant switches, the config measured at the call's shape, else at the nearest tuned
   shape of the same phase (:func:`core.lookup.pick`'s rule, as for dense calls), serves:
   the choice's ``source`` is ``exact`` or ``nearest`` and its ``kv_page`` the layout.
2. Otherwise the tile the store (or the family default) gives the dense call of the same
   shape (:func:`fa2tune.ops.choice.choose`, split-KV configs only), built as its cache twin:
   ``source`` says where the tile came from and ``kv_page`` is None (not measured as a cache
   kernel).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from codegen.families import family, family_of
from core.problem import kv_page_of
from core.splitkv_config import SplitKvConfig
from db.store import Store
from fa2tune.ops.choice import (
    ANY_SMEM,
    Call,
    Choice,
    Source,
    Unsupported,
    candidates_of,
    choose,
    serves_variant,
    smem_limit_of,
    with_variant,
)

log = logging.getLogger(__name__)

#: The family whose cache kernels the op launches (its CacheLauncher's arguments are
#: split-KV's). The Hopper family's cache kernels (``fa3_..._kvc``) are tuned and answered by
#: the service, but the op asks the store for split-KV's results only: a faster fa3 result
#: must not hide the best split-KV one.
OP_CACHE_FAMILY = "splitkv"


def tuned_cache_choice(store: Store | None, call: Call, page: int) -> Choice | None:
    """The config of the tuned cache problem of layout ``page`` that answers ``call`` (exact
    shape, else the nearest of its phase), or None when none is tuned, or the answer is not
    a cache kernel of that layout and the call's variant that builds for its GPU (a store
    written by hand)."""
    if store is None or call.packed is not None:
        return None
    try:
        found = candidates_of(store, call, kv_page=page, family=OP_CACHE_FAMILY).match(
            call.gpu, call.causal, call.shape, variant=call.variant, kv_page=page
        )
    except Exception as exc:  # a broken database must not break the model: today's rule
        log.warning("fa2tune.torch: database lookup failed, using defaults: %s", exc)
        return None
    if found is None:
        return None
    config = found.result.config
    fits = (
        isinstance(config, SplitKvConfig)
        and kv_page_of(config) == page
        and serves_variant(config, call.variant)
        and family_of(config).arch_for(call.compute_capability) is not None
    )
    if not fits:
        return None
    source: Source = "exact" if found.result.exact else "nearest"
    return Choice(config, source, found.measured, kv_page=page)


def cache_choice(store: Store | None, call: Call, page: int) -> Choice:
    """The cache config for ``call`` (its shape's ``nk`` the cache's capacity) with page size
    ``page`` (0: a contiguous cache).

    Raises:
        Unsupported: the head dim, dtype or GPU has no split-KV kernel, or the variant or
            page size is one the cache kernels do not take.
    """
    tuned = tuned_cache_choice(store, call, page)
    if tuned is not None:
        return tuned
    try:
        base = choose(store, call)
    except Unsupported:
        base = None
    if base is not None and isinstance(base.config, SplitKvConfig):
        config: SplitKvConfig = base.config
        source, measured = base.source, base.measured
    else:
        splitkv = family("splitkv")
        if call.d not in splitkv.head_dims:
            raise Unsupported(f"the split-KV family has no head dim {call.d} (its cache kernels "
                              "serve multiples of 8 up to 256)")  # fmt: skip
        if splitkv.arch_for(call.compute_capability) is None:
            raise Unsupported(f"no split-KV kernel builds for compute capability "
                              f"{call.compute_capability}")  # fmt: skip
        fitted = splitkv.default_within(call.d, call.dtype, call.causal,
                                        smem_limit_of(call.compute_capability))  # fmt: skip
        if fitted is None:
            raise Unsupported(f"no split-KV tile fits the shared memory of compute capability "
                              f"{call.compute_capability}")  # fmt: skip
        default, why = with_variant(fitted, call.variant)
        if default is None:
            raise Unsupported(why)
        assert isinstance(default, SplitKvConfig)
        config, source, measured = default, "default", None
    built = replace(config, kvcache=True, page=page)
    ok, why = family_of(built).check(built, ANY_SMEM)  # the tile's own rules held already
    if not ok:
        raise Unsupported(why)
    return Choice(built, source, measured)
