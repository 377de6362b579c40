"""fa2tune.flash_attn (FlashAttention-3's interface) without a GPU.

Checked: each function's parameters (names, order, defaults) are FlashAttention-3's
(hopper/flash_attn_interface.py) with ``sinks`` as a trailing keyword-only extension;
every argument fa2tune does not run raises NotImplementedError naming it; scheduling hints
are accepted and change nothing; a call the kernels cannot serve is NotImplementedError
(never a fallback); the LSE's convention (+inf for rows that see no key) and the return
conventions; forward-only autograd; the plain KV-cache case; flash_attn_combine against its
definition. The op underneath is replaced by a recorder where a result is needed (no GPU).
Skipped without torch.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

NONE = None
FUNC = [
    ("q", inspect.Parameter.empty), ("k", inspect.Parameter.empty),
    ("v", inspect.Parameter.empty), ("softmax_scale", NONE), ("causal", False), ("qv", NONE),
    ("q_descale", NONE), ("k_descale", NONE), ("v_descale", NONE), ("window_size", (-1, -1)),
    ("attention_chunk", 0), ("softcap", 0.0), ("num_splits", 1), ("pack_gqa", NONE),
    ("deterministic", False), ("sm_margin", 0), ("return_attn_probs", False),
]  # fmt: skip
VARLEN = [
    ("q", inspect.Parameter.empty), ("k", inspect.Parameter.empty),
    ("v", inspect.Parameter.empty), ("cu_seqlens_q", inspect.Parameter.empty),
    ("cu_seqlens_k", inspect.Parameter.empty), ("max_seqlen_q", inspect.Parameter.empty),
    ("max_seqlen_k", inspect.Parameter.empty), ("seqused_q", NONE), ("seqused_k", NONE),
    ("softmax_scale", NONE), ("causal", False), ("qv", NONE), ("q_descale", NONE),
    ("k_descale", NONE), ("v_descale", NONE), ("window_size", (-1, -1)),
    ("attention_chunk", 0), ("softcap", 0.0), ("num_splits", 1), ("pack_gqa", NONE),
    ("deterministic", False), ("sm_margin", 0), ("return_attn_probs", False),
]  # fmt: skip
KVCACHE = [
    ("q", inspect.Parameter.empty), ("k_cache", inspect.Parameter.empty),
    ("v_cache", inspect.Parameter.empty), ("k", NONE), ("v", NONE), ("qv", NONE),
    ("rotary_cos", NONE), ("rotary_sin", NONE), ("cache_seqlens", NONE),
    ("cache_batch_idx", NONE), ("cache_leftpad", NONE), ("page_table", NONE),
    ("cu_seqlens_q", NONE), ("cu_seqlens_k_new", NONE), ("max_seqlen_q", NONE),
    ("rotary_seqlens", NONE), ("q_descale", NONE), ("k_descale", NONE), ("v_descale", NONE),
    ("softmax_scale", NONE), ("causal", False), ("window_size", (-1, -1)),
    ("attention_chunk", 0), ("softcap", 0.0), ("rotary_interleaved", True),
    ("scheduler_metadata", NONE), ("num_splits", 0), ("pack_gqa", NONE), ("sm_margin", 0),
    ("return_softmax_lse", False),
]  # fmt: skip
COMBINE = [("out_partial", inspect.Parameter.empty), ("lse_partial", inspect.Parameter.empty),
           ("out", NONE), ("out_dtype", NONE)]  # fmt: skip
METADATA = [
    ("batch_size", inspect.Parameter.empty), ("max_seqlen_q", inspect.Parameter.empty),
    ("max_seqlen_k", inspect.Parameter.empty), ("num_heads_q", inspect.Parameter.empty),
    ("num_heads_kv", inspect.Parameter.empty), ("headdim", inspect.Parameter.empty),
    ("cache_seqlens", inspect.Parameter.empty), ("qkv_dtype", torch.bfloat16),
    ("headdim_v", NONE), ("cu_seqlens_q", NONE), ("cu_seqlens_k_new", NONE),
    ("cache_leftpad", NONE), ("page_size", NONE), ("max_seqlen_k_new", 0), ("causal", False),
    ("window_size", (-1, -1)), ("attention_chunk", 0), ("has_softcap", False),
    ("num_splits", 0), ("pack_gqa", NONE), ("sm_margin", 0),
]  # fmt: skip


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    from fa2tune.ops import torch_op

    torch_op.clear_caches()
    yield
    torch_op.clear_caches()


@pytest.mark.parametrize(("name", "expected", "extension"), [
    ("flash_attn_func", FUNC, True),
    ("flash_attn_varlen_func", VARLEN, True),
    ("flash_attn_with_kvcache", KVCACHE, True),
    ("flash_attn_combine", COMBINE, False),
    ("get_scheduler_metadata", METADATA, False),
])  # fmt: skip
def test_signatures_are_flash_attention_3s(
    name: str, expected: list[tuple[str, Any]], extension: bool
) -> None:
    import fa2tune.flash_attn as fa

    params = list(inspect.signature(getattr(fa, name)).parameters.values())
    positional = [p for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert [(p.name, p.default) for p in positional] == expected
    extra = [p for p in params if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD]
    if extension:
        assert [(p.name, p.kind, p.default) for p in extra] == [
            ("sinks", inspect.Parameter.KEYWORD_ONLY, None)
        ]
    else:
        assert extra == []


class Recorder:
    """Stands in for the torch op's run(): records the call, returns an output and an LSE
    whose first row is -inf (a row that sees no key)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, q: Any, k: Any, v: Any, causal: bool, scale: float, layout: str,
                 return_lse: bool, fallback: bool, seqs: Any = None, window: Any = (-1, -1),
                 chunk: int = 0, softcap: float = 0.0, sinks: Any = None) -> Any:  # fmt: skip
        self.calls.append({"q": q, "k": k, "causal": causal, "scale": scale, "layout": layout,
                           "return_lse": return_lse, "fallback": fallback, "seqs": seqs,
                           "window": window, "chunk": chunk, "softcap": softcap,
                           "sinks": sinks, "grad": torch.is_grad_enabled()})  # fmt: skip
        o = torch.ones_like(q)
        if not return_lse:
            return o, None
        shape = (q.shape[1], q.shape[0]) if seqs is not None else (q.shape[0], q.shape[2],
                                                                    q.shape[1])  # fmt: skip
        lse = torch.zeros(shape)
        lse.view(-1)[0] = float("-inf")
        return o, lse


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    import fa2tune.flash_attn as fa

    rec = Recorder()
    monkeypatch.setattr(fa, "run", rec)
    return rec


