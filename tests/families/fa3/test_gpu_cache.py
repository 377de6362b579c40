"""The Hopper family's KV-cache kernels through the worker on an H100/H200 (marker ``gpu``):
build -> load -> verify -> time in the isolated child, as a campaign measures them.

Chunked-prefill shapes (queries over a cached prefix: odd lengths, Nq > Nk with dead rows,
GQA and MHA, causal bottom-right and not, a sliding window) on a contiguous cache and on pages
of 16, 64 and 256 keys (a page smaller than a tile: several TMA boxes per tile; a page of whole
tiles: one), through a shuffled block table with every sequence's length on the device and
rows past it filled with other values; each is checked against the dense float32 reference
(O and LSE of every (batch, head) pair, outputs poisoned, rechecked after timing).

Skipped with the reason without torch, cuda-bindings, nvcc or a compute capability 9.0 GPU.
Run on the GPU machine: ``pytest -m gpu tests/families/fa3/test_gpu_cache.py``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from core.fa3_config import Fa3Config
from core.problem import Problem
from core.variant import PLAIN, Variant
from tests.support.gpu import family_skip_reason, measure_cache_jobs

_WHY = family_skip_reason("fa3")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_WHY is not None, reason=f"GPU tests: {_WHY}"),
]

#: (nq, nk, batch, heads, kv_heads, causal, variant).
CASES = [
    (300, 1500, 2, 16, 4, True, PLAIN),  # a chunk over a cached prefix, GQA
    (77, 777, 3, 8, 2, True, PLAIN),  # one partial query tile
    (200, 150, 1, 8, 8, True, PLAIN),  # Nq > Nk: leading rows see no key
    (128, 4099, 1, 8, 8, False, PLAIN),  # unmasked, odd key count
    (256, 3000, 2, 16, 4, True, Variant(window_left=500)),  # a sliding window
]
PAGES = (0, 16, 64, 256)
#: Tiles: two consumer warpgroups with ping-pong, and one (no register split).
TILES = [
    Fa3Config(128, "bf16", True),
    Fa3Config(128, "bf16", True, block_m=64, block_n=128, pingpong=False),
]


def test_worker_measures_fa3_cache_kernels_of_every_layout() -> None:
    jobs: list[tuple[Fa3Config, Problem]] = []
    for nq, nk, b, h, hkv, causal, variant in CASES:
        for page in PAGES:
            problem = Problem(
                gpu="", d=128, n=nq, nk=nk, batch=b, heads=h, kv_heads=hkv, dtype="bf16",
                causal=causal, variant=variant, kv_page=page,
            )  # fmt: skip
            for tile in TILES:
                jobs.append((replace(tile, causal=causal, kvcache=True, page=page,
                                     **variant.needs), problem))  # fmt: skip
    failures = measure_cache_jobs(jobs)
    assert not failures, "\n".join(failures)
