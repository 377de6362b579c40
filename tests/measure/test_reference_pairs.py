"""Which (batch, head) pairs the float32 reference covers (torch-free: the rule alone)."""

from __future__ import annotations

import json
from pathlib import Path

from core.problem import Problem
from measure.reference import FULL_CHECK_WORK, MIN_PAIRS, REFERENCE_BYTES, choose_pairs

DATA = Path(__file__).resolve().parents[2] / "db" / "data"


def shipped_problems() -> list[Problem]:
    """Every dense problem of the shipped H200 results."""
    out = []
    for path in sorted(DATA.glob("*.json")):
        for p in json.loads(path.read_text())["problems"]:
            if p.get("seqlens"):
                continue  # packed batches are checked sequence by sequence elsewhere
            out.append(Problem(gpu=p["gpu"], d=p["d"], n=p["n"], nk=p["nk"], batch=p["batch"],
                               heads=p["heads"], kv_heads=p["kv_heads"], dtype=p["dtype"],
                               causal=p["causal"]))  # fmt: skip
    return out


def test_every_pair_of_every_shipped_problem_is_checked() -> None:
    problems = shipped_problems()
    assert len(problems) > 150  # the families, decode, GQA prefill and variant shapes
    for p in problems:
        assert len(choose_pairs(p)) == p.batch * p.heads, p
    # Within the budget by the work bound itself, not by a pair count that happens to fit.
    work = max(p.batch * p.heads * p.n * p.n_keys * p.d for p in problems)
    assert FULL_CHECK_WORK // 4 < work <= FULL_CHECK_WORK


def test_past_the_budget_as_many_pairs_as_it_covers() -> None:
    # Per pair 2^16 * 2^16 * 2^7 = 2^39 multiply-adds: the budget covers 2^6 = 64 pairs.
    p = Problem(gpu="g", d=128, n=2**16, batch=4, heads=64, kv_heads=8)
    pairs = choose_pairs(p, seed=3)
    assert len(pairs) == FULL_CHECK_WORK // 2**39 == 64
    assert len(set(pairs)) == len(pairs) and list(pairs) == sorted(pairs)
    assert (0, 0) in pairs and (3, 63) in pairs  # both ends: batch and head strides
    assert all(0 <= b < 4 and 0 <= h < 64 for b, h in pairs)
    assert choose_pairs(p, seed=3) == pairs  # a seed names its pairs
    # A tighter budget still checks the fewest it promises.
    assert len(choose_pairs(p, full_limit=1)) == MIN_PAIRS


def test_the_reference_output_bounds_the_pairs() -> None:
    # A long decode-free prefill of small work per pair but a large output per pair: the
    # output bound (pairs x Nq x D float32) decides.
    p = Problem(gpu="g", d=256, n=2**20, nk=8, batch=1, heads=64)
    per_pair_bytes = 4 * 2**20 * 256
    assert len(choose_pairs(p)) == REFERENCE_BYTES // per_pair_bytes == 4
