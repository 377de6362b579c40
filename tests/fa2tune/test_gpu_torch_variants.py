"""Attention variants through fa2tune.torch and fa2tune.flash_attn on a real GPU (marker
``gpu``).

First-use tuning is off (``autotune("off")``): every call gets its family's default with the
variant's switches, so what is checked is the variant kernels and their launch (FaVariant
last, the sinks pointer per call), not a search. Each variant (window, chunk, softcap,
sinks, combined; dense in both layouts and packed) with ``fallback=False`` against the
op's own float32 fallback (checked against brute force on CPU in
test_torch_variants_cpu.py); a variant that no family's kernels take yet is skipped with the
family's reason. Also: CUDA-graph capture and replay with new sink values, torch.compile
(fullgraph) of a variant call, and fa2tune.flash_attn's conventions on the GPU (outputs,
the +inf LSE of rows that see no key, packed batches).

Skipped, with the reason, without torch, cuda-bindings, a CUDA GPU of sm_80+ or a kernel
compiler (nvcc, or NVRTC from the wheels).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest

from core.variant import Variant, normalize
from tests.support.gpu import torch_op_skip_reason

_REASON = torch_op_skip_reason()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_REASON is not None, reason=f"fa2tune variant GPU tests: {_REASON}"),
]


@pytest.fixture(autouse=True)
def _defaults_only() -> Iterator[None]:
    from fa2tune.ops import torch_op
    from fa2tune.torch import autotune

    autotune("off")
    torch_op.clear_caches()
    yield
    torch_op.clear_caches()
    autotune("cached")


def _served_or_skip(variant: Variant, causal: bool, packed: bool = False) -> None:
    """Skip, with the family's reason, a variant no default's family builds yet."""
    from core.shape import Shape
    from fa2tune.ops.choice import default_config, default_varlen_config, with_variant

    if packed:
        config = default_varlen_config(64, "fp16", causal, variant)
    else:
        config = default_config(64, "fp16", causal, Shape(256, 256, 2, 4, 4), 132, variant)
    if config is None:
        from codegen.families.fa2.space import fa2_default_config

        pytest.skip(with_variant(fa2_default_config(64, "fp16", causal), variant)[1])


VARIANTS = [
    # (causal, window, chunk, softcap, sinks)
    (False, (64, 32), 0, 0.0, False),
    (True, (100, -1), 0, 0.0, False),
    (False, (-1, -1), 96, 0.0, False),
    (True, (-1, -1), 64, 0.0, False),
    (False, (-1, -1), 0, 20.0, False),
    (True, (-1, -1), 0, 5.0, False),
    (False, (-1, -1), 0, 0.0, True),
    (True, (-1, -1), 0, 0.0, True),
    (True, (80, -1), 64, 30.0, True),
]


def _tensors(b: int, nq: int, nk: int, h: int, hkv: int, d: int, layout: str = "bnhd") -> Any:
    import torch

    gen = torch.Generator(device="cuda").manual_seed(nq + nk)

    def make(n: int, heads: int) -> Any:
        dims = (b, n, heads, d) if layout == "bnhd" else (b, heads, n, d)
        return torch.randn(dims, device="cuda", dtype=torch.float16, generator=gen)

    return make(nq, h), make(nk, hkv), make(nk, hkv)


@pytest.mark.parametrize(("causal", "window", "chunk", "cap", "with_sinks"), VARIANTS)
@pytest.mark.parametrize(("nq", "nk", "layout"), [(256, 256, "bnhd"), (200, 333, "bhnd"),
                                                  (333, 200, "bnhd")])  # fmt: skip
def test_variant_kernels_match_the_fallback(
    causal: bool, window: tuple[int, int], chunk: int, cap: float, with_sinks: bool,
    nq: int, nk: int, layout: str,
) -> None:  # fmt: skip
    import torch

    from fa2tune.ops.fallback import sdpa_fallback
    from fa2tune.torch import attention

    c, variant = normalize(causal, *window, chunk, nq=nq, nk=nk, softcap=cap, sinks=with_sinks)
    _served_or_skip(variant, c)
    q, k, v = _tensors(2, nq, nk, 4, 2, 64, layout)
    sinks = torch.linspace(-1.0, 2.0, 4, device="cuda") if with_sinks else None
    o, lse = attention(q, k, v, causal=causal, layout=layout, return_lse=True, fallback=False,
                       window_size=window, attention_chunk=chunk, softcap=cap,
                       sinks=sinks)  # fmt: skip
    lay: Any = layout
    ref_o, ref_lse = sdpa_fallback(q, k, v, c, 1 / math.sqrt(64), lay, True, variant, sinks)
    torch.testing.assert_close(o, ref_o, atol=2e-3, rtol=2e-3)
    dead = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), dead)
    torch.testing.assert_close(lse[~dead], ref_lse[~dead], atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize(("causal", "window", "chunk", "cap", "with_sinks"), VARIANTS[::2])
def test_packed_variant_kernels_match_the_fallback(
    causal: bool, window: tuple[int, int], chunk: int, cap: float, with_sinks: bool
) -> None:
    import torch

    from fa2tune.ops.choice import normalize_call
    from fa2tune.ops.fallback import varlen_fallback
    from fa2tune.torch import attention_varlen

    lengths_q, lengths_k = [100, 1, 257, 0, 64], [130, 300, 257, 5, 20]
    max_q, max_k = max(lengths_q), max(lengths_k)
    c, variant = normalize_call(causal, *window, chunk, cap, with_sinks, max_q, max_k, True)
    _served_or_skip(variant, c, packed=True)
    cu_q = torch.tensor([0, *torch.tensor(lengths_q).cumsum(0).tolist()], dtype=torch.int32,
                        device="cuda")  # fmt: skip
    cu_k = torch.tensor([0, *torch.tensor(lengths_k).cumsum(0).tolist()], dtype=torch.int32,
                        device="cuda")  # fmt: skip
    q = torch.randn(sum(lengths_q), 4, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(sum(lengths_k), 2, 64, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    sinks = torch.linspace(-1.0, 2.0, 4, device="cuda") if with_sinks else None
    o, lse = attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, return_lse=True,
                              fallback=False, window_size=window, attention_chunk=chunk,
                              softcap=cap, sinks=sinks)  # fmt: skip
    ref_o, ref_lse = varlen_fallback(q, k, v, cu_q, cu_k, max_q, max_k, c, 1 / math.sqrt(64),
                                     True, variant, sinks)  # fmt: skip
    assert ref_lse is not None
    torch.testing.assert_close(o, ref_o, atol=2e-3, rtol=2e-3)
    dead = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), dead)
    torch.testing.assert_close(lse[~dead], ref_lse[~dead], atol=1e-3, rtol=1e-3)


def test_cuda_graph_replay_reads_the_sinks_given() -> None:
    import torch

    from fa2tune.ops.fallback import sdpa_fallback
    from fa2tune.torch import attention

    variant = Variant(sinks=True)
    _served_or_skip(variant, True)
    q, k, v = _tensors(2, 128, 256, 4, 4, 64)
    sinks = torch.zeros(4, device="cuda")
    attention(q, k, v, causal=True, sinks=sinks, fallback=False)  # decided and built
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = attention(q, k, v, causal=True, sinks=sinks, fallback=False)
    sinks.copy_(torch.tensor([3.0, -2.0, 0.5, 8.0], device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    ref, _ = sdpa_fallback(q, k, v, True, 1 / 8, "bnhd", False, variant, sinks)
    torch.testing.assert_close(o, ref, atol=2e-3, rtol=2e-3)


def test_torch_compile_of_a_variant_call() -> None:
    import torch

    from fa2tune.ops.fallback import sdpa_fallback
    from fa2tune.torch import attention

    variant = Variant(64, 0, softcap=10.0)
    _served_or_skip(variant, True)
    q, k, v = _tensors(2, 256, 256, 4, 2, 64)

    def block(q: Any, k: Any, v: Any) -> Any:
        return attention(q, k, v, causal=True, window_size=(64, 0), softcap=10.0,
                         fallback=False)  # fmt: skip

    out = torch.compile(block, fullgraph=True)(q, k, v)
    ref, _ = sdpa_fallback(q, k, v, True, 1 / 8, "bnhd", False, variant)
    torch.testing.assert_close(out, ref, atol=2e-3, rtol=2e-3)


def test_flash_attn_interface_on_the_gpu() -> None:
    import torch

    from fa2tune.flash_attn import flash_attn_func, flash_attn_varlen_func
    from fa2tune.ops.fallback import sdpa_fallback

    # nq > nk, causal: the first rows see no key; FlashAttention's LSE there is +inf.
    q, k, v = _tensors(2, 300, 200, 6, 2, 128)
    out, lse = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    ref, ref_lse = sdpa_fallback(q, k, v, True, 128**-0.5, "bnhd", True)
    torch.testing.assert_close(out, ref, atol=2e-3, rtol=2e-3)
    dead = torch.isneginf(ref_lse)
    assert dead.any() and torch.all(torch.isposinf(lse[dead]))
    torch.testing.assert_close(lse[~dead], ref_lse[~dead], atol=1e-3, rtol=1e-3)
    cu = torch.tensor([0, 300, 600], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 200, 400], dtype=torch.int32, device="cuda")
    packed = flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu_k,
                                    300, 200, causal=True)  # fmt: skip
    assert isinstance(packed, torch.Tensor)
    torch.testing.assert_close(packed.view_as(q), ref, atol=2e-3, rtol=2e-3)
    grads = [t.clone().requires_grad_() for t in (q, k, v)]
    out_g = flash_attn_func(*grads, causal=True)
    assert isinstance(out_g, torch.Tensor) and out_g.requires_grad
    with pytest.raises(NotImplementedError, match="forward-only"):
        out_g.float().sum().backward()
