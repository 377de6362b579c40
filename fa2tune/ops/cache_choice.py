"""Which kernel serves a call over a KV cache (torch-free).

A cache call (:func:`fa2tune.ops.kvcache.attention_with_kvcache`) runs on the split-KV
family's cache kernels (``_kvc``, paged ``_kvc_pg<P>``: codegen/templates/splitkv_fwd.cuh),
whatever its number of query rows: they read each sequence's length on the device, so one
decision serves a whole decode loop. Its tile is the one the store (or the family default)
gives the contiguous call of the same shape with the cache's capacity as its key count
(:func:`fa2tune.ops.choice.choose`, split-KV configs only): a cache call is known on the
host by its capacity, never by its lengths. The cache kernels themselves are not tuned yet:
the choice's source says where the tile came from, and the config's ``_kvc`` suffix that it
was not measured as such.
"""

from __future__ import annotations

from dataclasses import replace

from codegen.families import family, family_of
from core.splitkv_config import SplitKvConfig
from db.store import Store
from fa2tune.ops.choice import (
    ANY_SMEM,
    Call,
    Choice,
    Unsupported,
    choose,
    smem_limit_of,
    with_variant,
)


def cache_choice(store: Store | None, call: Call, page: int) -> Choice:
    """The cache config for ``call`` (its shape's ``nk`` the cache's capacity) with page size
    ``page`` (0: a contiguous cache).

    Raises:
        Unsupported: the head dim, dtype or GPU has no split-KV kernel, or the variant or
            page size is one the cache kernels do not take.
    """
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
