"""KV-cache attention in fa2tune.torch without a GPU (issue 24).

On CPU tensors the op runs its torch path (:mod:`fa2tune.ops.kvcache_fallback`), which is
the GPU tests' reference, so it is checked here against brute force written from the
semantics (FlashAttention's ``flash_attn_with_kvcache``): per sequence its cache row or its
pages in table order, ``cache_seqlens[b] + Nnew`` keys, masks bottom-right aligned at that
length, the variants, rows with no key (O = 0, LSE = -inf or the sink's logit); the append
(bit-exact, at each sequence's length, through ``cache_batch_idx`` and the block table); the
argument checks; the decision made once per cache shape (growing lengths ask nothing
again); ``fallback=False`` refusing; ``torch.compile(fullgraph=True)`` tracing the op as
one node; and fa2tune.flash_attn's ``flash_attn_with_kvcache`` refusing what it does not run.
Skipped without torch.
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
from tests.support.kvcache_brute import brute_attention as _brute  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    from fa2tune.torch import clear_caches

    clear_caches()
    yield
    clear_caches()


def _dense_cache(rows: int, cap: int, hkv: int, d: int) -> tuple[Any, Any]:
    return torch.randn(rows, cap, hkv, d), torch.randn(rows, cap, hkv, d)


CASES = [
    # (page, new, batch_idx, causal, variant, sinks, nq)
    (0, 0, False, True, PLAIN, False, 1),
    (0, 2, True, True, PLAIN, False, 3),
    (0, 1, False, False, Variant(5, 0), False, 1),
    (1, 1, False, True, PLAIN, False, 2),
    (4, 3, True, True, Variant(6, 2), False, 4),
    (8, 0, False, False, Variant(chunk=8), True, 2),
    (4, 2, False, True, Variant(softcap=3.0), True, 3),
]


@pytest.mark.parametrize(("page", "new", "mapped", "causal", "variant", "with_sinks", "nq"), CASES)
def test_torch_path_matches_brute_force(
    page: int, new: int, mapped: bool, causal: bool, variant: Variant, with_sinks: bool, nq: int
) -> None:
    from fa2tune.torch import attention_with_kvcache

    torch.manual_seed(page * 10 + new + nq)
    b, hq, hkv, d, cap = 4, 4, 2, 8, 24
    q = torch.randn(b, nq, hq, d)
    lens = torch.tensor([0, 1, cap - new, 9], dtype=torch.int32)
    table = idx = None
    if page:
        pages = b * (cap // page) + 2
        kc, vc = _dense_cache(pages, page, hkv, d)
        table = torch.randperm(pages)[: b * (cap // page)].view(b, cap // page).to(torch.int32)
    else:
        kc, vc = _dense_cache(b + 2 if mapped else b, cap, hkv, d)
    rows = int(table.shape[0]) if table is not None else int(kc.shape[0])
    if mapped:
        idx = torch.randperm(rows)[:b].to(torch.int32)
        if table is not None:  # the map picks block-table rows: give it spare rows
            table = torch.cat([table, table.flip(0)])[: max(rows, b)]
            idx = torch.randperm(int(table.shape[0]))[:b].to(torch.int32)
    kn, vn = (torch.randn(b, new, hkv, d), torch.randn(b, new, hkv, d)) if new else (None, None)
    sinks = torch.randn(hq) if with_sinks else None
    before_k = kc.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        o, lse = attention_with_kvcache(
            q, kc, vc, kn, vn, cache_seqlens=lens, page_table=table, cache_batch_idx=idx,
            causal=causal, window_size=(variant.window_left, variant.window_right),
            attention_chunk=variant.chunk, softcap=variant.softcap, sinks=sinks,
            return_lse=True,
        )  # fmt: skip
    keys, values = [], []
    for bi in range(b):
        row = int(idx[bi]) if idx is not None else bi
        length = int(lens[bi]) + new
        if table is not None:
            order = table[row].long()
            k_seq = kc[order].reshape(-1, hkv, d)
            v_seq = vc[order].reshape(-1, hkv, d)
            k_before = before_k[order].reshape(-1, hkv, d)
        else:
            k_seq, v_seq, k_before = kc[row], vc[row], before_k[row]
        if new:  # the append: the new rows at the old length, the rest untouched
            start = int(lens[bi])
            assert torch.equal(k_seq[start:length], kn[bi])
            assert torch.equal(v_seq[start:length], vn[bi])
            assert torch.equal(k_seq[:start], k_before[:start])
            assert torch.equal(k_seq[length:], k_before[length:])
        keys.append(k_seq[:length])
        values.append(v_seq[:length])
    want_o, want_lse = _brute(q, keys, values, causal, variant, sinks, 1 / math.sqrt(d))
    assert torch.allclose(o.double(), want_o, atol=1e-5)
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
    finite = torch.isfinite(want_lse)
    assert torch.allclose(lse.double()[finite], want_lse[finite], atol=1e-5)


def _args(**over: Any) -> dict[str, Any]:
    base = {"q": torch.randn(2, 1, 4, 8), "k_cache": torch.randn(2, 16, 2, 8),
            "v_cache": torch.randn(2, 16, 2, 8),
            "cache_seqlens": torch.tensor([3, 4], dtype=torch.int32)}  # fmt: skip
    base.update(over)
    return base


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"v_cache": torch.randn(2, 16, 2, 4)}, "v_cache"),
        ({"k_cache": torch.randn(2, 16, 3, 8), "v_cache": torch.randn(2, 16, 3, 8)}, "multiple"),
        ({"cache_seqlens": torch.tensor([3, 4, 5], dtype=torch.int32)}, "3 entries"),
        ({"cache_seqlens": torch.tensor([3.0, 4.0])}, "cache_seqlens must be an int32"),
        ({"k": torch.randn(2, 1, 2, 8)}, "both or neither"),
        ({"k": torch.randn(2, 1, 1, 8), "v": torch.randn(2, 1, 1, 8)}, "new k/v"),
        ({"page_table": torch.zeros(2, 2, dtype=torch.int32),
          "k_cache": torch.randn(4, 6, 2, 8), "v_cache": torch.randn(4, 6, 2, 8)}, "power of two"),
        ({"page_table": torch.zeros(1, 2, dtype=torch.int32),
          "k_cache": torch.randn(4, 8, 2, 8), "v_cache": torch.randn(4, 8, 2, 8)}, "1 rows"),
        ({"k_cache": torch.randn(1, 16, 2, 8), "v_cache": torch.randn(1, 16, 2, 8)}, "1 sequences"),
    ],
)  # fmt: skip
def test_bad_arguments_are_refused(over: dict[str, Any], message: str) -> None:
    from fa2tune.torch import attention_with_kvcache

    a = _args(**over)
    with pytest.raises(ValueError, match=message):
        attention_with_kvcache(a.pop("q"), a.pop("k_cache"), a.pop("v_cache"), a.pop("k", None),
                               a.pop("v", None), **a)  # fmt: skip


def test_decided_once_per_cache_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """Growing lengths change no decision key: the first call decides, later ones reuse."""
    from fa2tune.ops import kvcache
    from fa2tune.torch import attention_with_kvcache

    decided: list[object] = []
    real = kvcache._decide

    def counting(*args: Any) -> Any:
        decided.append(args)
        return real(*args)

    monkeypatch.setattr(kvcache, "_decide", counting)
    a = _args()
    lens = a["cache_seqlens"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(5):
            kn, vn = torch.randn(2, 1, 2, 8), torch.randn(2, 1, 2, 8)
            attention_with_kvcache(a["q"], a["k_cache"], a["v_cache"], kn, vn,
                                   cache_seqlens=lens, causal=True)  # fmt: skip
            lens += 1
    assert len(decided) == 1
    assert lens.tolist() == [8, 9]


def test_appending_without_lengths_is_refused_and_writes_nothing() -> None:
    """New rows with no cache_seqlens: where they go is unsaid (FlashAttention's "whole
    cache" leaves no room), so both entry points refuse it before touching the caches."""
    from fa2tune.flash_attn import flash_attn_with_kvcache
    from fa2tune.torch import attention_with_kvcache

    a = _args()
    kn, vn = torch.randn(2, 1, 2, 8), torch.randn(2, 1, 2, 8)
    before = a["k_cache"].clone()
    with pytest.raises(ValueError, match="appending k/v needs cache_seqlens"):
        attention_with_kvcache(a["q"], a["k_cache"], a["v_cache"], kn, vn, cache_seqlens=None)
    with pytest.raises(ValueError, match="appending k/v needs cache_seqlens"):
        flash_attn_with_kvcache(a["q"], a["k_cache"], a["v_cache"], kn, vn)
    assert torch.equal(a["k_cache"], before)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the torch path on CPU tensors
        whole = attention_with_kvcache(a["q"], a["k_cache"], a["v_cache"], cache_seqlens=None)
    assert whole.shape == a["q"].shape  # no new rows: every sequence the whole cache


@pytest.mark.parametrize(
    ("layout", "stride", "gaps"),
    [("rows", 3, False), ("wide", 7, False), ("gaps", 3, True)],
)
def test_the_block_tables_row_stride_reaches_the_decision(
    monkeypatch: pytest.MonkeyPatch, layout: str, stride: int, gaps: bool
) -> None:
    """The kernels read row b of the table ``table_stride`` entries after row b - 1: the
    table's own row stride, or max_pages for a table with gaps between its entries, which
    the launcher copies contiguous per call."""
    from fa2tune.ops import kvcache
    from fa2tune.torch import attention_with_kvcache

    seen: list[tuple[int, bool]] = []

    def recording(*args: Any) -> str:
        seen.append((args[5], args[8]))  # table_stride, table_gaps
        return "recorded"

    monkeypatch.setattr(kvcache, "_decide", recording)
    wide = torch.zeros(2, 7, dtype=torch.int32)
    table = {"rows": torch.zeros(2, 3, dtype=torch.int32), "wide": wide[:, :3],
             "gaps": wide[:, 0:6:2]}[layout]  # fmt: skip
    a = _args(k_cache=torch.randn(6, 4, 2, 8), v_cache=torch.randn(6, 4, 2, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        attention_with_kvcache(a["q"], a["k_cache"], a["v_cache"], page_table=table,
                               cache_seqlens=a["cache_seqlens"])  # fmt: skip
    assert seen == [(stride, gaps)]


def test_fallback_false_raises_with_the_reason() -> None:
    from fa2tune.torch import attention_with_kvcache

    a = _args()
    with pytest.raises(Unsupported, match="not a CUDA device"):
        attention_with_kvcache(a.pop("q"), a.pop("k_cache"), a.pop("v_cache"), fallback=False,
                               **a)  # fmt: skip


@pytest.mark.parametrize("padded", [False, True], ids=["plain", "leftpad"])
def test_compile_fullgraph_traces_one_op(padded: bool) -> None:
    from fa2tune.torch import attention_with_kvcache

    a = _args()
    kc2, vc2 = a["k_cache"].clone(), a["v_cache"].clone()
    kn, vn = torch.randn(2, 1, 2, 8), torch.randn(2, 1, 2, 8)
    pad = torch.tensor([1, 3], dtype=torch.int32) if padded else None

    def step(q: Any, kc: Any, vc: Any) -> Any:
        return attention_with_kvcache(q * 2.0, kc, vc, kn, vn, cache_seqlens=a["cache_seqlens"],
                                      cache_leftpad=pad, causal=True)  # fmt: skip

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = torch.compile(step, fullgraph=True, backend="aot_eager")(a["q"], a["k_cache"],
                                                                       a["v_cache"])  # fmt: skip
        want = step(a["q"], kc2, vc2)
    assert torch.equal(a["k_cache"], kc2)  # the compiled call appended too
    assert torch.allclose(got, want)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"rotary_cos": torch.zeros(1)}, "rotary_cos"),
     ({"rotary_sin": torch.zeros(1)}, "rotary_sin")],
)  # fmt: skip
def test_flash_attn_with_kvcache_refuses_what_it_does_not_run(kwargs: dict[str, Any],
                                                              name: str) -> None:  # fmt: skip
    from fa2tune.flash_attn import flash_attn_with_kvcache

    a = _args()
    with pytest.raises(NotImplementedError, match=name):
        flash_attn_with_kvcache(a["q"], a["k_cache"], a["v_cache"], **kwargs)


