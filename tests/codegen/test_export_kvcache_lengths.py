"""The exported header's tuned KV-cache entries and their length patterns (CPU rendering).

A cache call's lengths live on the device, so the header, like the op, holds the winners of
both length patterns (``kv_lengths``) and its nearest-entry pick answers, the mixed winner
where both were tuned at one shape (a tie goes to it); the comment's provenance names each
entry's pattern; and the store side (:func:`service.header.export_header`) hands both patterns
to the exporter.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from codegen.dispatch_kvcache import CacheTuned, render_kvcache_table
from codegen.export import TunedPoint, cache_points, render_header
from core.problem import Problem
from core.shape import Shape
from core.splitkv_config import SplitKvConfig
from service.header import export_header
from tests.support.factories import H200, record_ok
from tests.support.kvcache_header import WHEN, probe_points
from tests.support.service_data import make_store

GPU = "Compile Test GPU"
BASE = SplitKvConfig(128, "fp16", False)
#: The paged (16) winners: full at the decode shape, mixed at half its capacity and at the
#: decode shape, full prefill.
FULL = replace(BASE, splits=32, kvcache=True, page=16)
MIXED = replace(BASE, splits=64, kvcache=True, page=16)
TIED = replace(BASE, splits=8, kvcache=True, page=16)
PREFILL = replace(BASE, splits=2, kvcache=True, page=16)
#: The contiguous cache's winner: full only.
CONTIGUOUS = replace(BASE, splits=16, kvcache=True)


def _point(config: SplitKvConfig, n: int = 1, nk: int = 8192, lengths: str = "full") -> TunedPoint:
    page = 16 if config.page else 0
    return TunedPoint(128, "fp16", False, n, config, nk=nk, batch=8, heads=32, kv_heads=8,
                      kv_page=page, kv_lengths=lengths, median_ms=0.05)  # fmt: skip


def _cache_points() -> list[TunedPoint]:
    return [
        _point(FULL),
        _point(MIXED, nk=4096, lengths="mixed"),
        _point(PREFILL, n=256),
        _point(CONTIGUOUS),
    ]


def _header(points: list[TunedPoint]) -> str:
    dense = [p for p in probe_points() if p.kv_page is None]
    return render_header(GPU, [*dense, *points], ds=[128], dtypes=["fp16"], generated_at=WHEN,
                         kv_pages=(0, 16))  # fmt: skip


def _tuned_names(header: str) -> list[str]:
    block = header.split("kKvTuned[] = {")[1].split("\n};")[0]
    return re.findall(r'false, "(\w+)", "\w+", &splitkv::launch_cache<', block)


def test_both_patterns_stay_and_a_tie_keeps_the_mixed_one() -> None:
    header = _header(_cache_points())
    names = [FULL.name, MIXED.name, PREFILL.name, CONTIGUOUS.name]
    assert sorted(_tuned_names(header)) == sorted(names)
    assert int(re.findall(r"kKvTunedCount = (\d+);", header)[0]) == 4
    # A mixed winner at the full one's shape: the mixed one is the entry there (the op's
    # tie), the full one not even compiled.
    tied = _header([*_cache_points(), _point(TIED, lengths="mixed")])
    assert sorted(_tuned_names(tied)) == sorted([TIED.name, MIXED.name, PREFILL.name,
                                                 CONTIGUOUS.name])  # fmt: skip
    assert FULL.name not in tied


def test_the_provenance_names_each_entrys_pattern() -> None:
    header = _header(_cache_points())
    mixed = f"Nk=4096, lengths mixed over [capacity/128, capacity]: {MIXED.name} (family splitkv)"
    assert mixed in header
    full = f"Nk=8192, every sequence at the capacity: {CONTIGUOUS.name} (family splitkv)"
    assert full in header
    assert "a tie going to the mixed one" in header


def test_the_choice_puts_the_mixed_points_first() -> None:
    points = _cache_points()
    kept = cache_points(points, (0, 16))
    assert [p.config.name for p in kept] == [MIXED.name, FULL.name, PREFILL.name, CONTIGUOUS.name]
    # A page size not exported: nothing of it, whatever its pattern.
    assert [p.config.name for p in cache_points(points, (0,))] == [CONTIGUOUS.name]


def test_the_table_takes_both_patterns_and_checks_them() -> None:
    decode = Shape(1, 8192, 8, 32, 8)
    both = [CacheTuned.of(FULL, decode), CacheTuned.of(MIXED, replace(decode, nk=4096), "mixed")]
    assert "kKvTunedCount = 2;" in render_kvcache_table([], (16,), both)
    with pytest.raises(ValueError, match="two tuned KV-cache entries"):
        render_kvcache_table([], (16,), [*both, CacheTuned.of(TIED, decode, "mixed")])
    with pytest.raises(ValueError, match="kv_lengths must be one of"):
        CacheTuned.of(MIXED, decode, "partial")


def test_a_point_checks_its_pattern() -> None:
    with pytest.raises(ValueError, match="kv_lengths must be one of"):
        _point(MIXED, lengths="Mixed")
    dense = probe_points()[0]
    with pytest.raises(ValueError, match="is a KV-cache problem's"):
        replace(dense, kv_lengths="mixed")


def test_the_store_side_hands_over_both_patterns(tmp_path: Path) -> None:
    with make_store(tmp_path) as store:
        decode = Problem(gpu=H200.name, d=128, n=1, nk=8192, batch=8, heads=32, kv_heads=8,
                         kv_page=16)  # fmt: skip
        record_ok(store, decode, FULL, 0.050)
        record_ok(store, replace(decode, nk=4096, kv_lengths="mixed"), MIXED, 0.040)
        header = export_header(store, "H200", [128], dtypes=["fp16"], generated_at=WHEN,
                               kv_pages=(16,))  # fmt: skip
    assert sorted(_tuned_names(header)) == sorted([MIXED.name, FULL.name])
    assert f"lengths mixed over [capacity/128, capacity]: {MIXED.name}" in header
