"""The op's choice reads the store once per group of calls and matches shapes in memory.

A decode loop whose cache grows by one key a step (the serving case of issue 24) must not
ask the database at every step: :func:`fa2tune.ops.choice.choose` reads a group's candidates
(GPU, D, dtype, served mask, mode, variant switches) once and answers each later shape from
memory, with the store's own answer (:meth:`db.store.Store.best_match`) for every shape.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.shape import Shape
from core.variant import PLAIN, Variant
from db.shipped import load_shipped_results
from db.store import Store
from fa2tune.ops.choice import Call, choose, forget_results

DATA = Path(__file__).resolve().parents[2] / "db" / "data"


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    path = tmp_path_factory.mktemp("groups") / "shipped.db"
    store = Store.from_url(f"sqlite:///{path}")
    files = [DATA / "h200_results_decode.json", DATA / "h200_results_variants.json"]
    assert load_shipped_results(store, files) > 0
    yield store
    store.engine.dispose()


class Counting:
    """The store, counting its candidate reads."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.reads = 0

    def candidate_set(self, *args: Any, **kwargs: Any) -> Any:
        self.reads += 1
        return self.store.candidate_set(*args, **kwargs)


def _call(nk: int, variant: Variant = PLAIN, batch: int = 8, dtype: str = "bf16") -> Call:
    return Call(device=0, gpu="NVIDIA H200", sm_count=132, compute_capability="9.0",
                shape=Shape(1, nk, batch, 32, 8), dtype=dtype, causal=False, d=128,  # type: ignore[arg-type]
                variant=variant)  # fmt: skip


@pytest.mark.parametrize("variant", [PLAIN, Variant(4096, -1)])
def test_a_growing_decode_loop_reads_the_store_once(shipped: Store, variant: Variant) -> None:
    forget_results()
    counting = Counting(shipped)
    for nk in range(1000, 40_000, 997):  # 40 steps, none of them a tuned length but by luck
        call = _call(nk, variant)
        got = choose(counting, call)  # type: ignore[arg-type]
        want = shipped.best_match(call.gpu, 128, "bf16", False, call.shape, variant=variant)
        assert want is not None
        assert got.config == want.result.config
        assert got.source == ("exact" if want.result.exact else "nearest")
        assert got.measured == want.measured
    assert counting.reads == 1


def test_groups_are_kept_apart_and_forgotten(shipped: Store) -> None:
    forget_results()
    counting = Counting(shipped)
    choose(counting, _call(8192))  # type: ignore[arg-type]
    choose(counting, _call(8192, Variant(4096, -1)))  # type: ignore[arg-type]  # other switches
    choose(counting, _call(8192, dtype="fp16"))  # type: ignore[arg-type]  # another dtype
    choose(counting, _call(16384, batch=64))  # type: ignore[arg-type]  # the first group
    assert counting.reads == 3
    forget_results()  # results were written: the next call of a group reads again
    choose(counting, _call(8192))  # type: ignore[arg-type]
    assert counting.reads == 4


def test_a_tuned_length_is_answered_exactly_from_memory(shipped: Store) -> None:
    forget_results()
    counting = Counting(shipped)
    choose(counting, _call(5000))  # type: ignore[arg-type]  # reads the group
    exact = choose(counting, _call(32768, Variant(4096, -1)))  # type: ignore[arg-type]
    assert exact.source == "exact" and exact.config.name.endswith("_loc")
    assert choose(counting, _call(32768)).source == "exact"  # type: ignore[arg-type]
    assert counting.reads == 2