def _qkv(b: int = 2, nq: int = 8, nk: int = 8, h: int = 4, hkv: int = 2, d: int = 64) -> Any:
    return (torch.randn(b, nq, h, d), torch.randn(b, nk, hkv, d), torch.randn(b, nk, hkv, d))


def test_func_passes_the_call_through_without_fallback(recorder: Recorder) -> None:
    from fa2tune.flash_attn import flash_attn_func

    q, k, v = _qkv()
    sinks = torch.zeros(4)
    out = flash_attn_func(q, k, v, causal=True, window_size=torch.tensor([5, 0]),
                          attention_chunk=16, softcap=30.0, sinks=sinks)  # fmt: skip
    (call,) = recorder.calls
    assert isinstance(out, torch.Tensor) and out.shape == q.shape
    assert call["fallback"] is False and call["return_lse"] is False and call["layout"] == "bnhd"
    assert call["causal"] is True and call["window"] == (5, 0) and call["chunk"] == 16
    assert call["softcap"] == 30.0 and call["sinks"] is sinks
    assert call["scale"] == pytest.approx(64**-0.5)


def test_lse_and_return_conventions(recorder: Recorder) -> None:
    from fa2tune.flash_attn import flash_attn_func, flash_attn_varlen_func

    q, k, v = _qkv()
    out, lse = flash_attn_func(q, k, v, softmax_scale=0.5, return_attn_probs=True)
    assert lse.shape == (2, 4, 8) and lse.dtype == torch.float32
    assert lse.view(-1)[0] == float("inf")  # FlashAttention's empty row, not fa2tune's -inf
    assert recorder.calls[-1]["scale"] == 0.5
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    out, lse = flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 5, 5, return_attn_probs=True)
    assert out.shape == q[0].shape and lse.shape == (4, 8) and lse[0, 0] == float("inf")
    seqs = recorder.calls[-1]["seqs"]
    assert (seqs.max_q, seqs.max_k) == (5, 5) and seqs.cu_q is cu


