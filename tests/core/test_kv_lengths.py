"""A KV-cache problem's length pattern (core.kv_lengths, core.problem): the mixed spread's
bounds and stability, the problem key and FLOP count it changes, and the rule that picks the
pattern a cache call is answered from."""

from __future__ import annotations

import pytest

from core.kv_lengths import MIXED_SPREAD, answering_pattern, mixed_lengths, pattern_lengths
from core.problem import Problem
from core.shape import Shape


@pytest.mark.parametrize(("batch", "capacity"), [(1, 1), (2, 100), (32, 32768), (128, 8192)])
def test_a_mix_spans_its_range_with_one_sequence_full(batch: int, capacity: int) -> None:
    lengths = mixed_lengths(batch, capacity)
    assert len(lengths) == batch and max(lengths) == capacity
    assert min(lengths) >= max(1, capacity // MIXED_SPREAD)
    if batch >= 32:  # a spread, not a constant: many distinct lengths, most below the capacity
        assert len(set(lengths)) > batch // 2
        assert sum(lengths) < 0.5 * batch * capacity


def test_a_mix_is_fixed_by_its_batch_and_capacity() -> None:
    mixed_lengths.cache_clear()
    first = mixed_lengths(32, 32768)
    mixed_lengths.cache_clear()
    assert mixed_lengths(32, 32768) == first
    assert pattern_lengths("full", 3, 10) == (10, 10, 10)
    with pytest.raises(ValueError, match="batch >= 1"):
        mixed_lengths(0, 10)


def test_the_pattern_is_part_of_the_key_and_the_flops() -> None:
    full = Problem(gpu="H200", d=128, n=1, nk=32768, batch=32, heads=32, kv_heads=8,
                   dtype="bf16", kv_page=16)  # fmt: skip
    mixed = Problem(**{**full.to_dict(), "kv_lengths": "mixed"})  # type: ignore[arg-type]
    assert mixed.study_name == full.study_name + "_mix"
    assert "kv_lengths" not in full.to_dict() and mixed.to_dict()["kv_lengths"] == "mixed"
    assert Problem.from_dict(mixed.to_dict()) == mixed
    assert mixed.cache_lengths == mixed_lengths(32, 32768)
    assert full.cache_lengths == (32768,) * 32
    per_key = 4.0 * 32 * 1 * 128
    assert mixed.flops == pytest.approx(per_key * sum(mixed_lengths(32, 32768)))
    assert full.flops == pytest.approx(per_key * 32 * 32768)
    with pytest.raises(ValueError, match="needs kv_page"):
        Problem(gpu="H200", d=128, n=1, kv_lengths="mixed")
    with pytest.raises(ValueError, match="kv_lengths must be one of"):
        Problem(gpu="H200", d=128, n=1, kv_page=16, kv_lengths="half")


def test_the_nearer_pattern_answers_and_a_tie_goes_to_mixed() -> None:
    at = Shape(1, 8192, 8, 32, 8)
    assert answering_pattern({}) is None
    assert answering_pattern({"full": (0.0, at), "mixed": None}) == "full"
    assert answering_pattern({"full": (0.0, at), "mixed": (0.0, at)}) == "mixed"
    assert answering_pattern({"full": (0.0, at), "mixed": (0.5, at)}) == "full"
    assert answering_pattern({"full": (0.7, at), "mixed": (0.5, at)}) == "mixed"
    # Equal distances, different shapes: the larger shape wins (core.shape.nearest_key).
    longer = Shape(1, 16384, 8, 32, 8)
    assert answering_pattern({"full": (0.5, longer), "mixed": (0.5, at)}) == "full"
