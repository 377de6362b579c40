"""A KV-cache problem's key (core.problem.Problem.kv_page): validation, study name and dict
form, and that a dense problem's forms are what they always were."""

from __future__ import annotations

import pytest

from core.problem import Problem, describe_kv_page, kv_page_of
from core.splitkv_config import SplitKvConfig
from core.variant import Variant


def _decode(**kw: object) -> Problem:
    return Problem(gpu="NVIDIA H200", d=128, n=1, nk=8192, batch=8, heads=32, kv_heads=8,
                   dtype="bf16", **kw)  # type: ignore[arg-type]  # fmt: skip


def test_dense_forms_are_unchanged() -> None:
    p = _decode()
    assert p.kv_page is None and not p.is_cache
    assert p.study_name == "nvidia-h200_d128_n1_nk8192_b8_h32_kv8_bf16_full"
    assert "kv_page" not in p.to_dict()
    assert Problem.from_dict(p.to_dict()) == p


@pytest.mark.parametrize(("page", "tail"), [(0, "_kvc"), (1, "_kvc_pg1"), (16, "_kvc_pg16"),
                                            (4096, "_kvc_pg4096")])  # fmt: skip
def test_a_cache_problem_names_its_layout(page: int, tail: str) -> None:
    p = _decode(kv_page=page)
    assert p.is_cache
    assert p.study_name == "nvidia-h200_d128_n1_nk8192_b8_h32_kv8_bf16_full" + tail
    assert p.to_dict()["kv_page"] == page
    assert Problem.from_dict(p.to_dict()) == p
    assert p.flops == _decode().flops  # the same attention as the dense problem
    assert p != _decode()


def test_the_layout_comes_after_the_variant_in_the_name() -> None:
    p = _decode(kv_page=16, variant=Variant(sinks=True))
    assert p.study_name.endswith("_snk_kvc_pg16")


@pytest.mark.parametrize("page", [3, 6, -1, 8192, True, 2.0, "16"])
def test_a_page_that_is_no_layout_is_refused(page: object) -> None:
    with pytest.raises(ValueError, match="kv_page must be"):
        _decode(kv_page=page)


def test_a_cache_problem_takes_no_seqlens() -> None:
    with pytest.raises(ValueError, match="takes no seqlens"):
        Problem.varlen("H200", 128, (100, 200), kv_page=16)


def test_a_configs_layout() -> None:
    base = SplitKvConfig(128, "fp16", False)
    assert kv_page_of(base) is None
    assert kv_page_of(SplitKvConfig(128, "fp16", False, kvcache=True)) == 0
    assert kv_page_of(SplitKvConfig(128, "fp16", False, kvcache=True, page=32)) == 32
    assert describe_kv_page(32) == "a paged KV cache of 32-token pages"
    assert describe_kv_page(0) == "a contiguous KV cache"