def test_hints_are_accepted_and_change_nothing(recorder: Recorder) -> None:
    from fa2tune.flash_attn import flash_attn_func, flash_attn_varlen_func

    q, k, v = _qkv()
    for hints in ({"num_splits": 0}, {"num_splits": 3}, {"pack_gqa": True},
                  {"pack_gqa": False}, {"sm_margin": 8}):  # fmt: skip
        flash_attn_func(q, k, v, causal=True, **hints)
        cu = torch.tensor([0, 8], dtype=torch.int32)
        flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 8, 8, **hints)
    dense = [c for c in recorder.calls if c["seqs"] is None]
    assert all({**c, "q": None, "k": None} == {**dense[0], "q": None, "k": None} for c in dense)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"qv": torch.zeros(2, 8, 4, 64)}, "qv"),
    ({"q_descale": torch.ones(2, 2)}, "q_descale"),
    ({"k_descale": torch.ones(2, 2)}, "k_descale"),
    ({"v_descale": torch.ones(2, 2)}, "v_descale"),
    ({"deterministic": True}, "deterministic"),
])  # fmt: skip
def test_refused_arguments(recorder: Recorder, kwargs: dict[str, Any], words: str) -> None:
    from fa2tune.flash_attn import flash_attn_func, flash_attn_varlen_func

    q, k, v = _qkv()
    with pytest.raises(NotImplementedError, match=words):
        flash_attn_func(q, k, v, **kwargs)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    varlen_kwargs = {n: (x[0] if n == "qv" else x) for n, x in kwargs.items()}
    with pytest.raises(NotImplementedError, match=words):
        flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 8, 8, **varlen_kwargs)
    assert recorder.calls == []


def test_refused_tensors(recorder: Recorder) -> None:
    from fa2tune.flash_attn import flash_attn_func, flash_attn_varlen_func

    q, k, v = _qkv()
    with pytest.raises(NotImplementedError, match="V head dim"):
        flash_attn_func(q, k, torch.randn(2, 8, 2, 128))
    fp8 = getattr(torch, "float8_e4m3fn", None)
    if fp8 is not None:
        with pytest.raises(NotImplementedError, match="fp8"):
            flash_attn_func(q.to(fp8), k.to(fp8), v.to(fp8))
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="seqused_q must be a 1-d int32"):
        flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 8, 8, seqused_q=torch.tensor([8]))
    with pytest.raises(ValueError, match="seqused_k has 2 entries for 1 sequences"):
        flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 8, 8,
                               seqused_k=torch.tensor([8, 8], dtype=torch.int32))  # fmt: skip
    assert recorder.calls == []


def test_unservable_calls_are_not_implemented_never_a_fallback() -> None:
    from fa2tune.flash_attn import flash_attn_func

    q, k, v = _qkv()  # CPU tensors: the kernels cannot serve them, and nothing falls back
    with pytest.raises(NotImplementedError, match="cpu"):
        flash_attn_func(q, k, v)


