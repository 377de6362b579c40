"""Packed queries and packed new keys over a KV cache (fa2tune.ops.kvcache_varlen, behind
``flash_attn_with_kvcache``'s ``cu_seqlens_q`` / ``cu_seqlens_k_new``), on CPU tensors.

The packed call runs the dense cache call on right-aligned padding; on the CPU the dense call
is the op's torch path, so these check the padding's index arithmetic and the packed append
against brute force written per sequence: sequence ``b``'s ``nq_b`` queries (0 included)
over its cache row's or pages' keys after its ``new_b`` packed rows are written at its
length, masks bottom-right aligned at that length with ``nq_b`` queries, left padding,
windows; O ``[total_q, Hq, D]`` and the LSE ``[Hq, total_q]``; and that a bad or refused call
writes nothing. Skipped without torch.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from core.variant import PLAIN, Variant  # noqa: E402
from fa2tune.ops.choice import Unsupported  # noqa: E402
from fa2tune.ops.kvcache_varlen import padded_rows, run_packed_with_kvcache  # noqa: E402
from tests.support.kvcache_brute import brute_attention  # noqa: E402

B, HQ, HKV, D, CAP = 4, 4, 2, 8, 24


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    from fa2tune.torch import clear_caches

    clear_caches()
    yield
    clear_caches()


def _cu(counts: list[int]) -> Any:
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return torch.tensor(out, dtype=torch.int32)


def test_padded_rows_right_align_each_sequence() -> None:
    rows = padded_rows(_cu([2, 0, 3, 1]), 3, 6)
    # sequence 0 in rows 1-2 of its block, 2 in 6-8, 3 in row 11
    assert rows.tolist() == [1, 2, 6, 7, 8, 11]


CASES = [
    # (page, queries per sequence, new rows per sequence (None: no append), causal, variant,
    #  leftpad)
    (0, [1, 3, 0, 2], None, True, PLAIN, False),
    (0, [2, 1, 4, 3], [2, 0, 1, 3], True, PLAIN, False),
    (4, [3, 3, 1, 0], [1, 2, 0, 3], True, Variant(5, 0), False),
    (0, [1, 4, 2, 2], [3, 1, 0, 2], False, Variant(3, 1), True),
    (8, [4, 1, 1, 2], [0, 4, 2, 1], False, PLAIN, False),
]


@pytest.mark.parametrize(("page", "nqs", "news", "causal", "variant", "leftpad"), CASES)
def test_packed_calls_match_brute_force_per_sequence(
    page: int, nqs: list[int], news: list[int] | None, causal: bool, variant: Variant,
    leftpad: bool,
) -> None:  # fmt: skip
    torch.manual_seed(sum(nqs) * 7 + page)
    lens = torch.tensor([0, 5, 9, 14], dtype=torch.int32)
    q = torch.randn(sum(nqs), HQ, D)
    table = None
    if page:
        kc, vc = (
            torch.randn(B * CAP // page, page, HKV, D),
            torch.randn(B * CAP // page, page, HKV, D),
        )
        table = torch.randperm(B * CAP // page).view(B, CAP // page).to(torch.int32)
    else:
        kc, vc = torch.randn(B, CAP, HKV, D), torch.randn(B, CAP, HKV, D)
    pad = torch.tensor([0, 2, 9, 1], dtype=torch.int32) if leftpad else None
    k = v = cu_k = None
    if news is not None:
        k, v, cu_k = torch.randn(sum(news), HKV, D), torch.randn(sum(news), HKV, D), _cu(news)
    before = kc.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        o, lse = run_packed_with_kvcache(
            q, kc, vc, k, v, lens, table, None, pad, _cu(nqs), max(nqs), cu_k, causal,
            1 / math.sqrt(D), (variant.window_left, variant.window_right), variant.chunk, 0.0,
            None, True, True,
        )  # fmt: skip
    assert o.shape == (sum(nqs), HQ, D) and lse.shape == (HQ, sum(nqs))
    q0 = k0 = 0
    for b in range(B):
        if table is not None:
            order = table[b].long()
            k_seq, v_seq = kc[order].reshape(-1, HKV, D), vc[order].reshape(-1, HKV, D)
            k_old = before[order].reshape(-1, HKV, D)
        else:
            k_seq, v_seq, k_old = kc[b], vc[b], before[b]
        new = news[b] if news is not None else 0
        start, length = int(lens[b]), int(lens[b]) + new
        if news is not None:  # this sequence's packed rows, at its length, nothing else
            assert torch.equal(k_seq[start:length], k[k0 : k0 + new])
            assert torch.equal(k_seq[:start], k_old[:start])
            assert torch.equal(k_seq[length:], k_old[length:])
            k0 += new
        first = int(pad[b]) if pad is not None else 0
        qb = q[q0 : q0 + nqs[b]].unsqueeze(0)
        want_o, want_lse = brute_attention(qb, [k_seq[first:length]], [v_seq[first:length]],
                                           causal, variant, None, 1 / math.sqrt(D))  # fmt: skip
        got_o = o[q0 : q0 + nqs[b]].double()
        got_lse = lse[:, q0 : q0 + nqs[b]].double()
        assert torch.allclose(got_o, want_o[0], atol=1e-5), b
        assert torch.equal(torch.isinf(got_lse), torch.isinf(want_lse[0])), b
        finite = torch.isfinite(want_lse[0])
        assert torch.allclose(got_lse[finite], want_lse[0][finite], atol=1e-5), b
        q0 += nqs[b]


def _packed_args() -> dict[str, Any]:
    return {
        "q": torch.randn(5, HQ, D), "k_cache": torch.randn(B, CAP, HKV, D),
        "v_cache": torch.randn(B, CAP, HKV, D), "k": torch.randn(6, HKV, D),
        "v": torch.randn(6, HKV, D), "cache_seqlens": torch.tensor([1, 2, 3, 4], dtype=torch.int32),
        "cu_seqlens_q": _cu([1, 2, 1, 1]), "max_seqlen_q": 2, "cu_seqlens_k_new": _cu([1, 2, 2, 1]),
    }  # fmt: skip


def _call(a: dict[str, Any], fallback: bool = True) -> Any:
    return run_packed_with_kvcache(
        a["q"], a["k_cache"], a["v_cache"], a["k"], a["v"], a["cache_seqlens"], None, None, None,
        a["cu_seqlens_q"], a["max_seqlen_q"], a["cu_seqlens_k_new"], True, 0.3, (-1, -1), 0,
        0.0, None, False, fallback,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"max_seqlen_q": None}, "max_seqlen_q"),
        ({"cu_seqlens_q": _cu([1, 2, 2])}, "entries for a batch"),
        ({"cu_seqlens_q": _cu([1, 2, 1, 1]).long()}, "must be int32"),
        ({"cu_seqlens_k_new": _cu([1, 2, 2, 1, 0])}, "for k has 6 entries"),
        ({"k": torch.randn(6, 3, D), "v": torch.randn(6, 3, D)}, "new k/v"),
        ({"k": torch.randn(1, 6, HKV, D)}, "packed k must be"),
        ({"cache_seqlens": None}, "needs cache_seqlens"),
        ({"v": None}, "give k and v"),
    ],
)  # fmt: skip
def test_bad_packed_arguments_are_refused_before_anything_is_written(
    over: dict[str, Any], message: str
) -> None:
    a = {**_packed_args(), **over}
    kc, vc = a["k_cache"].clone(), a["v_cache"].clone()
    with pytest.raises(ValueError, match=message):
        _call(a)
    assert torch.equal(a["k_cache"], kc) and torch.equal(a["v_cache"], vc)


def test_a_refused_packed_call_leaves_the_caches_alone() -> None:
    """Without fallback a call the kernels do not serve (here: CPU tensors) is refused before
    its packed rows are written."""
    a = _packed_args()
    kc = a["k_cache"].clone()
    with pytest.raises(Unsupported, match="not a CUDA device"):
        _call(a, fallback=False)
    assert torch.equal(a["k_cache"], kc)


def test_flash_attn_with_kvcache_takes_packed_queries() -> None:
    """Through the FlashAttention-compatible function: the packed arguments are taken (no
    NotImplementedError naming them); on CPU tensors the call is refused for the device."""
    from fa2tune.flash_attn import flash_attn_with_kvcache

    a = _packed_args()
    kc = a["k_cache"].clone()
    with pytest.raises(NotImplementedError, match="not a CUDA device"):
        flash_attn_with_kvcache(a["q"], a["k_cache"], a["v_cache"], a["k"], a["v"],
                                cache_seqlens=a["cache_seqlens"], cu_seqlens_q=a["cu_seqlens_q"],
                                max_seqlen_q=2, cu_seqlens_k_new=a["cu_seqlens_k_new"],
                                causal=True)  # fmt: skip
    assert torch.equal(a["k_cache"], kc)


def test_torch_compile_traces_a_packed_append_and_attend() -> None:
    """fullgraph: the padding, the packed append (a mutation of the caches) and the op."""
    a = _packed_args()
    kc2, vc2 = a["k_cache"].clone(), a["v_cache"].clone()

    def step(q: Any, kc: Any, vc: Any) -> Any:
        o, _ = run_packed_with_kvcache(
            q * 2.0, kc, vc, a["k"], a["v"], a["cache_seqlens"], None, None, None,
            a["cu_seqlens_q"], a["max_seqlen_q"], a["cu_seqlens_k_new"], True, 0.3, (-1, -1), 0,
            0.0, None, False, True,
        )  # fmt: skip
        return o

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = torch.compile(step, fullgraph=True, backend="aot_eager")(a["q"], a["k_cache"],
                                                                       a["v_cache"])  # fmt: skip
        want = step(a["q"], kc2, vc2)
    assert torch.equal(a["k_cache"], kc2) and torch.equal(a["v_cache"], vc2)  # appended too
    assert got.shape == (5, HQ, D) and torch.allclose(got, want)


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"cu_seqlens_q": torch.tensor([0, 1, 3, 2, 5], dtype=torch.int32)},
         "sequence 2 of q has -1 rows"),
        ({"cu_seqlens_q": torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32)},
         "from 0 to 4, not from 0 to its 5"),
        ({"max_seqlen_q": 1}, "sequence 1 of q has 2 rows"),
        ({"cu_seqlens_k_new": torch.tensor([1, 2, 2, 5, 6], dtype=torch.int32)}, "runs from 1"),
        ({"cache_seqlens": torch.tensor([1, 2, 3, CAP], dtype=torch.int32)},
         "sequence 3.s 1 new rows past its 24 cached keys overflow"),
    ],
)  # fmt: skip
def test_the_debug_mode_checks_the_packed_offsets_before_writing(
    checking: None, over: dict[str, Any], message: str
) -> None:
    a = {**_packed_args(), **over}
    kc = a["k_cache"].clone()
    with pytest.raises(ValueError, match=message):
        _call(a)
    assert torch.equal(a["k_cache"], kc)


def test_the_debug_mode_passes_good_offsets(checking: None) -> None:
    a = _packed_args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        o, _ = _call(a)
    assert o.shape == (5, HQ, D)