def test_flash_attn_with_kvcache_refuses_cpu_tensors_without_fallback() -> None:
    from fa2tune.flash_attn import flash_attn_with_kvcache

    a = _args()
    with pytest.raises(NotImplementedError, match="not a CUDA device"):
        flash_attn_with_kvcache(a["q"], a["k_cache"], a["v_cache"], cache_seqlens=3)


def _paged(lens: list[int], table: list[list[int]], **over: Any) -> dict[str, Any]:
    """A paged cache of 6 pages of 4 keys, a block table of 3 pages per row, one new key."""
    base = {"q": torch.randn(2, 1, 4, 8), "k_cache": torch.randn(6, 4, 2, 8),
            "v_cache": torch.randn(6, 4, 2, 8), "k": torch.randn(2, 1, 2, 8),
            "v": torch.randn(2, 1, 2, 8), "cache_seqlens": torch.tensor(lens, dtype=torch.int32),
            "page_table": torch.tensor(table, dtype=torch.int32)}  # fmt: skip
    base.update(over)
    return base


def _call(a: dict[str, Any]) -> Any:
    from fa2tune.torch import attention_with_kvcache

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return attention_with_kvcache(a["q"], a["k_cache"], a["v_cache"], a.get("k"),
                                      a.get("v"), cache_seqlens=a["cache_seqlens"],
                                      page_table=a.get("page_table"),
                                      cache_batch_idx=a.get("cache_batch_idx"))  # fmt: skip


