"""The float32 reference of attention variants against a brute-force loop, on the CPU.

The loop (:func:`brute`) writes :mod:`core.variant`'s rules the slow, obvious way: per
(batch, head, row) a Python predicate over every key, float64 scores, the softcap, the sink
as one more term of the denominator. The reference (``measure.reference``) must agree on
every (batch, head) pair for windows (left only, right only, two-sided, with causal),
chunks (alone, with a window, with causal), softcap, sinks and all together; Nq != Nk both
ways (rows that see no key), GQA and MQA, both layouts, packed varlen sequences. Also the
dead-row count, the visible-pair FLOPs, the output check's rules for variants, and the
plain reference unchanged.

Skipped where torch is not installed; runs on the CPU (SDPA is not needed).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from core.problem import Problem
from core.variant import PLAIN, Variant

torch = pytest.importorskip("torch")

from measure.reference import (  # noqa: E402
    InputSet,
    as_bhnd,
    dead_row_count,
    emulated_error,
    make_inputset,
    make_sinks,
    reference_for_pairs,
)
from measure.varlen import check_varlen, make_varlen_inputs  # noqa: E402
from measure.verify import check_output  # noqa: E402
from tests.support.variant_rule import sees  # noqa: E402


def brute(
    qb: Any, kb: Any, vb: Any, causal: bool, scale: float, v: Variant, sinks: Any
) -> tuple[Any, Any]:
    """Float64 O [B, Hq, Nq, D] and LSE [B, Hq, Nq] by loops over rows and keys."""
    b, hq, nq, d = qb.shape
    hkv, nk = kb.shape[1], kb.shape[2]
    o = torch.zeros((b, hq, nq, d), dtype=torch.float64)
    lse = torch.full((b, hq, nq), -math.inf, dtype=torch.float64)
    for bi in range(b):
        for h in range(hq):
            kh = h * hkv // hq
            for i in range(nq):
                terms: list[tuple[float, int]] = []
                for j in range(nk):
                    if not sees(i, j, nq, nk, causal, v):
                        continue
                    s = float(qb[bi, h, i].double() @ kb[bi, kh, j].double()) * scale
                    if v.softcap > 0:
                        s = v.softcap * math.tanh(s / v.softcap)
                    terms.append((s, j))
                logits = [s for s, _ in terms] + ([float(sinks[h])] if v.sinks else [])
                if not logits:
                    continue  # no key, no sink: O = 0, LSE = -inf
                m = max(logits)
                total = sum(math.exp(x - m) for x in logits)
                lse[bi, h, i] = m + math.log(total)
                for s, j in terms:
                    o[bi, h, i] += math.exp(s - float(lse[bi, h, i])) * vb[bi, kh, j].double()
    return o, lse


# (nq, nk, causal, heads, kv_heads, layout, variant)
CASES = [
    (13, 13, False, 2, 2, "bnhd", Variant(window_left=3)),
    (13, 20, False, 2, 1, "bhnd", Variant(window_left=2, window_right=4)),
    (20, 9, False, 4, 2, "bnhd", Variant(window_right=1)),  # leading rows see no key
    (20, 9, True, 2, 2, "bhnd", Variant(window_left=4, window_right=0)),
    (17, 17, True, 2, 2, "bnhd", Variant(window_left=5, window_right=0)),
    (19, 19, False, 2, 2, "bnhd", Variant(chunk=4)),
    (11, 23, True, 4, 1, "bhnd", Variant(window_right=0, chunk=5)),
    (23, 11, False, 2, 2, "bnhd", Variant(chunk=4)),  # nq > nk: a chunk hides rows before 0
    (15, 30, False, 2, 2, "bhnd", Variant(window_left=6, window_right=2, chunk=8)),
    (16, 16, False, 2, 2, "bnhd", Variant(softcap=15.0)),
    (9, 21, True, 4, 2, "bhnd", Variant(softcap=50.0)),
    (16, 16, False, 2, 1, "bnhd", Variant(sinks=True)),
    (21, 9, True, 2, 2, "bnhd", Variant(sinks=True)),  # dead rows: LSE is the sink
    (18, 12, True, 4, 2, "bhnd",
     Variant(window_left=3, window_right=0, chunk=6, softcap=15.0, sinks=True)),
    (7, 1, False, 2, 2, "bnhd", Variant(window_left=0, window_right=0, sinks=True)),
    (4, 33, True, 4, 1, "bhnd", Variant(window_left=7, window_right=0, softcap=50.0,
                                        sinks=True)),  # decode-like
]  # fmt: skip


def _problem(
    nq: int, nk: int, causal: bool, h: int, hkv: int, v: Variant, dtype: str = "fp16"
) -> Problem:
    return Problem(
        gpu="t", d=16, n=nq, nk=nk if nk != nq else None, batch=2, heads=h,
        kv_heads=hkv if hkv != h else None, causal=causal, dtype=dtype, variant=v,  # type: ignore[arg-type]
    )  # fmt: skip


def _inputs(nq: int, nk: int, causal: bool, h: int, hkv: int, layout: str, v: Variant) -> InputSet:
    p = _problem(nq, nk, causal, h, hkv, v)
    # A small chunk_bytes: several row chunks, so chunk boundaries are exercised too.
    return make_inputset(p, layout, device="cpu", seed=7, sdpa_ref=False, chunk_bytes=1024)  # type: ignore[arg-type]


@pytest.mark.parametrize(("nq", "nk", "causal", "h", "hkv", "layout", "v"), CASES)
def test_reference_matches_the_brute_force_loop(
    nq: int, nk: int, causal: bool, h: int, hkv: int, layout: str, v: Variant
) -> None:
    inputs = _inputs(nq, nk, causal, h, hkv, layout, v)
    assert (inputs.sinks is not None) == v.sinks
    qb, kb, vb = inputs.bhnd()
    ro, rl = brute(qb, kb, vb, causal, inputs.scale, v, inputs.sinks)
    assert len(inputs.pairs) == 2 * h  # every (batch, head) pair
    for p, (b, hh) in enumerate(inputs.pairs):
        assert torch.allclose(inputs.ref_o[p].double(), ro[b, hh], atol=1e-5), (b, hh)
        got, want = inputs.ref_lse[p].double(), rl[b, hh]
        assert torch.equal(torch.isneginf(got), torch.isneginf(want))
        live = torch.isfinite(want)
        assert torch.allclose(got[live], want[live], atol=1e-5)
    # The dead rows the check relies on: exactly the leading rows the brute force finds.
    dead = [i for i in range(nq) if not any(sees(i, j, nq, nk, causal, v) for j in range(nk))]
    assert dead == list(range(len(dead)))
    assert inputs.dead_rows == len(dead)
    if dead and v.sinks:
        assert inputs.sinks is not None
        assert torch.allclose(
            inputs.ref_lse[:, : len(dead)],
            torch.stack([inputs.sinks[hh].expand(len(dead)) for _, hh in inputs.pairs]),
        )


def test_sinks_are_per_head_fixed_by_the_seed_and_spread() -> None:
    a, b = make_sinks(8, 123, "cpu"), make_sinks(8, 123, "cpu")
    assert a.dtype == torch.float32 and a.shape == (8,) and torch.equal(a, b)
    assert not torch.equal(a, make_sinks(8, 124, "cpu"))
    wide = make_sinks(4096, 5, "cpu")
    assert 1.5 < float(wide.std()) < 2.5  # 2 * N(0, 1)


def test_the_reference_refuses_a_sinks_variant_without_sinks() -> None:
    p = _problem(8, 8, False, 2, 2, Variant(sinks=True))
    q = torch.randn(2, 8, 2, 16)
    with pytest.raises(ValueError, match="sinks"):
        reference_for_pairs(q, q, q, ((0, 0),), layout="bnhd", causal=False, scale=0.25,
                            variant=p.variant)  # fmt: skip


def test_a_window_that_hides_nothing_gives_the_plain_result() -> None:
    """A no-op window takes the variant path; its result is the plain path's (the plain
    path is the code that checked every stored measurement and is kept as it was)."""
    plain = _inputs(30, 30, True, 2, 2, "bnhd", PLAIN)
    wide = Variant(window_left=100, window_right=0)
    ro, rl = reference_for_pairs(
        plain.q, plain.k, plain.v, plain.pairs, layout="bnhd", causal=True, scale=plain.scale,
        variant=wide,
    )  # fmt: skip
    assert torch.allclose(ro, plain.ref_o, atol=1e-6)
    assert torch.allclose(rl, plain.ref_lse, atol=1e-6)


@pytest.mark.parametrize("nq", [1, 2, 5, 12, 30])
@pytest.mark.parametrize("nk", [1, 3, 12, 31])
@pytest.mark.parametrize("causal", [False, True])
def test_dead_row_count_is_the_brute_force_count(nq: int, nk: int, causal: bool) -> None:
    for v in (
        PLAIN, Variant(window_left=2), Variant(window_right=0), Variant(window_right=3),
        Variant(window_left=1, window_right=1), Variant(chunk=4), Variant(chunk=5, window_left=2),
        Variant(softcap=15.0, sinks=True),
    ):  # fmt: skip
        want = sum(
            1 for i in range(nq) if not any(sees(i, j, nq, nk, causal, v) for j in range(nk))
        )
        assert dead_row_count(nq, nk, causal, v) == want, (nq, nk, causal, v)
    assert dead_row_count(nq, nk, causal) == (max(0, nq - nk) if causal else 0)


@pytest.mark.parametrize(
    "v",
    [Variant(window_left=3), Variant(window_left=2, window_right=5), Variant(chunk=4),
     Variant(window_left=6, chunk=5), Variant(window_right=0, softcap=30.0)],
)  # fmt: skip
@pytest.mark.parametrize(("nq", "nk", "causal"), [(17, 17, True), (9, 30, False), (30, 9, True)])
def test_flops_count_the_visible_pairs_of_a_local_problem(
    v: Variant, nq: int, nk: int, causal: bool
) -> None:
    p = _problem(nq, nk, causal, 4, 2, v)
    seen = sum(sees(i, j, nq, nk, causal, v) for i in range(nq) for j in range(nk))
    assert p.flops == 4.0 * p.batch * p.heads * p.d * seen
    lens = (5, 17, 1)
    vl = Problem.varlen("t", 16, lens, heads=2, causal=causal, variant=v)
    per = sum(sees(i, j, n, n, causal, v) for n in lens for i in range(n) for j in range(n))
    assert vl.flops == 4.0 * 2 * 16 * per


def test_flops_of_plain_softcap_and_sinks_problems_are_the_rectangle() -> None:
    for v in (PLAIN, Variant(softcap=30.0), Variant(sinks=True)):
        for causal in (False, True):
            p = Problem(gpu="t", d=128, n=4097, nk=1000, batch=3, heads=16, causal=causal,
                        variant=v)  # fmt: skip
            f = 4.0 * 3 * 16 * 4097 * 1000 * 128
            assert p.flops == (f / 2 if causal else f)


def _exact_outputs(inputs: InputSet) -> tuple[Any, Any]:
    """O and LSE written from the reference (every pair is covered)."""
    o, lse = inputs.outputs()
    ob = as_bhnd(o, inputs.layout)
    for p, (b, h) in enumerate(inputs.pairs):
        ob[b, h] = inputs.ref_o[p].to(o.dtype)
        lse[b, h] = inputs.ref_lse[p]
    return o, lse


def test_the_check_passes_the_reference_and_holds_dead_rows_to_the_sink() -> None:
    inputs = _inputs(21, 9, True, 2, 2, "bnhd", Variant(sinks=True))
    assert inputs.dead_rows == 12
    o, lse = _exact_outputs(inputs)
    assert check_output(o, lse, inputs).ok
    bad = lse.clone()
    bad[1, 1, 3] = -math.inf  # the plain rule's value: wrong with sinks
    res = check_output(o, bad, inputs)
    assert not res.ok and "sink" in res.message
    assert inputs.sinks is not None
    bad[1, 1, 3] = inputs.sinks[1] + 0.5
    assert not check_output(o, bad, inputs).ok
    o2 = o.clone()
    o2[0, 2, 1, 0] = 1.0  # a dead row's O must be 0
    assert not check_output(o2, lse, inputs).ok


def test_the_check_of_a_window_without_sinks_wants_minus_inf_on_dead_rows() -> None:
    inputs = _inputs(20, 9, False, 4, 2, "bnhd", Variant(window_right=1))
    assert inputs.dead_rows == 10
    o, lse = _exact_outputs(inputs)
    assert check_output(o, lse, inputs).ok
    lse[0, 0, 0] = 0.0
    assert not check_output(o, lse, inputs).ok


def test_a_wrong_window_fails_the_check() -> None:
    """A kernel that ignored the window (the plain causal result) is caught."""
    v = Variant(window_left=3, window_right=0)
    inputs = _inputs(40, 40, True, 2, 2, "bhnd", v)
    plain = _inputs(40, 40, True, 2, 2, "bhnd", PLAIN)  # same seed: the same q, k, v
    assert torch.equal(plain.q, inputs.q)
    o, lse = _exact_outputs(plain)
    assert not check_output(o, lse, inputs).ok


def test_a_variant_yardstick_is_the_kernel_rounding_error() -> None:
    for v in (Variant(window_left=4), Variant(softcap=15.0, sinks=True)):
        p = _problem(33, 40, True, 2, 2, v, dtype="bf16")
        inputs = make_inputset(p, "bnhd", device="cpu", seed=3, sdpa_ref=True)
        assert inputs.ref_backend == "emulated" and inputs.ref_err is not None
        assert 0.0 < inputs.ref_err < 0.05, inputs.ref_err  # a bf16 rounding, not a bug
        assert inputs.ref_err == emulated_error(inputs)
        assert "variant" in inputs.describe()


def test_varlen_sequences_each_get_their_variant_and_share_the_sinks() -> None:
    v = Variant(window_left=3, window_right=0, chunk=5, softcap=15.0, sinks=True)
    lens_q, lens_k = [1, 9, 17], [4, 9, 6]
    inputs = make_varlen_inputs(
        lens_q, lens_k, heads=4, kv_heads=2, d=16, causal=True, device="cpu", seed=11,
        sdpa_ref=False, variant=v,
    )  # fmt: skip
    assert inputs.sinks is not None and inputs.sinks.shape == (4,)
    o, lse = inputs.outputs()
    off_q = [0, 1, 10, 27]
    for i, seq in enumerate(inputs.sequences):
        assert seq.sinks is inputs.sinks and seq.problem.variant == v
        qb, kb, vb = seq.bhnd()
        ro, rl = brute(qb, kb, vb, True, inputs.scale, v, inputs.sinks)
        assert torch.allclose(seq.ref_o.double(), ro[0], atol=1e-5)
        assert torch.allclose(seq.ref_lse.double(), rl[0], atol=1e-5)
        o[off_q[i] : off_q[i + 1]] = seq.ref_o.permute(1, 0, 2).to(o.dtype)
        lse[:, off_q[i] : off_q[i + 1]] = seq.ref_lse
    assert inputs.sequences[2].dead_rows == 11  # 17 queries, 6 keys, causal
    assert check_varlen(o, lse, inputs).ok