def test_forward_only_autograd(recorder: Recorder) -> None:
    from fa2tune.flash_attn import flash_attn_func

    q, k, v = (t.requires_grad_() for t in _qkv())
    out, lse = flash_attn_func(q, k, v, return_attn_probs=True)
    assert recorder.calls[-1]["grad"] is False  # the op runs its forward without a graph
    assert out.requires_grad and not lse.requires_grad
    with pytest.raises(NotImplementedError, match="forward-only"):
        out.sum().backward()
    with torch.no_grad():
        detached = flash_attn_func(q, k, v)
    assert isinstance(detached, torch.Tensor) and not detached.requires_grad


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"rotary_cos": torch.zeros(8, 16), "rotary_sin": torch.zeros(8, 16)}, "rotary"),
    ({"qv": torch.zeros(2, 8, 4, 64)}, "qv"),
    ({"k_descale": torch.ones(2, 2)}, "k_descale"),
])  # fmt: skip
def test_kvcache_refuses_what_it_does_not_run(
    recorder: Recorder, kwargs: dict[str, Any], words: str
) -> None:
    from fa2tune.flash_attn import flash_attn_with_kvcache

    q, k, v = _qkv(nk=16)
    with pytest.raises(NotImplementedError, match=words):
        flash_attn_with_kvcache(q, k, v, **kwargs)
    assert recorder.calls == []


def test_kvcache_takes_the_scheduler_hints_and_checks_int_lengths() -> None:
    """Hints are accepted (metadata is an empty tensor); an int length outside the cache is a
    ValueError before anything runs; the rest reaches the cache op (which refuses CPU
    tensors without a fallback: NotImplementedError with the reason)."""
    from fa2tune.flash_attn import flash_attn_with_kvcache, get_scheduler_metadata

    q, k, v = _qkv(nq=1, nk=16)
    meta = get_scheduler_metadata(2, 1, 16, 4, 2, 64, torch.zeros(2, dtype=torch.int32))
    assert meta.numel() == 0 and meta.dtype == torch.int32
    with pytest.raises(ValueError, match="cache_seqlens 17"):
        flash_attn_with_kvcache(q, k, v, cache_seqlens=17)
    with pytest.raises(NotImplementedError, match="not a CUDA device"):
        flash_attn_with_kvcache(q, k, v, cache_seqlens=10, causal=True, num_splits=0,
                                scheduler_metadata=meta, pack_gqa=True)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_combine_is_the_lse_weighted_sum(dtype: Any) -> None:
    from fa2tune.flash_attn import flash_attn_combine

    gen = torch.Generator().manual_seed(1)
    splits, b, n, h, d = 5, 3, 7, 4, 16
    out_p = torch.randn(splits, b, n, h, d, generator=gen)
    lse_p = torch.randn(splits, b, n, h, generator=gen)
    lse_p[3:, :1] = float("-inf")  # some splits saw nothing
    lse_p[:, 2, 0] = float("-inf")  # a row no split saw
    out, lse = flash_attn_combine(out_p, lse_p, out_dtype=dtype)
    assert out.shape == (b, n, h, d) and out.dtype == dtype and lse.shape == (b, n, h)
    # Written out: out = sum_s exp(lse_s - lse) out_s with lse = log sum_s exp(lse_s).
    for bi, ni, hi in [(0, 0, 0), (1, 3, 2), (2, 6, 3)]:
        terms = lse_p[:, bi, ni, hi].double()
        ref_lse = torch.logsumexp(terms, 0)
        ref = (torch.exp(terms - ref_lse)[:, None] * out_p[:, bi, ni, hi].double()).sum(0)
        torch.testing.assert_close(lse[bi, ni, hi].double(), ref_lse, atol=1e-6, rtol=1e-6)
        tol = 1e-5 if dtype == torch.float32 else 1e-2  # float32 math, then the dtype
        torch.testing.assert_close(out[bi, ni, hi].double(), ref, atol=tol, rtol=tol)
    assert torch.isneginf(lse[2, 0]).all() and (out[2, 0] == 0).all()
    into = torch.empty(b, n, h, d, dtype=torch.float16)
    got, _ = flash_attn_combine(out_p, lse_p, out=into)
    assert got is into