@pytest.mark.parametrize(
    ("a", "message"),
    [
        (_paged([3, 12], [[0, 1, 2], [3, 4, 5]]), r"cache_seqlens\[1\] = 12 is outside \[0, 11\]"),
        (_paged([-1, 2], [[0, 1, 2], [3, 4, 5]]), r"cache_seqlens\[0\] = -1"),
        (_paged([3, 5], [[0, 1, 2], [3, 9, 5]]), r"page_table\[1, 1\] = 9 .*\[0, 6\)"),
        (_paged([4, 5], [[0, -2, 2], [3, 4, 5]]), r"page_table\[0, 1\] = -2"),
        (
            _paged(
                [3, 5],
                [[0, 1, 2], [3, 4, 5]],
                cache_batch_idx=torch.tensor([1, 2], dtype=torch.int32),
            ),
            r"cache_batch_idx\[1\] = 2 is outside \[0, 2\) \(2 block-table rows\)",
        ),
        (
            {**_args(cache_batch_idx=torch.tensor([0, 5], dtype=torch.int32))},
            r"cache_batch_idx\[1\] = 5 is outside \[0, 2\) \(2 cache rows\)",
        ),
    ],
)
def test_the_debug_mode_names_the_first_bad_device_value(
    checking: None, a: dict[str, Any], message: str
) -> None:
    """With FA2TUNE_CHECK_KVCACHE the values the host never reads are checked before the
    append, so a bad one raises naming it and the caches stay as they were."""
    before = a["k_cache"].clone(), a["v_cache"].clone()
    with pytest.raises(ValueError, match=message):
        _call(a)
    assert torch.equal(a["k_cache"], before[0]) and torch.equal(a["v_cache"], before[1])


