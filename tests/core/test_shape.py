"""core.shape: the call shape, its validation, and the distance that picks the nearest tuned
shape (each term, symmetry, the grid-fill clamp, the tie-break toward the larger shape)."""

from __future__ import annotations

import math

import pytest

from core.problem import Problem
from core.shape import (
    MAX_DIM,
    MAX_WAVES,
    NOMINAL_BLOCK_ROWS,
    Shape,
    ShapeError,
    grid_fill,
    nearest_key,
    nearest_shape,
    shape_distance,
)
from core.shape_request import (
    DEFAULT_BATCH,
    DEFAULT_HEADS,
    ShapeParamError,
    resolve_shape,
)

SMS = 132


def square(n: int, batch: int = 2, heads: int = 16) -> Shape:
    return Shape(n, n, batch, heads, heads)


SHAPES = [
    square(4096),
    Shape(1, 8192, 8, 32, 8),
    Shape(512, 2048, 1, 8, 1),
    square(1, 1, 1),
    Shape(MAX_DIM, MAX_DIM, MAX_DIM, MAX_DIM, MAX_DIM),
]


@pytest.mark.parametrize("shape", SHAPES)
def test_distance_zero_for_the_same_shape(shape: Shape) -> None:
    assert shape_distance(shape, shape, SMS) == 0.0
    assert nearest_shape(shape, [square(2048), shape, square(8192)], SMS) == shape


@pytest.mark.parametrize("a", SHAPES)
@pytest.mark.parametrize("b", SHAPES)
def test_distance_is_symmetric_and_non_negative(a: Shape, b: Shape) -> None:
    assert shape_distance(a, b, SMS) == pytest.approx(shape_distance(b, a, SMS))
    assert shape_distance(a, b, SMS) >= 0.0


def test_length_terms() -> None:
    # Few blocks on many SMs: the fill term is the only other one that moves, so hold it
    # still by keeping ceil(nq / 128) equal.
    base = Shape(100, 1000, 1, 1, 1)
    assert shape_distance(base, Shape(100, 4000, 1, 1, 1), SMS) == pytest.approx(math.log(4))
    assert shape_distance(base, Shape(50, 1000, 1, 1, 1), SMS) == pytest.approx(math.log(2))


def test_fill_term() -> None:
    # Same lengths, group 1; batch x heads from 1 to 4 quadruples the blocks (below the clamp).
    a, b = Shape(4096, 4096, 1, 1, 1), Shape(4096, 4096, 2, 2, 2)
    assert grid_fill(a, SMS) == pytest.approx(32 / SMS)
    assert grid_fill(b, SMS) == pytest.approx(4 * 32 / SMS)
    assert shape_distance(a, b, SMS) == pytest.approx(math.log(4))
    # The fill counts nominal blocks: rows are rounded up to NOMINAL_BLOCK_ROWS.
    assert grid_fill(Shape(1, 1, 1, 1, 1), SMS) == grid_fill(
        Shape(NOMINAL_BLOCK_ROWS, 1, 1, 1, 1), SMS
    )


def test_gqa_term() -> None:
    mha, gqa = Shape(1024, 1024, 2, 32, 32), Shape(1024, 1024, 2, 32, 4)
    assert shape_distance(mha, gqa, SMS) == pytest.approx(math.log(8))


def test_grid_fill_is_clamped() -> None:
    huge, bigger = Shape(65536, 65536, 8, 64, 64), Shape(65536, 65536, 64, 64, 64)
    assert grid_fill(huge, SMS) == grid_fill(bigger, SMS) == MAX_WAVES
    assert shape_distance(huge, bigger, SMS) == 0.0  # both fill the GPU many times over
    assert grid_fill(Shape(1, 1, 1, 1, 1), SMS) == pytest.approx(1 / SMS)
    # An unknown SM count of 0 is read as 1, not a division by zero.
    assert grid_fill(Shape(1, 1, 1, 1, 1), 0) == 1.0
    # The SM count matters below the clamp: one wave on 132 SMs is two on 66.
    one_wave = Shape(128 * 66, 1, 1, 1, 1)
    assert grid_fill(one_wave, 132) == pytest.approx(0.5)
    assert grid_fill(one_wave, 66) == pytest.approx(1.0)


