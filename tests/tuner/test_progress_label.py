"""The campaign's per-problem label (tuner.progress.problem_label) tells apart every two
problems one campaign may hold: the summary table and the per-problem lines print it."""

from __future__ import annotations

from dataclasses import replace

from core.problem import Problem
from core.variant import Variant
from tuner.progress import problem_label

BASE = Problem(gpu="NVIDIA H200", d=128, n=2048, batch=1, heads=32, dtype="bf16", causal=True,
               kv_heads=8)  # fmt: skip


def test_a_plain_square_problem_reads_as_before() -> None:
    plain = Problem(gpu="NVIDIA H200", d=128, n=4096, dtype="fp16", causal=True)
    assert problem_label(plain) == "d128 n4096 fp16 causal b2 h16"


def test_keys_heads_varlen_variant_and_layout_are_in_the_label() -> None:
    assert problem_label(BASE) == "d128 n2048 bf16 causal b1 h32:8"
    cached = replace(BASE, nk=34816, kv_page=16)
    assert problem_label(cached) == "d128 n2048 nk34816 bf16 causal b1 h32:8 pg16"
    assert problem_label(replace(cached, kv_page=0)).endswith(" kvc")
    windowed = replace(BASE, variant=Variant(window_left=128, window_right=0))
    assert "window (128, 0)" in problem_label(windowed)
    packed = Problem.varlen("NVIDIA H200", 64, (100, 300, 7))
    assert "varlen 7-300" in problem_label(packed)


def test_a_chunked_prefill_campaigns_problems_have_distinct_labels() -> None:
    problems = [
        replace(BASE, batch=b, nk=None if cached == 0 else 2048 + cached, kv_page=page)
        for b in (1, 4)
        for cached in (0, 2048, 8192, 32768)
        for page in (0, 16, 256)
    ]
    assert len({problem_label(p) for p in problems}) == len(problems) == 24