def test_the_debug_mode_checks_only_the_pages_a_sequence_reaches(checking: None) -> None:
    """Entries past a sequence's last page are never read: junk there is no error."""
    a = _paged([3, 5], [[0, 99, 99], [3, 4, 99]])  # 4 and 6 keys: 1 and 2 pages reached
    o = _call(a)
    assert o.shape == a["q"].shape and bool(torch.isfinite(o).all())


def test_unreached_junk_entries_are_never_read_without_the_debug_mode() -> None:
    """The torch path too leaves entries past a sequence's pages alone (clamped, masked): the
    result is the one with those entries set to real pages."""
    junk = _paged([3, 5], [[0, 99, -7], [3, 4, 99]])
    clean = {**junk, "page_table": torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32),
             "k_cache": junk["k_cache"].clone(), "v_cache": junk["v_cache"].clone()}  # fmt: skip
    assert torch.equal(_call(junk), _call(clean))


def test_without_the_debug_mode_a_long_length_is_clamped_not_refused() -> None:
    """By default nothing is read on the host: a length past the capacity is clamped (the
    kernels' rule), as FlashAttention leaves it to the caller."""
    a = _args(cache_seqlens=torch.tensor([3, 40], dtype=torch.int32))
    assert _call(a).shape == a["q"].shape


LEFTPAD_CASES = [
    # (page, new, causal, variant, nq)
    (0, 0, True, PLAIN, 1),
    (0, 2, True, PLAIN, 3),
    (0, 1, False, Variant(4, 1), 2),
    (0, 0, True, Variant(chunk=5), 4),
    (4, 2, True, Variant(6, 0), 2),  # paged: the torch path takes it (the kernels do not)
]


