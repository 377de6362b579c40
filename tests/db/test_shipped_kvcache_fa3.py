"""The shipped Hopper-family KV-cache results (db/data/h200_results_kvcache_fa3.json) answer
the serving workload's chunked prefills on an H200, and only where they should.

Each entry of bench/h200/chunked_prefill_workload.yaml (the chunked prefills of
examples/workloads/llama3_8b_serving.yaml, a contiguous cache and pages of 16 and 256) is asked
as :func:`fa2tune.torch.attention_with_kvcache` asks it, over a store holding both families'
shipped cache results: with the Hopper family's cache kernels allowed (``Settings.fa3_cache``,
the default) the fa3 config tuned for exactly that problem and layout serves; without, the
split-KV one tuned for it (pages of 16 and 256) does. The exported header launches split-KV's
cache kernels only, so its tuned cache entries stay split-KV's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from codegen.dispatch_kvcache import header_cache_families
from codegen.families.fa3.space import cache_reasons
from core.fa3_config import Fa3Config
from core.family import config_from_name
from core.problem import kv_page_of
from core.shape import Shape, effective_causal
from db.dump_format import load_dump
from db.store import Store
from fa2tune.ops.cache_choice import cache_choice
from fa2tune.ops.choice import Call
from tests.support.shipped import shipped_store
from tuner.workload import Target, load_workload

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "db" / "data"
SHIPPED = DATA / "h200_results_kvcache_fa3.json"
WORKLOAD = ROOT / "bench" / "h200" / "chunked_prefill_workload.yaml"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    yield from shipped_store(tmp_path_factory, [SHIPPED, DATA / "h200_results_kvcache.json"])


def _call(t: Target) -> Call:
    sh = t.shape
    return Call(
        device=0, gpu="NVIDIA H200", sm_count=132, compute_capability="9.0",
        shape=Shape(sh.nq, sh.nk, sh.batch, sh.heads, sh.kv_heads), dtype=t.dtype,
        causal=effective_causal(t.causal, sh.nq), d=t.d,
    )  # fmt: skip


def test_every_chunked_prefill_gets_its_tuned_hopper_cache_kernel(store: Store) -> None:
    targets = load_workload(WORKLOAD).targets
    assert len(targets) == 24 and {t.kv_page for t in targets} == {0, 16, 256}
    for t in targets:
        choice = cache_choice(store, _call(t), t.kv_page, hopper=True)
        assert choice.source == "exact", t.describe()
        assert choice.config.family == "fa3" and kv_page_of(choice.config) == t.kv_page


def test_without_the_hopper_kernels_the_split_kv_results_serve(store: Store) -> None:
    for t in load_workload(WORKLOAD).targets:
        choice = cache_choice(store, _call(t), t.kv_page, hopper=False)
        assert choice.config.family == "splitkv", t.describe()
        # split-KV's serving campaign tuned pages of 16 and 256, not a contiguous cache
        assert (choice.source == "exact") == (t.kv_page != 0), t.describe()


def test_a_decode_step_keeps_to_split_kv_with_the_hopper_kernels_allowed(store: Store) -> None:
    decode = Call(device=0, gpu="NVIDIA H200", sm_count=132, compute_capability="9.0",
                  shape=Shape(1, 34816, 1, 32, 8), dtype="bf16", causal=False, d=128)  # fmt: skip
    assert cache_choice(store, decode, 16, hopper=True).config.family == "splitkv"


def test_every_shipped_build_is_a_hopper_cache_kernel_of_the_space() -> None:
    dump = load_dump(SHIPPED)
    assert {p.kv_page for p in dump.problems} == {0, 16, 256}
    for name in {b.config_name for b in dump.builds}:
        c = config_from_name(name)
        assert isinstance(c, Fa3Config) and c.name == name
        assert kv_page_of(c) in (0, 16, 256) and cache_reasons(c) == []


def test_the_header_keeps_to_the_cache_kernels_it_launches(store: Store) -> None:
    winners = store.cache_winners("H200", header_cache_families())
    assert winners and {w.config.family for w in winners} == {"splitkv"}
    assert {w.config.family for w in store.cache_winners("H200")} == {"fa3", "splitkv"}
