"""Which kernel serves a call over a KV cache (fa2tune.ops.cache_choice), torch-free: a tuned
cache problem of the call's layout first (exact, else the nearest of its phase), else the tile
of the dense pick built as its cache twin; the choice says which."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.fa3_config import Fa3Config
from core.family import AnyConfig
from core.problem import Problem
from core.shape import Shape
from core.splitkv_config import SplitKvConfig
from core.variant import PLAIN
from db.store import Store
from fa2tune.ops.cache_choice import cache_choice
from fa2tune.ops.choice import Call, forget_results
from tests.support.factories import H200, make_report, ok_result

DENSE = SplitKvConfig(128, "bf16", False, splits=8)
PAGED = dataclasses.replace(DENSE, splits=32, warps=2, kvcache=True, page=16)
DECODE = Shape(1, 8192, 8, 32, 8)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    forget_results()  # the op's candidate groups are per store and process
    with Store.from_url(f"sqlite:///{tmp_path / 'r.db'}") as s:
        yield s
    forget_results()


def _record(
    store: Store,
    config: AnyConfig,
    shape: Shape,
    kv_page: int | None,
    ms: float = 0.05,
    causal: bool = False,
    kv_lengths: str = "full",
) -> None:
    problem = Problem(gpu=H200.name, d=128, n=shape.nq, nk=shape.nk, batch=shape.batch,
                      heads=shape.heads, kv_heads=shape.kv_heads, dtype="bf16", causal=causal,
                      kv_page=kv_page, kv_lengths=kv_lengths)  # fmt: skip
    gpu = store.upsert_gpu(H200)
    pid = store.problem_id(problem, gpu)
    build = store.record_build(make_report(config))  # type: ignore[arg-type]
    store.record_measurement(pid, build, ok_result(ms, problem), H200)
    forget_results()


def _call(shape: Shape = DECODE) -> Call:
    return Call(0, H200.name, H200.sm_count, H200.compute_capability, shape, "bf16", False, 128,
                variant=PLAIN)  # fmt: skip


def test_without_results_the_default_tile_is_built_as_the_twin() -> None:
    choice = cache_choice(None, _call(), 16)
    assert choice.source == "default" and choice.kv_page is None
    assert choice.config.name.endswith("_kvc_pg16")


def test_a_dense_result_gives_its_tile(store: Store) -> None:
    _record(store, DENSE, DECODE, None)
    choice = cache_choice(store, _call(), 16)
    assert choice.config == dataclasses.replace(DENSE, kvcache=True, page=16)
    assert choice.source == "exact" and choice.kv_page is None
    assert "tuned as a KV-cache kernel" not in choice.describe(DECODE)


def test_a_tuned_cache_problem_of_the_layout_wins(store: Store) -> None:
    _record(store, DENSE, DECODE, None)
    _record(store, PAGED, DECODE, 16)
    choice = cache_choice(store, _call(), 16)
    assert choice.config == PAGED and choice.source == "exact" and choice.kv_page == 16
    assert "tuned as a KV-cache kernel" in choice.describe(DECODE)
    # Another capacity: the nearest tuned cache shape of the same phase.
    near = cache_choice(store, _call(Shape(1, 8208, 8, 32, 8)), 16)
    assert near.config == PAGED and near.source == "nearest" and near.measured == DECODE
    # Another layout: not this one's result, the dense tile as that layout's twin.
    other = cache_choice(store, _call(), 32)
    assert other.config == dataclasses.replace(DENSE, kvcache=True, page=32)
    assert other.kv_page is None
    contiguous = cache_choice(store, _call(), 0)
    assert contiguous.config == dataclasses.replace(DENSE, kvcache=True)
    assert contiguous.kv_page is None


def test_a_cache_problem_of_another_phase_does_not_answer(store: Store) -> None:
    _record(store, PAGED, Shape(4096, 8192, 8, 32, 8), 16)  # prefill over a paged cache
    choice = cache_choice(store, _call(), 16)
    assert choice.kv_page is None and choice.source == "default"


def test_a_faster_hopper_cache_result_does_not_hide_the_split_kv_one(store: Store) -> None:
    # The op launches split-KV's cache kernels only (OP_CACHE_FAMILY); the service answers
    # with the fa3 one, the op with the fastest split-KV one.
    chunk = Shape(2048, 34816, 1, 32, 8)
    fa3 = Fa3Config(128, "bf16", False, kvcache=True, page=16)
    skv = dataclasses.replace(PAGED, rows=64)
    _record(store, skv, chunk, 16, ms=5.0)
    _record(store, fa3, chunk, 16, ms=1.6)
    assert store.best_match(H200.name, 128, "bf16", False, chunk, kv_page=16).result.config == fa3
    choice = cache_choice(store, _call(chunk), 16)
    assert choice.config == skv and choice.source == "exact" and choice.kv_page == 16


CHUNK = Shape(2048, 34816, 1, 32, 8)
HOPPER = Fa3Config(128, "bf16", True, longest_first=True)


def _chunk_call(shape: Shape = CHUNK, cc: str = H200.compute_capability) -> Call:
    return Call(0, H200.name, H200.sm_count, cc, shape, "bf16", True, 128, variant=PLAIN)


def _record_dense_hopper(store: Store) -> None:
    problem = Problem(gpu=H200.name, d=128, n=CHUNK.nq, nk=CHUNK.nk, batch=1, heads=32,
                      kv_heads=8, dtype="bf16", causal=True)  # fmt: skip
    pid = store.problem_id(problem, store.upsert_gpu(H200))
    build = store.record_build(make_report(HOPPER))  # type: ignore[arg-type]
    store.record_measurement(pid, build, ok_result(1.6, problem), H200)
    forget_results()


def test_with_hopper_a_chunked_prefill_takes_the_dense_hopper_picks_twin(store: Store) -> None:
    _record_dense_hopper(store)
    for page in (0, 16, 256):
        choice = cache_choice(store, _chunk_call(), page, hopper=True)
        # The twin runs in tile order (no _lf) over the cache; measured as the dense pick.
        want = dataclasses.replace(HOPPER, longest_first=False, kvcache=True, page=page)
        assert choice.config == want and choice.source == "exact" and choice.kv_page is None
    # Without the setting, and where the family cannot serve: split-KV's kernels.
    assert cache_choice(store, _chunk_call(), 256).config.family == "splitkv"
    assert cache_choice(store, _chunk_call(), 4, hopper=True).config.family == "splitkv"
    ampere = cache_choice(store, _chunk_call(cc="8.0"), 256, hopper=True)
    assert ampere.config.family == "splitkv"
    decode = cache_choice(store, _chunk_call(Shape(1, 34816, 1, 32, 8)), 256, hopper=True)
    assert decode.config.family == "splitkv"


def test_with_hopper_a_tuned_fa3_cache_result_answers(store: Store) -> None:
    fa3 = Fa3Config(128, "bf16", True, kvcache=True, page=16)
    skv = dataclasses.replace(PAGED, rows=64, causal=True)
    _record(store, skv, CHUNK, 16, ms=5.0, causal=True)
    _record(store, fa3, CHUNK, 16, ms=1.6, causal=True)
    hopper = cache_choice(store, _chunk_call(), 16, hopper=True)
    assert hopper.config == fa3 and hopper.source == "exact" and hopper.kv_page == 16
    assert cache_choice(store, _chunk_call(), 16).config == skv


def test_with_hopper_and_nothing_tuned_the_family_default_serves() -> None:
    from codegen.families import family

    default = family("fa3").default(128, "bf16", True)
    for page in (0, 16, 256):
        choice = cache_choice(None, _chunk_call(), page, hopper=True)
        assert choice.config == dataclasses.replace(default, kvcache=True, page=page)
        assert choice.source == "default"
    assert cache_choice(None, _chunk_call(), 16).config.family == "splitkv"


MIXED = dataclasses.replace(PAGED, splits=4)


def test_a_mixed_length_problem_answers_its_shape_ahead_of_the_full_one(store: Store) -> None:
    # Tuned at the same shape both ways: the mix wins the tie (a serving batch's lengths
    # differ; the op cannot see them), however much faster the full-length figure is.
    _record(store, PAGED, DECODE, 16, ms=0.01)
    _record(store, MIXED, DECODE, 16, ms=0.05, kv_lengths="mixed")
    choice = cache_choice(store, _call(), 16)
    assert choice.config == MIXED and choice.source == "exact"
    assert choice.kv_page == 16 and choice.kv_lengths == "mixed"
    assert "on mixed lengths" in choice.describe(DECODE)
    # The pattern is per layout: pages of 256 tuned full only answer full.
    full256 = dataclasses.replace(PAGED, page=256)
    _record(store, full256, DECODE, 256)
    other = cache_choice(store, _call(), 256)
    assert other.config == full256 and other.kv_lengths == "full"


def test_an_exact_full_problem_beats_a_nearest_mixed_one(store: Store) -> None:
    # Batch 1 has no mix: its full-length problem is exact, the mixed one of batch 8 only
    # near, so the exact answer stays.
    single = Shape(1, 131072, 1, 32, 8)
    _record(store, PAGED, single, 16)
    _record(store, MIXED, DECODE, 16, kv_lengths="mixed")
    choice = cache_choice(store, _call(single), 16)
    assert choice.config == PAGED and choice.source == "exact" and choice.kv_lengths == "full"
    # A shape tuned neither way takes the nearer of the two.
    near = cache_choice(store, _call(Shape(1, 8208, 8, 32, 8)), 16)
    assert near.config == MIXED and near.source == "nearest" and near.kv_lengths == "mixed"