@pytest.mark.parametrize(("page", "new", "causal", "variant", "nq"), LEFTPAD_CASES)
def test_left_padded_caches_start_each_sequence_at_its_padding(
    page: int, new: int, causal: bool, variant: Variant, nq: int
) -> None:
    """With ``cache_leftpad`` sequence b is the cache's keys [leftpad[b], length): brute force
    on that slice (positions, masks and chunks counted from its first key)."""
    from fa2tune.torch import attention_with_kvcache

    torch.manual_seed(7 + page + new + nq)
    b, hq, hkv, d, cap = 4, 4, 2, 8, 24
    q = torch.randn(b, nq, hq, d)
    lens = torch.tensor([0, 3, cap - new, 11], dtype=torch.int32)
    pad = torch.tensor([0, 3, 5, 2], dtype=torch.int32)  # 3: a sequence that is all padding
    table = None
    if page:
        kc, vc = _dense_cache(b * (cap // page), page, hkv, d)
        table = torch.randperm(b * (cap // page)).view(b, cap // page).to(torch.int32)
    else:
        kc, vc = _dense_cache(b, cap, hkv, d)
    kn, vn = (torch.randn(b, new, hkv, d), torch.randn(b, new, hkv, d)) if new else (None, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        o, lse = attention_with_kvcache(
            q, kc, vc, kn, vn, cache_seqlens=lens, page_table=table, cache_leftpad=pad,
            causal=causal, window_size=(variant.window_left, variant.window_right),
            attention_chunk=variant.chunk, return_lse=True,
        )  # fmt: skip
    keys, values = [], []
    for bi in range(b):
        if table is not None:
            order = table[bi].long()
            k_seq, v_seq = kc[order].reshape(-1, hkv, d), vc[order].reshape(-1, hkv, d)
        else:
            k_seq, v_seq = kc[bi], vc[bi]
        length = int(lens[bi]) + new
        if new:  # appended at the cached length, padding or not
            assert torch.equal(k_seq[int(lens[bi]) : length], kn[bi])
        keys.append(k_seq[int(pad[bi]) : length])
        values.append(v_seq[int(pad[bi]) : length])
    want_o, want_lse = _brute(q, keys, values, causal, variant, None, 1 / math.sqrt(d))
    assert torch.allclose(o.double(), want_o, atol=1e-5)
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
    finite = torch.isfinite(want_lse)
    assert torch.allclose(lse.double()[finite], want_lse[finite], atol=1e-5)


def test_left_padding_is_checked_and_a_refused_paged_call_writes_nothing() -> None:
    """Over pages the padded call is decided on the gathered copy's shapes before the append:
    refused (here: CPU tensors, no fallback), it leaves the caches as they were."""
    from fa2tune.flash_attn import flash_attn_with_kvcache
    from fa2tune.torch import attention_with_kvcache

    a = _args()
    with pytest.raises(ValueError, match="cache_leftpad must be an int32"):
        attention_with_kvcache(**a, cache_leftpad=torch.zeros(2))
    with pytest.raises(ValueError, match="cache_leftpad has 3 entries"):
        attention_with_kvcache(**a, cache_leftpad=torch.zeros(3, dtype=torch.int32))
    kp, vp = torch.randn(8, 4, 2, 8), torch.randn(8, 4, 2, 8)
    table = torch.arange(8, dtype=torch.int32).view(2, 4)
    pad = torch.tensor([1, 2], dtype=torch.int32)
    kn, vn = torch.randn(2, 1, 2, 8), torch.randn(2, 1, 2, 8)
    saved = kp.clone()
    with pytest.raises(NotImplementedError, match="not a CUDA device"):
        flash_attn_with_kvcache(a["q"], kp, vp, kn, vn, cache_seqlens=a["cache_seqlens"],
                                page_table=table, cache_leftpad=pad)  # fmt: skip
    with pytest.raises(Unsupported, match="not a CUDA device"):
        attention_with_kvcache(a["q"], kp, vp, kn, vn, cache_seqlens=a["cache_seqlens"],
                               page_table=table, cache_leftpad=pad, fallback=False)  # fmt: skip
    assert torch.equal(kp, saved)


def test_the_debug_mode_checks_the_left_padding(checking: None) -> None:
    from fa2tune.torch import attention_with_kvcache

    a = _args()
    with pytest.raises(ValueError, match=r"cache_leftpad\[1\] = 5 is outside \[0, 4\]"):
        attention_with_kvcache(**a, cache_leftpad=torch.tensor([0, 5], dtype=torch.int32))