def test_tie_goes_to_the_larger_shape() -> None:
    # 2048 is the geometric midpoint of 1024 and 4096 (fill ratios 2 and 2 too).
    asked = square(2048)
    assert shape_distance(asked, square(1024), SMS) == pytest.approx(
        shape_distance(asked, square(4096), SMS)
    )
    assert nearest_shape(asked, [square(1024), square(4096)], SMS) == square(4096)
    assert nearest_shape(asked, [square(4096), square(1024)], SMS) == square(4096)
    assert nearest_key(asked, square(4096), SMS) < nearest_key(asked, square(1024), SMS)


def test_nearest_picks_the_decode_like_shape() -> None:
    decode = Shape(1, 8192, 8, 32, 8)
    tuned = [square(1024), square(8192), Shape(1, 4096, 8, 32, 8)]
    assert nearest_shape(decode, tuned, SMS) == Shape(1, 4096, 8, 32, 8)
    assert nearest_shape(decode, [], SMS) is None


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((0, 1, 1, 1, 1), "nq must be between 1 and"),
        ((1, 0, 1, 1, 1), "nk must be between 1 and"),
        ((1, 1, MAX_DIM + 1, 1, 1), "batch must be between 1 and"),
        ((1, 1, 1, -3, 1), "heads must be between 1 and"),
        ((1, 1, 1, 16, 0), "kv_heads must be between 1 and"),
        ((1, 1, 1, 16, 3), "heads (16) must be a multiple of kv_heads (3)"),
        ((1.5, 1, 1, 1, 1), "nq must be an integer"),
        ((True, 1, 1, 1, 1), "nq must be an integer"),
    ],
)
def test_validation_errors(args: tuple[object, ...], needle: str) -> None:
    with pytest.raises(ShapeError) as info:
        Shape(*args)  # type: ignore[arg-type]
    assert needle in str(info.value)
    assert isinstance(info.value, ValueError)


def test_describe_and_group() -> None:
    assert Shape(1, 8192, 8, 32, 8).describe() == "B=8 H=32/8kv Nq=1 Nk=8192"
    assert square(4096).describe() == "B=2 H=16 Nq=4096 Nk=4096"
    assert Shape(1, 1, 1, 32, 8).group == 4


# ------------------------------------------------------------------ core.shape_request


def test_defaults_are_the_campaigns() -> None:
    problem = Problem(gpu="H200", d=128, n=4096)
    assert (problem.batch, problem.heads) == (DEFAULT_BATCH, DEFAULT_HEADS)


def test_resolve_shape() -> None:
    assert resolve_shape(4096) is None  # n alone: the per-N answer
    assert resolve_shape(4096, batch=2) == square(4096)
    assert resolve_shape(None, nq=1, nk=8192) == Shape(1, 8192, 2, 16, 16)
    assert resolve_shape(1, nq=1, heads=32, kv_heads=8) == Shape(1, 1, 2, 32, 8)
    assert resolve_shape(None, nq=7, heads=4) == Shape(7, 7, 2, 4, 4)


@pytest.mark.parametrize(
    ("n", "kwargs", "param"),
    [
        (None, {}, "n"),
        (None, {"nk": 5}, "n"),
        (4, {"nq": 5}, "nq"),
        (4, {"kv_heads": 3}, "kv_heads"),
        (4, {"heads": 6, "kv_heads": 4}, "kv_heads"),
        (4, {"nk": 0}, "nk"),
        (4, {"batch": MAX_DIM + 1}, "batch"),
        (0, {"nq": 1}, "n"),
    ],
)
def test_resolve_shape_rejects(n: int | None, kwargs: dict[str, int], param: str) -> None:
    with pytest.raises(ShapeParamError) as info:
        resolve_shape(n, **kwargs)
    assert info.value.param == param
