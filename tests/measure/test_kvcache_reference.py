"""The check of a KV-cache problem of mixed lengths (measure.kvcache.cache_inputset), on the
CPU: each checked (batch, head) pair's reference is float32 attention over its sequence's own
first L_b keys (bottom-right aligned, variants included), against a brute-force softmax; the
dense set's pairs, yardstick and output buffers are kept; the output check counts the rows
that see no key per sequence, and a kernel that reads keys past a sequence's length fails.

Skipped where torch is not installed.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from core.problem import Problem
from core.variant import PLAIN, Variant
from tests.support.variant_rule import sees

torch = pytest.importorskip("torch")

from measure.kvcache import cache_inputset  # noqa: E402
from measure.reference import InputSet, as_bhnd, make_inputset  # noqa: E402
from measure.verify import check_output  # noqa: E402


def brute(inputs: InputSet, b: int, h: int, keys: int) -> tuple[Any, Any]:
    """Float64 O ``[Nq, D]`` and LSE ``[Nq]`` of pair (b, h) over the first ``keys`` keys, by
    a masked softmax written out (the sink as one more term of the denominator)."""
    p = inputs.problem
    qb, kb, vb = inputs.bhnd()
    kh = h * p.n_kv_heads // p.heads
    q = qb[b, h].double()
    k, v = kb[b, kh, :keys].double(), vb[b, kh, :keys].double()
    s = (q @ k.T) * inputs.scale
    cap = p.variant.softcap
    if cap > 0:
        s = cap * torch.tanh(s / cap)
    mask = torch.tensor([[sees(i, j, p.n, keys, p.causal, p.variant) for j in range(keys)]
                         for i in range(p.n)])  # fmt: skip
    s = s.masked_fill(~mask, -math.inf)
    if inputs.sinks is not None:
        s = torch.cat([s, inputs.sinks[h].double().expand(p.n, 1)], dim=1)
    lse = torch.logsumexp(s, dim=1)
    prob = torch.where(torch.isfinite(lse)[:, None], torch.exp(s - lse[:, None]), 0.0)
    o = prob[:, :keys] @ v
    return o, lse


def _dense(nq: int, nk: int, causal: bool, variant: Variant, layout: str, **kw: Any) -> InputSet:
    problem = Problem(gpu="t", d=16, n=nq, nk=nk, batch=4, heads=4, kv_heads=2, causal=causal,
                      variant=variant)  # fmt: skip
    return make_inputset(problem, layout, device="cpu", seed=11, sdpa_ref=False,  # type: ignore[arg-type]
                         chunk_bytes=2048, **kw)  # fmt: skip


# (nq, nk, causal, variant, layout, lengths): decode-like, a causal chunk longer than some
# sequences (their leading rows see no key), a causal window, a window with sinks.
CASES = [
    (3, 40, False, PLAIN, "bnhd", (40, 7, 1, 23)),
    (12, 30, True, PLAIN, "bhnd", (30, 5, 12, 1)),
    (6, 30, True, Variant(window_left=4, window_right=0), "bnhd", (30, 3, 17, 9)),
    (9, 33, True, Variant(window_left=5, window_right=0, softcap=20.0, sinks=True), "bhnd",
     (33, 2, 33, 14)),
]  # fmt: skip


@pytest.mark.parametrize(("nq", "nk", "causal", "variant", "layout", "lengths"), CASES)
def test_each_pair_is_checked_over_its_own_keys(
    nq: int, nk: int, causal: bool, variant: Variant, layout: str, lengths: tuple[int, ...]
) -> None:
    dense = _dense(nq, nk, causal, variant, layout)
    dense.ref_err = 1e-3  # a yardstick to keep
    mixed = cache_inputset(dense, lengths)
    assert mixed.pairs == dense.pairs and len(mixed.pairs) == 16  # every pair, as the dense
    assert mixed.key_lengths == lengths and mixed.ref_err == dense.ref_err
    assert mixed.q is dense.q and mixed.k is dense.k and mixed.sinks is dense.sinks
    assert mixed.outputs()[0] is dense.outputs()[0]
    for p, (b, h) in enumerate(mixed.pairs):
        o, lse = brute(mixed, b, h, lengths[b])
        assert torch.allclose(mixed.ref_o[p].double(), o, atol=1e-5), (b, h)
        got = mixed.ref_lse[p].double()
        assert torch.equal(torch.isneginf(got), torch.isneginf(lse))
        live = torch.isfinite(lse)
        assert torch.allclose(got[live], lse[live], atol=1e-5), (b, h)
        # The rows that see no key are the leading rows the brute force finds.
        dead = sum(1 for i in range(nq) if not any(
            sees(i, j, nq, lengths[b], causal, variant) for j in range(lengths[b])))  # fmt: skip
        assert mixed.dead_rows_of(b) == dead
    # A full-length sequence's pairs keep the dense reference.
    full = [p for p, (b, _) in enumerate(mixed.pairs) if lengths[b] == nk]
    assert torch.allclose(mixed.ref_o[full], dense.ref_o[full], atol=1e-6)


def _written(inputs: InputSet) -> tuple[Any, Any]:
    """O and LSE written from ``inputs``' reference (every pair is covered)."""
    o = torch.empty_like(inputs.q)
    lse = torch.empty((4, 4, inputs.problem.n), dtype=torch.float32)
    ob = as_bhnd(o, inputs.layout)
    for p, (b, h) in enumerate(inputs.pairs):
        ob[b, h] = inputs.ref_o[p].to(o.dtype)
        lse[b, h] = inputs.ref_lse[p]
    return o, lse


