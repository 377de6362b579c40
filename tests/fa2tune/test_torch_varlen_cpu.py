"""fa2tune.torch.attention_varlen with torch but without a GPU: argument checks, the op's
registration and fake implementation, the per-sequence fallback on CPU tensors and tracing
under torch.compile.

Skipped where torch is not installed; runs on any machine with torch (CPU tensors take the
fallback on GPU hosts too).
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
    from fa2tune.torch import clear_caches

    clear_caches()  # warnings are once per reason and process
    yield
    clear_caches()


def _packed(
    lens_q: list[int], lens_k: list[int], h: int, hkv: int, d: int, dtype: Any = None
) -> tuple[Any, ...]:
    gen = torch.Generator().manual_seed(0)
    dt = dtype or torch.float32
    q = torch.randn(sum(lens_q), h, d, generator=gen).to(dt)
    k = torch.randn(sum(lens_k), hkv, d, generator=gen).to(dt)
    v = torch.randn(sum(lens_k), hkv, d, generator=gen).to(dt)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    return q, k, v, cu_q, cu_k


def _reference(q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any, causal: bool) -> tuple[Any, Any]:
    """float32 O [total_q, H, D] and LSE [H, total_q], sequence by sequence."""
    bq, bk = cu_q.tolist(), cu_k.tolist()
    h, d = q.shape[1], q.shape[2]
    o = torch.zeros(q.shape, dtype=torch.float32)
    lse = torch.full((h, q.shape[0]), float("-inf"))
    for i in range(len(bq) - 1):
        qi = q[bq[i] : bq[i + 1]].float().transpose(0, 1)
        ki = k[bk[i] : bk[i + 1]].float().transpose(0, 1)
        vi = v[bk[i] : bk[i + 1]].float().transpose(0, 1)
        group = h // ki.shape[0]
        ki, vi = ki.repeat_interleave(group, 0), vi.repeat_interleave(group, 0)
        nq, nk = qi.shape[1], ki.shape[1]
        if nq == 0 or nk == 0:
            continue
        s = qi @ ki.transpose(-1, -2) / math.sqrt(d)
        if causal:
            seen = torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq)
            s = s.masked_fill(~seen, float("-inf"))
        lse[:, bq[i] : bq[i + 1]] = torch.logsumexp(s, -1)
        o[bq[i] : bq[i + 1]] = (torch.softmax(s, -1).nan_to_num(0.0) @ vi).transpose(0, 1)
    return o, lse


def test_op_is_registered_and_exported() -> None:
    import fa2tune.torch as ft

    assert callable(ft.attention_varlen) and hasattr(torch.ops.fa2tune, "attention_varlen")
    schema = str(torch.ops.fa2tune.attention_varlen.default._schema)
    assert "max_seqlen_q" in schema and "-> (Tensor, Tensor)" in schema


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_tensors_fall_back_once_per_sequence(causal: bool) -> None:
    from fa2tune.torch import FallbackWarning, Unsupported, attention_varlen

    lens_q, lens_k = [1, 7, 3, 12], [1, 9, 2, 12]  # a sequence with fewer keys than queries
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, 4, 2, 32)
    with pytest.warns(FallbackWarning, match="tensors on cpu"):
        o = attention_varlen(q, k, v, cu_q, cu_k, 12, 12, causal=causal)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per reason
        o2, lse = attention_varlen(q, k, v, cu_q, cu_k, 12, 12, causal=causal, return_lse=True)
    ref_o, ref_lse = _reference(q, k, v, cu_q, cu_k, causal)
    assert o.shape == q.shape and o.is_contiguous()
    assert torch.allclose(o, ref_o, atol=1e-4) and torch.allclose(o2, ref_o, atol=1e-4)
    assert lse.shape == (4, sum(lens_q)) and lse.dtype == torch.float32
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse))  # causal: rows that see no key are -inf
    assert torch.allclose(lse[finite], ref_lse[finite], atol=1e-4)
    with pytest.raises(Unsupported, match="cpu"):
        attention_varlen(q, k, v, cu_q, cu_k, 12, 12, causal=causal, fallback=False)


def test_empty_sequences_and_uncovered_rows() -> None:
    from fa2tune.torch import attention_varlen

    q, k, v, _, _ = _packed([3, 4], [5, 2], 2, 2, 16)
    cu_q = torch.tensor([0, 3, 3, 6], dtype=torch.int32)  # an empty sequence; row 6 uncovered
    cu_k = torch.tensor([0, 5, 7, 7], dtype=torch.int32)  # sequence 2 has no keys
    with pytest.warns(UserWarning):
        o, lse = attention_varlen(q, k, v, cu_q, cu_k, 3, 5, return_lse=True)
    ref_o, ref_lse = _reference(q, k, v, cu_q[:2], cu_k[:2], False)
    assert torch.allclose(o[:3], ref_o[:3], atol=1e-4)
    assert torch.equal(o[3:], torch.zeros_like(o[3:]))
    assert torch.isinf(lse[:, 3:]).all() and (lse[:, 3:] < 0).all()
    assert torch.allclose(lse[:, :3], ref_lse[:, :3], atol=1e-4)


def test_empty_batch_of_queries() -> None:
    from fa2tune.torch import attention_varlen

    q = torch.empty(0, 4, 32)
    k = torch.randn(5, 4, 32)
    cu = torch.tensor([0, 0], dtype=torch.int32)
    o, lse = attention_varlen(q, k, k, cu, torch.tensor([0, 5], dtype=torch.int32), 0, 5,
                              return_lse=True)  # fmt: skip
    assert o.shape == (0, 4, 32) and lse.shape == (4, 0)


def test_gradients_flow_through_the_fallback() -> None:
    from fa2tune.torch import attention_varlen

    q, k, v, cu_q, cu_k = _packed([3, 5], [3, 5], 2, 1, 16)
    q.requires_grad_(True)
    with pytest.warns(UserWarning):
        o = attention_varlen(q, k, v, cu_q, cu_k, 5, 5, causal=True)
    o.sum().backward()
    assert q.grad is not None and q.grad.shape == q.shape


def test_bad_calls_raise_value_error_either_way() -> None:
    from fa2tune.torch import attention_varlen

    q, k, v, cu_q, cu_k = _packed([3, 5], [4, 4], 4, 2, 32)
    for fallback in (True, False):

        def call(*args: Any, fallback: bool = fallback) -> Any:
            return attention_varlen(*args, fallback=fallback)

        with pytest.raises(ValueError, match="3-d packed"):
            call(q.unsqueeze(0), k, v, cu_q, cu_k, 5, 4)
        with pytest.raises(ValueError, match="q heads a multiple of kv heads"):
            call(q, k[:, :1].expand(8, 3, 32), v[:, :1].expand(8, 3, 32), cu_q, cu_k, 5, 4)
        with pytest.raises(ValueError, match="int32"):
            call(q, k, v, cu_q.long(), cu_k, 5, 4)
        with pytest.raises(ValueError, match="entries but cu_seqlens_k"):
            call(q, k, v, cu_q, cu_k[:2], 5, 4)
        with pytest.raises(ValueError, match="num_seqs \\+ 1 >= 2"):
            call(q, k, v, cu_q[:1], cu_k[:1], 5, 4)
        with pytest.raises(ValueError, match="Python int"):
            call(q, k, v, cu_q, cu_k, torch.tensor(5), 4)
        with pytest.raises(ValueError, match="share one dtype"):
            call(q, k.half(), v.half(), cu_q, cu_k, 5, 4)
    # The fallback reads the offsets: ones that pass the rows are refused there.
    bad = torch.tensor([0, 3, 99], dtype=torch.int32)
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="past the 8 packed rows"):
        attention_varlen(q, k, v, bad, cu_k, 96, 4)


def test_fake_implementation_on_meta_tensors() -> None:
    import fa2tune.torch  # noqa: F401  (registers the op)

    q = torch.empty(300, 8, 64, dtype=torch.bfloat16, device="meta")
    k = torch.empty(500, 2, 64, dtype=torch.bfloat16, device="meta")
    cu = torch.empty(5, dtype=torch.int32, device="meta")
    o, lse = torch.ops.fa2tune.attention_varlen(q, k, k, cu, cu, 100, 200, True, 0.125, True,
                                                True)  # fmt: skip
    assert tuple(o.shape) == (300, 8, 64) and o.dtype == torch.bfloat16 and o.device.type == "meta"
    assert tuple(lse.shape) == (8, 300) and lse.dtype == torch.float32
    o2, lse2 = torch.ops.fa2tune.attention_varlen(q, k, k, cu, cu, 100, 200, False, 0.125,
                                                  False, True)  # fmt: skip
    assert tuple(o2.shape) == (300, 8, 64) and lse2.numel() == 0


def test_traced_by_torch_compile_fullgraph() -> None:
    """Dynamo traces attention_varlen() to the one custom op (no graph break); on CPU tensors
    it falls back inside the op."""
    from fa2tune.torch import attention_varlen

    q, k, v, cu_q, cu_k = _packed([5, 11, 1], [5, 11, 1], 4, 2, 32)

    def block(q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any) -> Any:
        o, lse = attention_varlen(q * 1.0, k, v, cu_q, cu_k, 11, 11, causal=True,
                                  return_lse=True)  # fmt: skip
        return o.sum(dim=-1), lse

    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's warning, inside the op
        out, lse = compiled(q, k, v, cu_q, cu_k)
    ref_o, ref_lse = _reference(q, k, v, cu_q, cu_k, True)
    assert torch.allclose(out, ref_o.sum(dim=-1), atol=1e-4)
    assert torch.allclose(lse, ref_lse, atol=1e-4)
