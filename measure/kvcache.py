"""Measuring a config for a KV-cache problem: the dense problem's inputs laid out as a cache.

A KV-cache problem (:attr:`core.problem.Problem.kv_page` set) is timed on a family's cache
kernels (``_kvc``, ``_kvc_pg<P>``: split-KV's, docs/splitkv_kernel.md, "KV caches", and the
Hopper family's, codegen/templates/fa3_fwd.cuh, "KV caches"), which read K and V from a
cache and each sequence's length from the device. Its inputs are the
dense problem's (:func:`measure.reference.make_inputset` of the problem without its layout,
so the float32 reference is the dense one), and :func:`build_cache` copies K and V into

* a contiguous cache ``[B, capacity, Hkv, D]`` (``kv_page`` 0), or
* pages ``[pages, P, Hkv, D]`` reached through an int32 block table ``[B, capacity / P]``
  whose entries are a shuffled permutation of the pages (``kv_page`` P),

with ``capacity`` = ``nk`` rounded up to whole pages (of :data:`CONTIGUOUS_UNIT` rows for a
contiguous cache) plus one spare page, so every sequence's cache has rows past its length.
Those rows, and the pages no table entry names, hold other random values (finite: a kernel
that reads a row it should mask gives a wrong result, one that reads it and multiplies by a
zero weight does not give NaN). Each sequence's length (int32 on the device) is the problem's
:attr:`~core.problem.Problem.cache_lengths`: ``nk`` for every sequence (``kv_lengths``
``full``), so the result equals dense attention over the same keys and the check is the dense
problem's, O and LSE of every (batch, head) pair the reference covers; or a spread up to
``nk`` (``mixed``), where sequence ``b`` holds its first ``L_b`` keys and its rows past them
are the dense problem's keys beyond ``L_b`` (finite, other values: a kernel that reads a key
past its sequence's length gives a wrong result). A mixed problem is checked against the
float32 reference over each sequence's own ``L_b`` keys, bottom-right aligned as always
(:func:`cache_inputset`: the same pairs, the dense set's yardstick). The launch takes the
arguments of ``fa2tune.ops.kvcache.CacheLauncher`` in its order: ``FaParams`` (``nk`` the
capacity, K/V the cache), the family's arguments (split-KV's workspace, sized from the
capacity as the op's; fa3's TMA descriptors over the caches: ``Family.cache_host_prep``),
``FaVariant``, ``FaKvCache``; grid from the capacity too. The op's other layouts (batch
indices, appends) are not part of what is timed.

torch and cuda-bindings are imported when a function runs, never at module import; the cache
layout (:func:`build_cache`) runs on any torch device, so it is tested on the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from core.family import AnyConfig
from core.problem import Problem

if TYPE_CHECKING:
    import torch

    from measure.loader import BoundLaunch, LoadedKernel
    from measure.reference import InputSet

#: The rows a contiguous cache's capacity is rounded to (and its spare rows): a multiple of
#: every ``block_n`` of the space, so the last key tile has rows past the length.
CONTIGUOUS_UNIT = 64


def cache_capacity(nk: int, page: int) -> int:
    """The capacity of the cache a problem of ``nk`` keys is timed on: ``nk`` rounded up to
    whole pages (``page``, or :data:`CONTIGUOUS_UNIT` rows for a contiguous cache, 0) plus a
    spare page."""
    unit = page if page > 0 else CONTIGUOUS_UNIT
    return (-(-nk // unit) + 1) * unit


@dataclass(frozen=True)
class CacheTensors:
    """A problem's K and V laid out as a cache (:func:`build_cache`).

    Attributes:
        k_cache, v_cache: ``[B, capacity, Hkv, D]`` (contiguous) or ``[pages, P, Hkv, D]``.
        block_table: int32 ``[B, capacity / P]`` (None for a contiguous cache).
        seqlens: int32 ``[B]``, each sequence's length (``nk``, or the lengths it was built
            with).
        capacity: the most keys a sequence's cache holds.
        page: 0 for a contiguous cache, else P.
    """

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor | None
    seqlens: torch.Tensor
    capacity: int
    page: int

    def describe(self) -> dict[str, object]:
        """JSON-able summary for a measurement's ``extra``."""
        out: dict[str, object] = {"kv_page": self.page, "kv_capacity": self.capacity}
        if self.block_table is not None:
            out["kv_pages"] = int(self.k_cache.shape[0])
        return out


def _lengths_error(lengths: Sequence[int], batch: int, nk: int, least: int) -> str | None:
    """Why ``lengths`` are not ``batch`` sequence lengths in ``[least, nk]``; None if they are."""
    if len(lengths) != batch:
        return f"{len(lengths)} sequence lengths for a batch of {batch}"
    bad = [n for n in lengths if not least <= n <= nk]
    if bad:
        return f"sequence lengths must be in [{least}, {nk}] (the keys given), got {bad[0]}"
    return None


