"""Reference, input sets and the output check, with torch on whatever device it has.

Skipped where torch is not installed; on a CPU-only torch the reference runs on the CPU (SDPA
yardstick off), on a GPU machine these run on the GPU with the SDPA yardstick on.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from core.problem import Problem
from measure.reference import choose_pairs, dead_row_count, softmax_scale

torch = pytest.importorskip("torch")

from measure.reference import InputSet, as_bhnd, make_inputset  # noqa: E402
from measure.verify import check_output, error_floor, poison, tolerance  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def naive(q: Any, k: Any, v: Any, causal: bool, scale: float) -> tuple[Any, Any]:
    """Float64 attention on [B, H, N, D] views, the obvious way."""
    hq, hkv, nq, nk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    k = k.double().repeat_interleave(hq // hkv, dim=1)
    v = v.double().repeat_interleave(hq // hkv, dim=1)
    s = (q.double() @ k.transpose(-1, -2)) * scale
    if causal:
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(nk, device=q.device)[None, :]
        s = s.masked_fill(j > i + nk - nq, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return p @ v, lse


CASES = [
    # n, nk, causal, kv_heads, layout, dtype
    (64, None, False, None, "bnhd", "fp16"),
    (50, 80, True, 2, "bhnd", "bf16"),
    (80, 50, True, None, "bnhd", "fp16"),  # 30 rows see no key
    (33, None, True, 1, "bnhd", "fp16"),
]


def _inputs(
    n: int, nk: int | None, causal: bool, kvh: int | None, layout: str, dtype: str
) -> InputSet:
    p = Problem(
        gpu="t", d=32, n=n, nk=nk, batch=2, heads=4, kv_heads=kvh, causal=causal, dtype=dtype
    )  # type: ignore[arg-type]
    return make_inputset(p, layout, device=DEVICE, sdpa_ref=CUDA, chunk_bytes=4096)  # type: ignore[arg-type]


def _write_reference(inputs: InputSet) -> tuple[Any, Any]:
    o, lse = inputs.outputs()
    qb, kb, vb = inputs.bhnd()
    ro, rl = naive(qb, kb, vb, inputs.problem.causal, inputs.scale)
    as_bhnd(o, inputs.layout).copy_(ro.to(o.dtype))
    lse.copy_(rl.float())
    return o, lse


@pytest.mark.parametrize(("n", "nk", "causal", "kvh", "layout", "dtype"), CASES)
def test_reference_matches_naive_float64(
    n: int, nk: int | None, causal: bool, kvh: int | None, layout: str, dtype: str
) -> None:
    inputs = _inputs(n, nk, causal, kvh, layout, dtype)
    qb, kb, vb = inputs.bhnd()
    ro, rl = naive(qb, kb, vb, causal, inputs.scale)
    assert len(inputs.pairs) == 8  # small problem: every (batch, head) pair
    for p, (b, h) in enumerate(inputs.pairs):
        assert torch.allclose(inputs.ref_o[p].double(), ro[b, h], atol=2e-5)
        got, want = inputs.ref_lse[p].double(), rl[b, h]
        assert torch.equal(torch.isneginf(got), torch.isneginf(want))
        live = torch.isfinite(want)
        assert torch.allclose(got[live], want[live], atol=2e-5)
    dead = dead_row_count(n, nk or n, causal)
    assert inputs.dead_rows == dead
    if dead:
        assert bool((inputs.ref_o[:, :dead] == 0).all())
        assert bool(torch.isneginf(inputs.ref_lse[:, :dead]).all())


@pytest.mark.parametrize(("n", "nk", "causal", "kvh", "layout", "dtype"), CASES)
def test_check_output_accepts_the_right_answer_and_rejects_wrong_ones(
    n: int, nk: int | None, causal: bool, kvh: int | None, layout: str, dtype: str
) -> None:
    inputs = _inputs(n, nk, causal, kvh, layout, dtype)
    o, lse = inputs.outputs()
    poison(o, lse)
    ok, err, _rel, msg = check_output(o, lse, inputs)
    assert not ok and math.isinf(err) and "never written" in msg

    _write_reference(inputs)
    res = check_output(o, lse, inputs)
    assert res.ok, res.message
    assert res.max_abs_err <= tolerance(inputs)

    ob = as_bhnd(o, inputs.layout)
    ob[1, 3, n - 1, 5] += 0.5
    res = check_output(o, lse, inputs)
    assert not res.ok and "b=1 h=3" in res.message and res.max_abs_err > 0.4

    _write_reference(inputs)
    lse[0, 0, n - 1] += 0.1
    res = check_output(o, lse, inputs)
    assert not res.ok and "LSE" in res.message

    _write_reference(inputs)
    ob[0, 2, n // 2, 0] = float("nan")  # one unwritten element anywhere fails
    res = check_output(o, lse, inputs)
    assert not res.ok and "1 non-finite" in res.message


def test_dead_rows_must_be_zero_and_minus_inf() -> None:
    inputs = _inputs(80, 50, True, None, "bnhd", "fp16")
    o, lse = _write_reference(inputs)
    as_bhnd(o, "bnhd")[0, 0, 3, 0] = 0.25
    assert "O is not 0" in check_output(o, lse, inputs).message
    o, lse = _write_reference(inputs)
    lse[1, 1, 0] = 0.0
    assert "LSE is not -inf" in check_output(o, lse, inputs).message


def test_inputs_are_fresh_and_seeded() -> None:
    a = _inputs(16, None, False, None, "bnhd", "fp16")
    b = _inputs(16, None, False, None, "bnhd", "fp16")
    assert a.seed != b.seed and not torch.equal(a.q, b.q)
    assert bool((a.q != 0).any()) and a.q.dtype == torch.float16
    p = a.problem
    again = make_inputset(p, "bnhd", device=DEVICE, seed=a.seed, sdpa_ref=False)
    assert torch.equal(again.q, a.q) and torch.equal(again.v, a.v)


def test_bf16_tolerance_floor() -> None:
    inputs = _inputs(16, None, False, None, "bnhd", "bf16")
    assert tolerance(inputs) >= error_floor("bf16") >= 8e-3


def test_large_problem_checks_a_subset_of_pairs() -> None:
    p = Problem(gpu="t", d=32, n=256, batch=2, heads=8)
    pairs = choose_pairs(p, full_limit=1000, min_pairs=3, seed=1)
    assert len(pairs) == 3 and (0, 0) in pairs and (1, 7) in pairs
    inputs = make_inputset(p, "bnhd", device=DEVICE, sdpa_ref=False, full_limit=1000)
    assert inputs.ref_o.shape[0] == 3 and len(inputs.pairs) == 3
    o, lse = _write_reference(inputs)
    assert check_output(o, lse, inputs).ok


def test_softmax_scale() -> None:
    assert softmax_scale(64) == 0.125
