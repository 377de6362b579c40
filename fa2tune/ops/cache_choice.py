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
   the choice's ``source`` is ``exact`` or ``nearest`` and its ``kv_page`` the layout. Both
   length patterns answer (:func:`core.kv_lengths.answering_pattern`): the nearest problem
   of either, and on a tie (both tuned at the call's shape) the one tuned on a length mix
   (``mixed``): the call's lengths are on the device, and a serving batch's differ (a pick
   tuned with every sequence full splits a long sequence too little when the rest are
   short). A shape tuned only full (batch 1, where no mix exists) keeps its exact answer.
2. Otherwise the tile the store (or the family default) gives the dense call of the same
   shape (:func:`fa2tune.ops.choice.choose`, split-KV configs only), built as its cache twin:
   ``source`` says where the tile came from and ``kv_page`` is None (not measured as a cache
   kernel).

Both rules take split-KV's cache kernels only, unless ``hopper`` (``Settings.fa3_cache``, on by
default) is set: then a prefill-length call (more than :data:`~core.shape.DECODE_MAX_NQ` query rows)
on compute capability 9.0 may also take the Hopper family's (``fa3_..._kvc``): a tuned fa3 cache
result in rule 1, and in rule 2 the dense pick's twin when that pick is a Hopper config whose tile
the page size suits (:func:`codegen.families.fa3.space.cache_reasons`), else the family's default
tile's twin (source ``default``), ahead of split-KV's default.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from codegen.families import FAMILIES, family, family_of
from core.family import cache_twin
from core.kv_lengths import CALL_ORDER, answering_pattern
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

#: The family whose cache kernels serve every cache call the others do not take (decode, GPUs
#: other than Hopper). Without ``hopper`` the op asks the store for its results only: a faster
#: fa3 result must not hide the best split-KV one.
OP_CACHE_FAMILY = "splitkv"


def op_cache_families(call: Call, hopper: bool) -> list[str]:
    """The families whose cache kernels may serve ``call``: split-KV's, and with ``hopper``
    first every other family whose cache kernels the op can bind (``Family.cache_host_prep``)
    and that takes the call's GPU, head dim and phase (``Family.serves_cache``)."""
    others = [
        f.name for f in FAMILIES.values()
        if hopper and f.name != OP_CACHE_FAMILY and f.cache_host_prep is not None
        and f.arch_for(call.compute_capability) is not None and call.d in f.head_dims
        and f.serves_cache(call.shape.nq)
    ]  # fmt: skip
    return [*others, OP_CACHE_FAMILY]


def tuned_cache_choice(
    store: Store | None, call: Call, page: int, hopper: bool = False
) -> Choice | None:
    """The config of the tuned cache problem of layout ``page`` that answers ``call`` (exact
    shape, else the nearest of its phase; split-KV's, or with ``hopper`` any family's where
    :func:`op_cache_families`), or None when none is tuned, or the answer is not a cache kernel
    of that layout and the call's variant that builds for its GPU (a store written by hand)."""
    if store is None or call.packed is not None:
        return None
    families = op_cache_families(call, hopper)
    only = None if len(families) > 1 else OP_CACHE_FAMILY
    try:
        matches = {
            pattern: candidates_of(store, call, kv_page=page, family=only,
                                   kv_lengths=pattern).match(
                call.gpu, call.causal, call.shape, variant=call.variant, kv_page=page
            )
            for pattern in CALL_ORDER
        }  # fmt: skip
    except Exception as exc:  # a broken database must not break the model: today's rule
        log.warning("fa2tune.torch: database lookup failed, using defaults: %s", exc)
        return None
    pattern = answering_pattern({
        p: (m.result.distance, m.measured) for p, m in matches.items() if m is not None
    })  # fmt: skip
    found = matches[pattern] if pattern is not None else None
    if found is None:
        return None
    config = found.result.config
    fits = (
        config.family in families
        and kv_page_of(config) == page
        and serves_variant(config, call.variant)
        and family_of(config).arch_for(call.compute_capability) is not None
    )
    if not fits:
        return None
    source: Source = "exact" if found.result.exact else "nearest"
    return Choice(config, source, found.measured, kv_page=page, kv_lengths=found.result.kv_lengths)


def twin_choice(base: Choice, page: int) -> Choice | None:
    """A choice's config as its cache twin of layout ``page`` (tile order), or None when its
    family has no cache kernels or its space does not take the twin."""
    twin = cache_twin(base.config, page)
    if twin is None or not family_of(twin).check(twin, ANY_SMEM)[0]:  # smem held already
        return None
    return Choice(twin, base.source, base.measured)


def family_default_twin(name: str, call: Call, page: int) -> Choice | None:
    """Family ``name``'s default tile for the call's key (with its variant's switches) as its
    cache twin, or None when the family or the page size cannot take it."""
    fitted, _ = with_variant(family(name).default(call.d, call.dtype, call.causal), call.variant)
    return None if fitted is None else twin_choice(Choice(fitted, "default", None), page)


def cache_choice(store: Store | None, call: Call, page: int, hopper: bool = False) -> Choice:
    """The cache config for ``call`` (its shape's ``nk`` the cache's capacity) with page size
    ``page`` (0: a contiguous cache); ``hopper``: the Hopper family's cache kernels may serve
    (see the module docstring).

    Raises:
        Unsupported: the head dim, dtype or GPU has no split-KV kernel, or the variant or
            page size is one the cache kernels do not take.
    """
    tuned = tuned_cache_choice(store, call, page, hopper)
    if tuned is not None:
        return tuned
    try:
        base = choose(store, call)
    except Unsupported:
        base = None
    others = op_cache_families(call, hopper)[:-1]
    if base is not None and base.config.family in others:
        twin = twin_choice(base, page)
        if twin is not None:
            return twin
    for name in others:  # the dense pick is another family's, or none: a family default
        twin = family_default_twin(name, call, page)
        if twin is not None:
            return twin
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
