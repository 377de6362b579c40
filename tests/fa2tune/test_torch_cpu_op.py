"""fa2tune.torch with torch but without a GPU: the op's registration, its fake (meta)
implementation, the SDPA fallback for CPU tensors and tracing under torch.compile.

Skipped where torch is not installed (the base install); runs on any machine with torch,
including the GPU hosts, where CPU tensors still take the fallback.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    from fa2tune.ops import torch_op

    torch_op.clear_caches()  # warnings are once per reason and process
    yield
    torch_op.clear_caches()


def _reference(q: Any, k: Any, v: Any, causal: bool, layout: str) -> tuple[Any, Any]:
    qh, kh, vh = (t if layout == "bhnd" else t.transpose(1, 2) for t in (q, k, v))
    qh, kh, vh = qh.float(), kh.float(), vh.float()
    group = qh.shape[1] // kh.shape[1]
    kh, vh = kh.repeat_interleave(group, 1), vh.repeat_interleave(group, 1)
    nq, nk, d = qh.shape[2], kh.shape[2], qh.shape[3]
    s = qh @ kh.transpose(-1, -2) / math.sqrt(d)
    if causal:
        seen = torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq)
        s = s.masked_fill(~seen, float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.softmax(s, -1).nan_to_num(0.0) @ vh
    return (o if layout == "bhnd" else o.transpose(1, 2)), lse


def _inputs(b: int, h: int, hkv: int, nq: int, nk: int, d: int, layout: str) -> tuple[Any, ...]:
    gen = torch.Generator().manual_seed(0)

    def make(n: int, heads: int) -> Any:
        dims = (b, n, heads, d) if layout == "bnhd" else (b, heads, n, d)
        return torch.randn(dims, generator=gen)

    return make(nq, h), make(nk, hkv), make(nk, hkv)


def test_op_is_registered() -> None:
    import fa2tune.torch as ft

    assert hasattr(torch.ops.fa2tune, "attention")
    assert callable(ft.autotune) and callable(ft.attention)
    schema = str(torch.ops.fa2tune.attention.default._schema)
    assert "bool causal" in schema and "-> (Tensor, Tensor)" in schema


@pytest.mark.parametrize("layout", ["bnhd", "bhnd"])
@pytest.mark.parametrize("causal", [False, True])
def test_cpu_tensors_fall_back_once(layout: str, causal: bool) -> None:
    from fa2tune.torch import FallbackWarning, Unsupported, attention

    q, k, v = _inputs(2, 4, 2, 7, 11, 32, layout)  # GQA, causal with Nq < Nk
    with pytest.warns(FallbackWarning, match="tensors on cpu"):
        o = attention(q, k, v, causal=causal, layout=layout)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per reason
        o2, lse = attention(q, k, v, causal=causal, layout=layout, return_lse=True)
    ref_o, ref_lse = _reference(q, k, v, causal, layout)
    assert o.shape == q.shape and o.is_contiguous()
    assert torch.allclose(o, ref_o, atol=1e-4) and torch.allclose(o2, ref_o, atol=1e-4)
    assert lse.shape == ref_lse.shape and torch.allclose(lse, ref_lse, atol=1e-4)
    with pytest.raises(Unsupported, match="cpu"):
        attention(q, k, v, causal=causal, layout=layout, fallback=False)


def test_rows_that_see_no_key() -> None:
    from fa2tune.torch import attention

    q, k, v = _inputs(1, 2, 2, 5, 3, 32, "bnhd")  # causal, Nq > Nk: 2 rows see nothing
    with pytest.warns(UserWarning):
        o, lse = attention(q, k, v, causal=True, return_lse=True)
    assert torch.equal(o[:, :2], torch.zeros_like(o[:, :2]))
    assert torch.isinf(lse[..., :2]).all() and (lse[..., :2] < 0).all()
    ref_o, ref_lse = _reference(q, k, v, True, "bnhd")
    assert torch.allclose(o[:, 2:], ref_o[:, 2:], atol=1e-4)
    assert torch.allclose(lse[..., 2:], ref_lse[..., 2:], atol=1e-4)


def test_bad_calls_raise_value_error_either_way() -> None:
    from fa2tune.torch import attention

    q, k, v = _inputs(2, 4, 2, 8, 8, 32, "bnhd")
    for fallback in (True, False):
        with pytest.raises(ValueError, match="layout"):
            attention(q, k, v, layout="nhd", fallback=fallback)
        with pytest.raises(ValueError, match="do not match"):
            attention(q, k[:1], v[:1], fallback=fallback)
        with pytest.raises(ValueError, match="do not match"):
            attention(
                q,
                k[:, :, :1].expand(2, 8, 3, 32),
                v[:, :, :1].expand(2, 8, 3, 32),
                fallback=fallback,
            )  # fmt: skip  (4 q heads, 3 kv heads)


@pytest.mark.parametrize("layout", ["bnhd", "bhnd"])
def test_fake_implementation_on_meta_tensors(layout: str) -> None:
    import fa2tune.torch  # noqa: F401  (registers the op)

    b, h, hkv, nq, nk, d = 2, 8, 2, 100, 300, 64
    qdims = (b, nq, h, d) if layout == "bnhd" else (b, h, nq, d)
    kdims = (b, nk, hkv, d) if layout == "bnhd" else (b, hkv, nk, d)
    q = torch.empty(qdims, dtype=torch.bfloat16, device="meta")
    k = torch.empty(kdims, dtype=torch.bfloat16, device="meta")
    o, lse = torch.ops.fa2tune.attention(q, k, k, True, 0.125, layout, True, True)
    assert tuple(o.shape) == qdims and o.dtype == torch.bfloat16 and o.device.type == "meta"
    assert tuple(lse.shape) == (b, h, nq) and lse.dtype == torch.float32
    o2, lse2 = torch.ops.fa2tune.attention(q, k, k, False, 0.125, layout, False, True)
    assert tuple(o2.shape) == qdims and lse2.numel() == 0 and lse2.dtype == torch.float32


def test_traced_by_torch_compile_fullgraph() -> None:
    """Dynamo traces attention() to the one custom op (fullgraph: no graph break); run on
    CPU tensors it falls back inside the op."""
    from fa2tune.torch import attention

    q, k, v = _inputs(2, 4, 2, 16, 16, 32, "bnhd")

    def block(q: Any, k: Any, v: Any) -> Any:
        return attention(q * 1.0, k, v, causal=True).sum(dim=-1)

    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's warning, inside the op
        out = compiled(q, k, v)
    ref = _reference(q, k, v, True, "bnhd")[0].sum(dim=-1)
    assert torch.allclose(out, ref, atol=1e-4)
