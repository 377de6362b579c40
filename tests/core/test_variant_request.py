"""core.shape_request's variant parsing: the rule /v1/best, fa2tune best and fa2tune tune share."""

from __future__ import annotations

import math

import pytest

from core.shape_request import ShapeParamError, parse_window, resolve_variant
from core.variant import PLAIN, Variant


def test_resolve_variant_normalises_with_the_lengths() -> None:
    assert resolve_variant(False) == (False, PLAIN)
    assert resolve_variant(True, window_left=1024, nq=4096, nk=4096) == (True, Variant(1024, 0))
    # A window past every key is none; (-1, 0) is the causal mask.
    assert resolve_variant(False, window_left=4095, window_right=0, nq=4096, nk=4096) == (
        True,
        PLAIN,
    )
    capped = Variant(softcap=30.0, sinks=True)
    assert resolve_variant(False, softcap=30, sinks=True) == (False, capped)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"window_left": -2}, "window_left"),
        ({"window_right": 2**31}, "window_right"),
        ({"chunk": -1}, "chunk"),
        ({"softcap": -0.5}, "softcap"),
        ({"softcap": math.inf}, "softcap"),
        ({"softcap": math.nan}, "softcap"),
    ],
)
def test_resolve_variant_names_the_bad_argument(kwargs: dict[str, float], param: str) -> None:
    with pytest.raises(ShapeParamError) as info:
        resolve_variant(False, **kwargs)  # type: ignore[arg-type]
    assert info.value.param == param


def test_parse_window() -> None:
    assert parse_window("4096,0") == (4096, 0)
    assert parse_window("-1,128") == (-1, 128)
    for bad in ("4096", "a,b", "1,2,3", "-2,0", "4096, 0x"):
        with pytest.raises(ShapeParamError) as info:
            parse_window(bad)
        assert info.value.param == "window"
