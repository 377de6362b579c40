"""The shipped mixed-length KV-cache results (db/data/h200_results_kvcache_mixed.json) answer
the decode calls they were tuned for, beside the full-length ones, by the op's rule.

Each entry of bench/h200/decode_mixed_workload.yaml is asked as
:func:`fa2tune.torch.attention_with_kvcache` asks it, over a store holding the full-length
split-KV results too: the config tuned on the mixed lengths of exactly that problem serves (a
tie with a full problem at the same shape goes to the mix); a batch-1 call, tuned full only,
keeps its own exact answer; and every shipped measurement is a verified one of a mixed problem.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from core.problem import kv_page_of
from core.shape import Shape
from db.dump_format import load_dump
from db.store import Store
from fa2tune.ops.cache_choice import cache_choice
from fa2tune.ops.choice import Call
from tests.support.shipped import shipped_store
from tuner.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "db" / "data"
SHIPPED = DATA / "h200_results_kvcache_mixed.json"
WORKLOAD = ROOT / "bench" / "h200" / "decode_mixed_workload.yaml"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    yield from shipped_store(tmp_path_factory, [SHIPPED, DATA / "h200_results_kvcache.json"])


def _call(shape: Shape) -> Call:
    return Call(0, "NVIDIA H200", 132, "9.0", shape, "bf16", False, 128)


def test_the_file_holds_the_workloads_mixed_problems_verified() -> None:
    dump = load_dump(SHIPPED)
    targets = load_workload(WORKLOAD).targets
    assert len(targets) == len(dump.problems) == 15
    assert {p.kv_lengths for p in dump.problems} == {"mixed"}
    assert {p.kv_page for p in dump.problems} == {0, 16, 256}
    names = {t.problem("NVIDIA H200").study_name for t in targets}
    assert all(name.endswith("_mix") for name in names)
    assert dump.measurements and {m.status for m in dump.measurements} == {"OK"}


def test_every_mixed_decode_call_gets_its_mixed_winner(store: Store) -> None:
    for t in load_workload(WORKLOAD).targets:
        sh = t.shape
        shape = Shape(sh.nq, sh.nk, sh.batch, sh.heads, sh.kv_heads)
        choice = cache_choice(store, _call(shape), t.kv_page)
        assert choice.source == "exact", f"{t.describe()}: {choice.describe(shape)}"
        assert choice.kv_lengths == "mixed" and kv_page_of(choice.config) == t.kv_page
        want = store.best_for_shape("NVIDIA H200", 128, "bf16", False, shape, exact=True,
                                    kv_page=t.kv_page, kv_lengths="mixed")  # fmt: skip
        assert want is not None and choice.config == want.config


def test_a_batch_of_one_keeps_its_full_answer(store: Store) -> None:
    single = Shape(1, 131072, 1, 32, 8)
    choice = cache_choice(store, _call(single), 16)
    assert choice.source == "exact" and choice.kv_lengths == "full"
    # The service's and the CLI's answer without a pattern is the op's.
    served = store.best_for_cache_call("NVIDIA H200", 128, "bf16", False,
                                       Shape(1, 32768, 32, 32, 8), kv_page=16)  # fmt: skip
    assert served is not None and served.kv_lengths == "mixed" and served.exact
    full = store.best_for_cache_call("NVIDIA H200", 128, "bf16", False,
                                     Shape(1, 32768, 32, 32, 8), kv_page=16,
                                     kv_lengths="full")  # fmt: skip
    assert full is not None and full.kv_lengths == "full" and full.config != served.config