@pytest.mark.parametrize(("nq", "nk", "causal", "variant", "layout", "lengths"), CASES)
def test_the_check_takes_the_lengths_and_fails_a_kernel_that_reads_past_them(
    nq: int, nk: int, causal: bool, variant: Variant, layout: str, lengths: tuple[int, ...]
) -> None:
    dense = _dense(nq, nk, causal, variant, layout)
    mixed = cache_inputset(dense, lengths)
    o, lse = _written(mixed)
    assert check_output(o, lse, mixed).ok
    # The dense result is what a kernel that attends to every sequence's nk keys writes.
    o_all, lse_all = _written(dense)
    assert not check_output(o_all, lse_all, mixed).ok
    assert check_output(o_all, lse_all, dense).ok


def test_rows_that_see_no_key_are_counted_per_sequence() -> None:
    dense = _dense(12, 30, True, PLAIN, "bnhd")
    mixed = cache_inputset(dense, (30, 5, 12, 1))
    assert mixed.dead_rows == 0 and [mixed.dead_rows_of(b) for b in range(4)] == [0, 7, 0, 11]
    assert mixed.dead_spans() == [(0, 1, 0), (1, 2, 7), (2, 3, 0), (3, 4, 11)]
    o, lse = _written(mixed)
    bad = o.clone()
    as_bhnd(bad, "bnhd")[3, 2, 10] = 0.5  # sequence 3 (1 key): row 10 sees nothing
    res = check_output(bad, lse, mixed)
    assert not res.ok and "batch rows 3-3" in res.message and "not 0" in res.message
    bad_lse = lse.clone()
    bad_lse[1, 0, 6] = 0.0  # sequence 1 (5 keys): rows 0-6 see nothing, LSE -inf there
    res = check_output(o, bad_lse, mixed)
    assert not res.ok and "batch rows 1-1" in res.message and "-inf" in res.message


def test_a_subset_of_pairs_is_kept_and_full_lengths_give_the_dense_set() -> None:
    # A work limit under one pair's: the dense set checks the first, the last and one more.
    dense = _dense(3, 40, False, PLAIN, "bnhd", min_pairs=3, full_limit=1)
    assert len(dense.pairs) == 3
    mixed = cache_inputset(dense, (40, 7, 1, 23))
    assert mixed.pairs == dense.pairs and mixed.ref_o.shape == dense.ref_o.shape
    for p, (b, h) in enumerate(mixed.pairs):
        assert torch.allclose(mixed.ref_o[p].double(), brute(mixed, b, h, (40, 7, 1, 23)[b])[0],
                              atol=1e-5)  # fmt: skip
    assert cache_inputset(dense, (40,) * 4) is dense


@pytest.mark.parametrize(("lengths", "message"), [((40, 40), "2 sequence lengths"),
                                                  ((40, 0, 1, 1), r"in \[1, 40\]"),
                                                  ((41, 1, 1, 1), r"in \[1, 40\]")])  # fmt: skip
def test_lengths_that_are_not_the_batchs_are_refused(
    lengths: tuple[int, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        cache_inputset(_dense(3, 40, False, PLAIN, "bnhd"), lengths)