def build_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    page: int,
    seed: int,
    lengths: Sequence[int] | None = None,
) -> CacheTensors:
    """K and V ``[B, nk, Hkv, D]`` (any strides) copied into a cache of layout ``page`` (see
    the module docstring), on their device; the filler and the page order are drawn from
    ``seed``. ``lengths`` are the sequences' lengths (``seqlens``; None: ``nk`` each): every
    sequence's cache holds all ``nk`` rows given whatever its length, so the rows past a
    shorter one are those keys, not the filler.

    Raises:
        ValueError: ``k`` and ``v`` that are not 4-d and alike, a page size that is not 0 or
            a power of two, or ``lengths`` that are not ``B`` lengths in ``[0, nk]``.
    """
    import torch

    if k.dim() != 4 or tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must be 4-d and alike")
    if page < 0 or page & (page - 1):
        raise ValueError(f"page size {page} is not 0 or a power of two")
    b, nk, hkv, d = (int(x) for x in k.shape)
    why = None if lengths is None else _lengths_error(lengths, b, nk, least=0)
    if why is not None:
        raise ValueError(why)
    capacity = cache_capacity(nk, page)
    gen = torch.Generator(device="cpu").manual_seed(seed)  # the page order
    # The filler is drawn where the cache lives, in its dtype: a batch-64 16k-key cache is
    # 2.2 G values per tensor, seconds of CPU time and float32 staging per trial otherwise.
    fill_gen = torch.Generator(device=k.device).manual_seed(seed)

    def filler(shape: tuple[int, ...]) -> torch.Tensor:
        # Other values than the keys' (scaled up: a row read unmasked moves the softmax).
        out = torch.randn(shape, generator=fill_gen, device=k.device, dtype=k.dtype)
        return out.mul_(4)

    if lengths is None:
        seqlens = torch.full((b,), nk, dtype=torch.int32, device=k.device)
    else:
        seqlens = torch.tensor(list(lengths), dtype=torch.int32, device=k.device)
    if page == 0:
        k_cache, v_cache = filler((b, capacity, hkv, d)), filler((b, capacity, hkv, d))
        k_cache[:, :nk] = k
        v_cache[:, :nk] = v
        return CacheTensors(k_cache, v_cache, None, seqlens, capacity, 0)
    per_seq = capacity // page
    pages = b * per_seq + 1  # one page no table names
    order = torch.randperm(pages, generator=gen)[: b * per_seq]
    table = order.view(b, per_seq).to(torch.int32).to(k.device)
    k_cache, v_cache = filler((pages, page, hkv, d)), filler((pages, page, hkv, d))
    pos = torch.arange(nk, device=k.device)
    where = table.long()[:, pos // page]  # [B, nk]: each key's page
    slot = (pos % page).expand(b, nk)
    k_cache[where, slot] = k
    v_cache[where, slot] = v
    return CacheTensors(k_cache, v_cache, table.contiguous(), seqlens, capacity, page)


def _rows_of(t: torch.Tensor, layout: str, batch: int, keys: int | None = None) -> torch.Tensor:
    """Batch row ``batch`` of ``t`` (stored in ``layout``) as a one-row view, its first
    ``keys`` positions only when given."""
    row = t[batch : batch + 1]
    if keys is None:
        return row
    return row[:, :keys] if layout == "bnhd" else row[:, :, :keys]


def cache_inputset(
    dense: InputSet, lengths: Sequence[int], *, chunk_bytes: int | None = None
) -> InputSet:
    """The check of a cache problem whose sequences hold ``lengths`` keys, on ``dense`` (its
    dense problem's :class:`~measure.reference.InputSet`, drawn at ``nk`` keys): the same
    inputs, pairs, sinks, yardstick (``ref_err``: SDPA's error on these inputs at ``nk``
    keys, or the emulated one of a variant) and output buffers, with ``ref_o``/``ref_lse``
    of each pair recomputed over its batch row's first ``L_b`` keys, bottom-right aligned as
    always (:func:`measure.reference.reference_for_pairs` on one-row slices, so every
    variant keeps its rule) and :attr:`~measure.reference.InputSet.key_lengths` set (rows
    that see no key counted per sequence). ``dense`` itself when every length is ``nk``.

    Raises:
        ValueError: ``lengths`` that are not the batch's, each in ``[1, nk]``.
    """
    import torch

    from measure.reference import CHUNK_BYTES, reference_for_pairs

    p = dense.problem
    why = _lengths_error(lengths, p.batch, p.n_keys, least=1)
    if why is not None:
        raise ValueError(why)
    if all(n == p.n_keys for n in lengths):
        return dense
    ref_o = torch.empty_like(dense.ref_o)
    ref_lse = torch.empty_like(dense.ref_lse)
    for bi in sorted({bi for bi, _ in dense.pairs}):
        at = [i for i, (b, _) in enumerate(dense.pairs) if b == bi]
        keys = lengths[bi]
        o, lse = reference_for_pairs(
            _rows_of(dense.q, dense.layout, bi), _rows_of(dense.k, dense.layout, bi, keys),
            _rows_of(dense.v, dense.layout, bi, keys), tuple((0, dense.pairs[i][1]) for i in at),
            layout=dense.layout, causal=p.causal, scale=dense.scale, variant=p.variant,
            sinks=dense.sinks, chunk_bytes=CHUNK_BYTES if chunk_bytes is None else chunk_bytes,
        )  # fmt: skip
        index = torch.tensor(at, device=ref_o.device)
        ref_o[index], ref_lse[index] = o, lse
    # Fewer keys average less: the rounding floor follows the largest output checked now.
    absmax = float(ref_o.abs().max()) if ref_o.numel() else 0.0
    return replace(dense, ref_o=ref_o, ref_lse=ref_lse, ref_absmax=absmax,
                   key_lengths=tuple(lengths), _outputs=dense.outputs())  # fmt: skip


@dataclass(frozen=True)
class CacheLaunch:
    """A bound cache launch with the tensors and arguments it points into (kept alive)."""

    launch: BoundLaunch
    cache: CacheTensors
    keep: tuple[Any, ...]

    def __call__(self) -> None:
        self.launch()


def bind_cache(
    kernel: LoadedKernel,
    config: AnyConfig,
    problem: Problem,
    inputs: InputSet,
    o: torch.Tensor,
    lse: torch.Tensor,
    stream: int,
    seed: int,
) -> CacheLaunch:
    """One bound launch of ``config``'s cache kernel over ``inputs`` laid out as the cache of
    ``problem``'s layout and lengths (:attr:`~core.problem.Problem.cache_lengths`), writing
    ``o`` (in ``inputs.layout``) and ``lse``.

    Raises:
        ValueError: a config that is not a cache kernel of the problem's layout, or what the
            parameter builders refuse (strides, alignment, sinks).
    """
    import torch

    from codegen.families import family_of
    from core.problem import describe_kv_page, kv_page_of
    from measure.loader import extra_args, launch_geometry
    from measure.params import FaKvCache, cache_params, variant_params

    page = problem.kv_page
    if page is None or kv_page_of(config) != page:
        raise ValueError(
            f"{config.name} is not a cache kernel of {describe_kv_page(page)} (it reads "
            f"{describe_kv_page(kv_page_of(config))})"
        )
    q_b, k_b, v_b, o_b = (t if inputs.layout == "bnhd" else t.transpose(1, 2)
                          for t in (inputs.q, inputs.k, inputs.v, o))  # fmt: skip
    cache = build_cache(k_b, v_b, page, seed, problem.cache_lengths)
    b, nq, hq, _ = (int(x) for x in q_b.shape)
    hkv = int(k_b.shape[2])
    params = cache_params(q_b, cache.k_cache, cache.v_cache, o_b, lse, inputs.scale,
                          cache.capacity)  # fmt: skip
    prep = family_of(config).cache_host_prep
    if prep is not None:  # arguments over the caches as they are (fa3's TMA descriptors)
        workspace = prep(config, q_b, cache.k_cache, cache.v_cache, cache.capacity)
    else:  # the workspace of a launch whose keys are the capacity (its shape is all it reads)
        rows = torch.empty((1, 1, 1, 1), dtype=k_b.dtype, device=k_b.device)
        sized = rows.expand(b, cache.capacity, hkv, int(k_b.shape[3]))
        workspace = extra_args(config, q_b, sized, sized, "bnhd")
    # As the op (fa2tune.ops.kvcache.CacheLauncher): the window for lengths not known on the
    # host, applied on the device to each sequence's own length, as the reference applies
    # the problem's variant (normalised on nk, the longest) to each sequence's keys.
    fv = variant_params(problem.variant, inputs.sinks, causal=config.causal, nq=nq, nk=None,
                        q_heads=hq)  # fmt: skip
    table = cache.block_table
    kc = FaKvCache(cache.seqlens.data_ptr(), None,
                   table.data_ptr() if table is not None else None,
                   int(table.stride(0)) if table is not None else 0, 0, None)  # fmt: skip
    grid, block = launch_geometry(config, nq, hq, b, nk=cache.capacity, kv_heads=hkv)
    bound = kernel.bind(params, grid, block, config.smem_bytes, stream, (*workspace, fv, kc))
    return CacheLaunch(bound, cache, (workspace, fv, kc, inputs.sinks, q_b, o_b))
