"""The shipped KV-cache results (db/data/h200_results_kvcache.json) answer the serving
workload's cache calls, through the op and through the exported header.

Each entry of examples/workloads/llama3_8b_serving.yaml is asked as
:func:`fa2tune.torch.attention_with_kvcache` asks it (the cache's capacity as the key count,
the page size as the layout; :func:`fa2tune.ops.cache_choice.cache_choice`) and must get the
cache kernel tuned for exactly that problem and layout; the header exported from the same
store with those page sizes holds one tuned cache entry per problem, its winner.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.family import config_from_name, config_from_params
from core.problem import kv_page_of
from core.shape import Shape, effective_causal
from db.dump_format import load_dump
from db.store import Store
from fa2tune.ops.cache_choice import cache_choice
from fa2tune.ops.choice import Call
from service.header import export_header
from tests.support.shipped import shipped_store
from tuner.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "db" / "data" / "h200_results_kvcache.json"
WORKLOAD = ROOT / "examples" / "workloads" / "llama3_8b_serving.yaml"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    yield from shipped_store(tmp_path_factory, [SHIPPED])


def test_every_serving_call_gets_its_tuned_cache_kernel(store: Store) -> None:
    # The entries timed with every sequence full (the mixed ones ship in their own file,
    # tests/db/test_shipped_kvcache_mixed.py).
    targets = [t for t in load_workload(WORKLOAD).targets if t.kv_lengths == "full"]
    assert len(targets) == 54
    for t in targets:
        sh, page = t.shape, t.kv_page
        assert page in (16, 256)
        call = Call(
            device=0, gpu="NVIDIA H200", sm_count=132, compute_capability="9.0",
            shape=Shape(sh.nq, sh.nk, sh.batch, sh.heads, sh.kv_heads), dtype=t.dtype,
            causal=effective_causal(t.causal, sh.nq), d=t.d,
        )  # fmt: skip
        choice = cache_choice(store, call, page)
        assert choice.source == "exact", f"{t.describe()}: {choice.describe(call.shape)}"
        assert choice.kv_page == page == kv_page_of(choice.config)


def test_every_shipped_cache_build_is_a_cache_kernel_that_round_trips() -> None:
    dump = load_dump(SHIPPED)
    assert {p.kv_page for p in dump.problems} == {16, 256}
    for name in {b.config_name for b in dump.builds}:
        c = config_from_name(name)
        assert c.name == name and c.family == "splitkv"
        assert kv_page_of(c) in (16, 256)
        assert config_from_params(c.family, c.d, c.dtype, c.causal, c.params()) == c


def test_the_header_holds_each_tuned_cache_problems_winner(store: Store) -> None:
    winners = store.cache_winners("H200")
    assert len(winners) == 54 and {w.kv_page for w in winners} == {16, 256}
    assert store.cache_winners("H200", ["fa2", "fa3"]) == []  # no cache kernels of theirs
    assert store.cache_winners("H100") == []
    header = export_header(store, "H200", ds=[128], dtypes=["bf16"], kv_pages=(16, 256))
    table = header.split("kKvTuned[] = {")[1].split("\n};")[0]
    entry = (
        r"\{\{(\d+), (\d+), (\d+), (\d+), (\d+)\}, \{128, FA2TUNE_BF16, (true|false), "
        r'false, false, false, (\d+), false, "(\w+)"'
    )
    entries = re.findall(entry, table)
    got = {(tuple(map(int, e[:5])), e[5] == "true", int(e[6])): e[7] for e in entries}
    want = {
        ((w.n, w.nk, w.batch, w.heads, w.kv_heads), w.causal, w.kv_page): w.config.name
        for w in winners
    }
    assert got == want
    # Only the page sizes exported: a header of pages of 16 holds the 16-key winners alone.
    only16 = export_header(store, "H200", ds=[128], dtypes=["bf16"], kv_pages=(16,))
    assert only16.count("_kvc_pg256") == 0 and "kKvTunedCount = 27;" in only16