def test_the_peer_alias_module_reexports_the_interface() -> None:
    import importlib.util
    from pathlib import Path

    import fa2tune.flash_attn as fa

    path = Path(__file__).parents[2] / "bench" / "peer" / "alias" / "flash_attn_interface.py"
    spec = importlib.util.spec_from_file_location("flash_attn_interface_alias", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in fa.__all__:
        assert getattr(module, name) is getattr(fa, name)


def _reference_rows(q: Any, k: Any, v: Any, causal: bool, scale: float) -> tuple[Any, Any]:
    """One sequence's O [nq, Hq, D] and LSE [Hq, nq] in float64 (bottom-right causal)."""
    nq, hq, _ = q.shape
    nk, hkv, _ = k.shape
    kh = k.double().repeat_interleave(hq // hkv, dim=1)
    vh = v.double().repeat_interleave(hq // hkv, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.double(), kh) * scale
    if causal:
        i = torch.arange(nq).view(-1, 1) + (nk - nq)
        s = s.masked_fill(torch.arange(nk).view(1, -1) > i, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, vh), lse


@pytest.mark.parametrize("causal", [False, True])
def test_seqused_rows_alone_are_attended(monkeypatch: pytest.MonkeyPatch, causal: bool) -> None:
    """Each sequence uses the first seqused rows of its span (0 included): the result is the
    per-sequence attention of those rows; unused query rows get zeros and an LSE of +inf.
    The op runs its torch path here (CPU tensors), as the GPU would run the packed kernel on
    the same compacted rows."""
    import fa2tune.flash_attn as fa
    from fa2tune.ops import torch_op

    def with_fallback(*args: Any, **kwargs: Any) -> Any:
        args = (*args[:7], True, *args[8:])  # fallback=True: the torch path on the CPU
        return torch_op.run(*args, **kwargs)

    monkeypatch.setattr(fa, "run", with_fallback)
    torch.manual_seed(3)
    hq, hkv, d = 4, 2, 16
    cu_q = torch.tensor([0, 5, 9, 15], dtype=torch.int32)
    cu_k = torch.tensor([0, 7, 7, 19], dtype=torch.int32)
    used_q = torch.tensor([3, 4, 0], dtype=torch.int32)
    used_k = torch.tensor([6, 0, 9], dtype=torch.int32)
    q, k, v = torch.randn(15, hq, d), torch.randn(19, hkv, d), torch.randn(19, hkv, d)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, lse = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 12, seqused_q=used_q,
                                             seqused_k=used_k, causal=causal,
                                             return_attn_probs=True)  # fmt: skip
    assert out.shape == q.shape and lse.shape == (hq, 15)
    for b in range(3):
        q0, k0, nq, nk = int(cu_q[b]), int(cu_k[b]), int(used_q[b]), int(used_k[b])
        want_o, want_lse = _reference_rows(q[q0 : q0 + nq], k[k0 : k0 + nk], v[k0 : k0 + nk],
                                           causal, d**-0.5)  # fmt: skip
        got_lse = lse[:, q0 : q0 + nq].double()
        assert torch.allclose(out[q0 : q0 + nq].double(), want_o, atol=1e-5), b
        finite = torch.isfinite(want_lse)
        assert torch.allclose(got_lse[finite], want_lse[finite], atol=1e-5), b
        assert torch.all(got_lse[~finite] == float("inf")), b  # no key: +inf, as FA says
        unused = slice(q0 + nq, int(cu_q[b + 1]))
        assert torch.all(out[unused] == 0) and torch.all(lse[:, unused] == float("inf")), b
