"""fa2tune.torch on a real GPU (marker ``gpu``): the op against a float32 reference.

A temporary database (``FA2TUNE_DB_URL`` overridden through core.settings) is seeded with
one exact-shape result per family for this GPU, so each call below is served by a known
family: fa2 (prefill, N=1000, D=64, causal), split-KV (decode: Nq=1, Nk=8192, B=2, H=32,
Hkv=8, D=128) and, on compute capability 9.0, fa3 (N=1000, D=128). The shipped results are
loaded into it as ``fa2tune best`` does. Checked: outputs and LSE in both layouts,
``torch.compile(fullgraph=True)`` (also with ``mode="reduce-overhead"``: CUDA-graph trees),
CUDA-graph capture and replay with new inputs, the fake implementation under FakeTensorMode,
the SDPA fallback warning (once) for D=264 and ``fallback=False`` raising,
FA2TUNE_PRINT_CHOICE's log line, and (marker ``slow`` too: a 25 s campaign plus builds)
first-use tuning writing a verified result to a temporary database.

Skipped, with the reason, without torch, cuda-bindings, a CUDA GPU of sm_80+ or a kernel
compiler (nvcc, or NVRTC from the wheels).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from codegen.families.fa2.space import fa2_default_config
from codegen.families.fa3.space import default_config as fa3_default
from codegen.families.splitkv.space import default_config as splitkv_default
from core import settings as settings_module
from core.problem import Problem
from core.settings import override_settings
from db.store import Store
from tests.support.factories import H200, ok_result, seed_measurement
from tests.support.gpu import torch_op_skip_reason

_REASON = torch_op_skip_reason()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_REASON is not None, reason=f"fa2tune.torch GPU tests: {_REASON}"),
]

# (batch, heads, kv_heads, nq, nk, d, causal)
PREFILL = (2, 8, 8, 1000, 1000, 64, True)
DECODE = (2, 32, 8, 1, 8192, 128, False)
HOPPER = (2, 8, 8, 1000, 1000, 128, False)


def _is_hopper() -> bool:
    import torch

    return tuple(torch.cuda.get_device_capability(0)) == (9, 0)


@pytest.fixture(scope="module")
def seeded_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A temporary database with one winning config per family at the test shapes."""
    import torch

    from fa2tune.ops import choice, torch_op

    url = f"sqlite:///{tmp_path_factory.mktemp('torchop') / 'fa2tune.db'}"
    props = torch.cuda.get_device_properties(0)
    gpu = replace(
        H200, name=props.name, sm_count=props.multi_processor_count,
        compute_capability=f"{props.major}.{props.minor}",
    )  # fmt: skip
    picks: dict[str, Any] = {
        "fa2": (PREFILL, fa2_default_config(64, "fp16", True)),
        "splitkv": (DECODE, splitkv_default(128, "fp16", False)),
    }
    if _is_hopper():
        picks["fa3"] = (HOPPER, fa3_default(128, "fp16", False))
    with Store.from_url(url) as store:
        for shape, config in picks.values():
            b, h, hkv, nq, nk, d, causal = shape
            for dtype in ("fp16", "bf16"):
                cfg = replace(config, dtype=dtype)
                problem = Problem(
                    gpu=props.name, d=d, n=nq, nk=nk, batch=b, heads=h, kv_heads=hkv,
                    dtype=dtype, causal=causal,
                )  # fmt: skip
                # 1 ns: faster than any shipped result at the same shape, so it wins.
                seed_measurement(store, gpu=gpu, problem=problem, config=cfg,
                                 result=ok_result(1e-6, problem))  # fmt: skip
    saved = dict(settings_module._overrides)
    override_settings(db_url=url)
    choice.reset_store()
    torch_op.clear_caches()
    yield picks
    choice.reset_store()
    torch_op.clear_caches()
    settings_module._overrides.clear()
    settings_module._overrides.update(saved)


def _inputs(shape: tuple[int, ...], dtype: Any, layout: str, seed: int = 0) -> tuple[Any, ...]:
    import torch

    b, h, hkv, nq, nk, d, _ = shape
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def make(n: int, heads: int) -> torch.Tensor:
        dims = (b, n, heads, d) if layout == "bnhd" else (b, heads, n, d)
        return torch.randn(dims, generator=gen, device="cuda", dtype=torch.float32).to(dtype)

    return make(nq, h), make(nk, hkv), make(nk, hkv)


