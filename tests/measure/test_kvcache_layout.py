"""The cache a KV-cache problem is timed on (measure.kvcache.build_cache), on the CPU: every
sequence's keys and values read back through the layout are the dense problem's, the rows
and pages past them hold other values, the block table is a shuffled permutation."""

from __future__ import annotations

import pytest

from measure.kvcache import CONTIGUOUS_UNIT, CacheTensors, build_cache, cache_capacity

torch = pytest.importorskip("torch")


def gather_cache(cache: CacheTensors, nk: int) -> tuple[object, object]:
    """The first ``nk`` keys and values of every sequence read back through the layout, with
    the op's own reader (fa2tune.ops.kvcache_fallback.gathered_cache)."""
    from fa2tune.ops.kvcache_fallback import gathered_cache

    b = int(cache.seqlens.shape[0])
    k = gathered_cache(cache.k_cache, b, cache.block_table, None)[:, :nk]
    v = gathered_cache(cache.v_cache, b, cache.block_table, None)[:, :nk]
    return k, v


@pytest.mark.parametrize(("nk", "page", "capacity"), [
    (8192, 16, 8208), (8192, 0, 8256), (100, 64, 192), (1, 1, 2), (300, 4096, 8192),
    (64, 0, 128),
])  # fmt: skip
def test_capacity_is_whole_pages_and_a_spare_one(nk: int, page: int, capacity: int) -> None:
    unit = page or CONTIGUOUS_UNIT
    assert cache_capacity(nk, page) == capacity
    assert capacity % unit == 0 and capacity - nk >= unit  # whole pages, a spare one


def _kv(b: int, nk: int, hkv: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    k = torch.randn((b, nk, hkv, d), generator=gen).half()
    v = torch.randn((b, nk, hkv, d), generator=gen).half()
    return k, v


@pytest.mark.parametrize("page", [0, 1, 4, 16, 64, 256])
def test_the_cache_holds_the_problems_keys(page: int) -> None:
    b, nk, hkv, d = 3, 200, 2, 16
    k, v = _kv(b, nk, hkv, d)
    cache = build_cache(k, v, page, seed=7)
    assert cache.capacity == cache_capacity(nk, page) and cache.page == page
    assert cache.seqlens.dtype == torch.int32 and cache.seqlens.tolist() == [nk] * b
    k_back, v_back = gather_cache(cache, nk)
    assert torch.equal(k_back, k) and torch.equal(v_back, v)
    if page == 0:
        assert cache.block_table is None
        assert tuple(cache.k_cache.shape) == (b, cache.capacity, hkv, d)
        spare = cache.k_cache[:, nk:]
    else:
        table = cache.block_table
        assert table is not None and table.dtype == torch.int32 and table.is_contiguous()
        assert tuple(table.shape) == (b, cache.capacity // page)
        ids = table.flatten().tolist()
        pages = int(cache.k_cache.shape[0])
        assert len(set(ids)) == len(ids) and pages == len(ids) + 1  # one page no entry names
        assert ids != sorted(ids) or len(ids) == 1  # shuffled
        full = gather_cache(cache, cache.capacity)[0]
        spare = full[:, nk:]
    # Rows past the length hold other values, finite and not the keys' zeros.
    assert spare.numel() > 0 and torch.isfinite(spare.float()).all()
    assert spare.float().abs().max() > 1.0


def test_the_layout_is_drawn_from_the_seed() -> None:
    k, v = _kv(2, 64, 1, 8)
    one, two, other = (build_cache(k, v, 16, seed=s) for s in (3, 3, 4))
    assert one.block_table is not None and two.block_table is not None
    assert torch.equal(one.block_table, two.block_table)
    assert torch.equal(one.k_cache, two.k_cache) and not torch.equal(one.k_cache, other.k_cache)


def test_bad_layouts_are_refused() -> None:
    k, v = _kv(1, 8, 1, 8)
    with pytest.raises(ValueError, match="power of two"):
        build_cache(k, v, 3, seed=0)
    with pytest.raises(ValueError, match="alike"):
        build_cache(k, v[:, :4], 16, seed=0)


@pytest.mark.parametrize("page", [0, 1, 16, 64])
def test_a_cache_of_mixed_lengths_holds_every_key_past_them(page: int) -> None:
    """Each sequence's length is its own; its rows past it are the dense problem's keys beyond
    it (finite values a kernel must not read), not the filler, and the capacity is nk's."""
    b, nk, hkv, d = 4, 200, 2, 16
    k, v = _kv(b, nk, hkv, d)
    lengths = (200, 7, 1, 129)
    cache = build_cache(k, v, page, seed=7, lengths=lengths)
    assert cache.seqlens.dtype == torch.int32 and tuple(cache.seqlens.tolist()) == lengths
    assert cache.capacity == cache_capacity(nk, page)
    k_back, v_back = gather_cache(cache, nk)
    assert torch.equal(k_back, k) and torch.equal(v_back, v)
    # The layout is the full-length cache's: only the lengths differ.
    full = build_cache(k, v, page, seed=7)
    assert torch.equal(cache.k_cache, full.k_cache) and torch.equal(cache.v_cache, full.v_cache)


def test_the_mixed_pattern_of_a_problem_builds_its_cache() -> None:
    from core.problem import Problem

    problem = Problem(gpu="g", d=16, n=1, nk=300, batch=6, heads=4, kv_heads=2, kv_page=16,
                      kv_lengths="mixed")  # fmt: skip
    lengths = problem.cache_lengths
    assert lengths is not None and max(lengths) == 300 and len(set(lengths)) > 1
    k, v = _kv(6, 300, 2, 16)
    cache = build_cache(k, v, 16, seed=1, lengths=lengths)
    assert tuple(cache.seqlens.tolist()) == lengths


@pytest.mark.parametrize(
    ("lengths", "message"),
    [((8, 8), "2 sequence lengths for a batch of 3"), ((8, 9, 8), r"in \[0, 8\]"),
     ((8, -1, 8), r"in \[0, 8\]")],
)  # fmt: skip
def test_lengths_that_are_not_the_batchs_are_refused(
    lengths: tuple[int, ...], message: str
) -> None:
    k, v = _kv(3, 8, 1, 8)
    with pytest.raises(ValueError, match=message):
        build_cache(k, v, 16, seed=0, lengths=lengths)