def _reference(q: Any, k: Any, v: Any, causal: bool, layout: str) -> tuple[Any, Any]:
    """float32 O (in ``layout``) and LSE; bottom-right causal, GQA by repeat_interleave."""
    import torch

    qh, kh, vh = (t if layout == "bhnd" else t.transpose(1, 2) for t in (q, k, v))
    qh, kh, vh = qh.float(), kh.float(), vh.float()
    group = qh.shape[1] // kh.shape[1]
    kh, vh = kh.repeat_interleave(group, 1), vh.repeat_interleave(group, 1)
    nq, nk, d = qh.shape[2], kh.shape[2], qh.shape[3]
    s = qh @ kh.transpose(-1, -2) / d**0.5
    if causal:
        seen = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(nk - nq)
        s = s.masked_fill(~seen, float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.softmax(s, -1).nan_to_num(0.0) @ vh
    return (o if layout == "bhnd" else o.transpose(1, 2)), lse


def _close(out: Any, ref: Any, dtype: Any) -> None:
    import torch

    tol = 2e-2 if dtype == torch.float16 else 4e-2
    err = (out.float() - ref).abs().max().item()
    assert err <= tol, f"max abs error {err} > {tol}"


@pytest.mark.parametrize("family", ["fa2", "splitkv", "fa3"])
@pytest.mark.parametrize("layout", ["bnhd", "bhnd"])
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_matches_reference(
    seeded_db: dict[str, Any], family: str, layout: str, dtype_name: str
) -> None:
    import torch

    from fa2tune.ops import torch_op
    from fa2tune.torch import attention

    if family not in seeded_db:
        pytest.skip("the fa3 family needs compute capability 9.0")
    shape, config = seeded_db[family]
    dtype = getattr(torch, dtype_name)
    causal = bool(shape[-1])
    q, k, v = _inputs(shape, dtype, layout)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback would warn: the kernel must serve it
        o, lse = attention(q, k, v, causal=causal, layout=layout, return_lse=True)
        o_only = attention(q, k, v, causal=causal, layout=layout)
    torch.cuda.synchronize()
    key = (q.device, q.dtype, q.shape, k.shape, causal, layout)
    launcher = torch_op._decisions[key]
    assert not isinstance(launcher, str), launcher
    assert launcher.config == replace(config, dtype="fp16" if dtype_name == "float16" else "bf16")
    assert launcher.source == "exact"
    ref_o, ref_lse = _reference(q, k, v, causal, layout)
    assert o.shape == q.shape and o.dtype == dtype
    assert lse.shape == ref_lse.shape and lse.dtype == torch.float32
    _close(o, ref_o, dtype)
    _close(o_only, ref_o, dtype)
    assert torch.allclose(lse, ref_lse, atol=1e-2, rtol=1e-3)
    # Other tensors of the same shape (new pointers: fa3 encodes new TMA descriptors), then
    # the first ones again (their cached descriptors).
    q2, k2, v2 = _inputs(shape, dtype, layout, seed=1)
    _close(attention(q2, k2, v2, causal=causal, layout=layout), _reference(
        q2, k2, v2, causal, layout)[0], dtype)  # fmt: skip
    _close(attention(q, k, v, causal=causal, layout=layout), ref_o, dtype)


def test_torch_compile_fullgraph(seeded_db: dict[str, Any]) -> None:
    import torch

    from fa2tune.torch import attention

    shape, _ = seeded_db["fa2"]
    q, k, v = _inputs(shape, torch.float16, "bnhd", seed=1)

    def block(q: Any, k: Any, v: Any) -> Any:
        return attention(q * 1.0, k, v, causal=True).sum(dim=-1)

    compiled = torch.compile(block, fullgraph=True)
    out = compiled(q, k, v)
    ref = _reference(q, k, v, True, "bnhd")[0].sum(dim=-1)
    torch.cuda.synchronize()
    assert (out.float() - ref).abs().max().item() < 0.5  # a sum over D=64 of fp16 values


@pytest.mark.parametrize("family", ["fa2", "splitkv"])
def test_cuda_graph_capture_and_replay(seeded_db: dict[str, Any], family: str) -> None:
    import torch

    from fa2tune.torch import attention

    shape, _ = seeded_db[family]
    causal = bool(shape[-1])
    static = _inputs(shape, torch.float16, "bnhd", seed=2)
    attention(*static, causal=causal)  # decide, build and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        attention(*static, causal=causal)  # warm-up on the side stream, as torch advises
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        out = attention(*static, causal=causal)
    for seed in (3, 4):
        fresh = _inputs(shape, torch.float16, "bnhd", seed=seed)
        for dst, src in zip(static, fresh, strict=True):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        _close(out, _reference(*fresh, causal, "bnhd")[0], torch.float16)


def test_fake_implementation_shapes(seeded_db: dict[str, Any]) -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import fa2tune.torch  # noqa: F401  (registers the op)

    with FakeTensorMode():
        q = torch.empty(2, 4, 100, 64, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(2, 2, 300, 64, dtype=torch.bfloat16, device="cuda")
        o, lse = torch.ops.fa2tune.attention(q, k, k, True, 0.125, "bhnd", True, True)
        assert tuple(o.shape) == (2, 4, 100, 64) and o.dtype == torch.bfloat16
        assert tuple(lse.shape) == (2, 4, 100) and lse.dtype == torch.float32
        o2, lse2 = torch.ops.fa2tune.attention(q, k, k, False, 0.125, "bhnd", False, True)
        assert tuple(o2.shape) == tuple(q.shape) and lse2.numel() == 0
    args = (*_inputs((1, 2, 2, 64, 64, 64, False), torch.float16, "bnhd"), False, 0.125)
    torch.library.opcheck(
        torch.ops.fa2tune.attention.default,
        (*args, "bnhd", True, True),
        test_utils=("test_schema", "test_faketensor"),
    )


def test_unsupported_head_dim_falls_back_once(seeded_db: dict[str, Any]) -> None:
    import torch

    from fa2tune.torch import FallbackWarning, Unsupported, attention

    shape = (1, 4, 2, 37, 50, 264, True)  # D=264: no family; causal with Nq != Nk
    q, k, v = _inputs(shape, torch.float16, "bnhd", seed=5)
    with pytest.warns(FallbackWarning, match="head dim 264"):
        o = attention(q, k, v, causal=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second call: no second warning
        o2, lse = attention(q, k, v, causal=True, return_lse=True)
    ref_o, ref_lse = _reference(q, k, v, True, "bnhd")
    _close(o, ref_o, torch.float16)
    _close(o2, ref_o, torch.float16)
    assert torch.allclose(lse, ref_lse, atol=1e-3)
    with pytest.raises(Unsupported, match="head dim 264"):
        attention(q, k, v, causal=True, fallback=False)
    cpu = [t.cpu() for t in (q, k, v)]
    with pytest.raises(Unsupported, match="cpu"):
        attention(*cpu, fallback=False)


def test_print_choice_logs_each_choice_once(
    seeded_db: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    import torch

    from fa2tune.ops import torch_op
    from fa2tune.torch import attention

    saved = dict(settings_module._overrides)
    override_settings(print_choice=True)
    torch_op.clear_caches()
    try:
        shape, config = seeded_db["fa2"]
        q, k, v = _inputs(shape, torch.float16, "bnhd", seed=6)
        with caplog.at_level(logging.INFO, logger="fa2tune.torch"):
            attention(q, k, v, causal=True)
            attention(q, k, v, causal=True)
        lines = [r.getMessage() for r in caplog.records if config.name in r.getMessage()]
        assert len(lines) == 1 and "(exact, database)" in lines[0], lines
    finally:
        settings_module._overrides.clear()
        settings_module._overrides.update(saved)
        torch_op.clear_caches()


def test_a_splitkv_call_allocates_only_its_output(seeded_db: dict[str, Any]) -> None:
    """A cached split-KV decision's call allocates the output and nothing else from torch's
    allocator (the workspace is the stream's, made once); ``free_workspaces`` gives the
    stream's buffers back and the next call makes them again and is still right. (Host time
    per call is bench/torch_op_overhead.py's to measure, not a test's.)"""
    import torch

    from fa2tune.torch import attention, free_workspaces

    shape, _ = seeded_db["splitkv"]
    q, k, v = _inputs(shape, torch.float16, "bnhd", seed=7)
    ref, _ = _reference(q, k, v, False, "bnhd")
    attention(q, k, v)
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    calls = 50
    for _ in range(calls):
        out = attention(q, k, v)
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] - before == calls
    _close(out, ref, torch.float16)
    assert free_workspaces() > 0
    assert free_workspaces() == 0  # nothing left
    _close(attention(q, k, v), ref, torch.float16)


def test_workspace_sizes_match_the_worker(seeded_db: dict[str, Any]) -> None:
    import torch

    from codegen.families.splitkv.host import splitkv_workspace, splitkv_workspace_sizes
    from core.shape import Shape

    shape, config = seeded_db["splitkv"]
    b, h, hkv, nq, nk, d, _ = shape
    q, k, v = _inputs(shape, torch.float16, "bnhd", seed=8)
    ws_o, ws_lse, count = splitkv_workspace(config, q, k, v, "bnhd")
    counters, partial = splitkv_workspace_sizes(config, Shape(nq, nk, b, h, hkv))
    assert ws_lse.owner.numel() == partial
    assert ws_o.owner.numel() == partial * d
    assert count.owner.numel() == counters


def test_same_shape_other_strides(seeded_db: dict[str, Any]) -> None:
    """A cached decision re-checks strides: padded views work, unaligned ones fall back."""
    import torch

    from fa2tune.torch import FallbackWarning, attention

    shape, _ = seeded_db["fa2"]
    q, k, v = _inputs(shape, torch.float16, "bnhd", seed=9)
    attention(q, k, v, causal=True)  # contiguous first: the decision and its strides
    padded = [torch.zeros(*t.shape[:-1], t.shape[-1] + 8, dtype=t.dtype, device="cuda")
              for t in (q, k, v)]  # fmt: skip
    views = [p[..., : t.shape[-1]] for p, t in zip(padded, (q, k, v), strict=True)]
    for view, t in zip(views, (q, k, v), strict=True):
        view.copy_(t)
    ref = _reference(q, k, v, True, "bnhd")[0]
    _close(attention(*views, causal=True), ref, torch.float16)
    odd = [
        torch.zeros(*t.shape[:-1], t.shape[-1] + 1, dtype=t.dtype, device="cuda") for t in (q, k, v)
    ]  # fmt: skip  (strides not a multiple of 8 elements)
    odd_views = [p[..., : t.shape[-1]] for p, t in zip(odd, (q, k, v), strict=True)]
    for view, t in zip(odd_views, (q, k, v), strict=True):
        view.copy_(t)
    with pytest.warns(FallbackWarning, match="tensor layout"):
        out = attention(*odd_views, causal=True)
    _close(out, ref, torch.float16)
    _close(attention(q, k, v, causal=True), ref, torch.float16)


@pytest.mark.parametrize("family", ["fa2", "splitkv"])
def test_torch_compile_with_cuda_graphs(seeded_db: dict[str, Any], family: str) -> None:
    """``mode="reduce-overhead"``: CUDA-graph trees warm up eagerly, capture, then replay
    (no fa2tune Python per call); every replay with new inputs matches the reference."""
    import torch

    from fa2tune.torch import attention

    shape, _ = seeded_db[family]
    causal = bool(shape[-1])

    def block(q: Any, k: Any, v: Any) -> Any:
        return attention(q, k, v, causal=causal) * 2.0

    compiled = torch.compile(block, fullgraph=True, mode="reduce-overhead")
    for seed in (10, 11, 12, 13):
        q, k, v = _inputs(shape, torch.float16, "bnhd", seed=seed)
        out = compiled(q, k, v).clone()  # a replay's output is overwritten by the next
        torch.cuda.synchronize()
        _close(out / 2.0, _reference(q, k, v, causal, "bnhd")[0], torch.float16)


@pytest.mark.slow
def test_first_use_tuning_writes_a_verified_result(tmp_path: Any) -> None:
    """``autotune("on_first_call")`` on an untuned shape: the call is served at once, one
    campaign (``fa2tune tune``, 25 s budget) writes a verified result to a temporary database,
    and the next call of the shape runs the tuned config."""
    import torch

    from core.shape import Shape
    from fa2tune.ops import autotune, choice, torch_op
    from fa2tune.torch import FallbackWarning, attention

    url = f"sqlite:///{tmp_path / 'first_use.db'}"
    saved = dict(settings_module._overrides)
    override_settings(db_url=url)
    choice.reset_store()
    torch_op.clear_caches()
    autotune.reset()
    # B=1, H=4, N=384, D=64: nothing shipped at exactly this shape; FA2's default or the
    # nearest tuned config serves while tuning.
    shape = (1, 4, 4, 384, 384, 64, False)
    b, h, hkv, nq, nk, d, causal = shape
    try:
        tuner = autotune.autotune("on_first_call", budget_s=25)
        q, k, v = _inputs(shape, torch.float16, "bnhd", seed=20)
        ref = _reference(q, k, v, causal, "bnhd")[0]
        # Served by a kernel, not SDPA. (Recorded, not turned into errors: the filter is
        # process-wide and the tuning job's thread starts inside this call.)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            first = attention(q, k, v)
        assert not [w for w in caught if issubclass(w.category, FallbackWarning)], caught
        _close(first, ref, torch.float16)
        assert len(tuner.jobs) == 1
        job = tuner.jobs[0]
        assert (job.problem.d, job.problem.n, job.problem.n_keys) == (64, 384, 384)
        assert tuner.wait(25 + autotune.GRACE_S + 60), "the tuning job did not end"
        assert not tuner.failed, tuner.failed
        props = torch.cuda.get_device_properties(0)
        with Store.from_url(url) as store:
            found = store.best_for_shape(props.name, d, "fp16", causal,
                                         Shape(nq, nk, b, h, hkv), exact=True)  # fmt: skip
        assert found is not None and found.exact  # only verified (OK) results qualify
        second = attention(q, k, v)
        key = (q.device, q.dtype, q.shape, k.shape, causal, "bnhd")
        launcher = torch_op._decisions[key]
        assert not isinstance(launcher, str), launcher
        assert launcher.source == "exact" and launcher.config == found.config
        _close(second, ref, torch.float16)
        attention(q, k, v)
        assert len(tuner.jobs) == 1  # once per shape and process
    finally:
        autotune.reset()
        choice.reset_store()
        torch_op.clear_caches()
        settings_module._overrides.clear()
        settings_module._overrides.update(saved)
