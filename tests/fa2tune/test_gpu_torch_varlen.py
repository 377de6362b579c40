"""fa2tune.torch.attention_varlen on a real GPU (marker ``gpu``).

A temporary database (``FA2TUNE_DB_URL`` overridden) is seeded with one varlen result per
(dtype, mask) at D=128, Hq=8, Hkv=2 and 7 sequences of 256 rows (the count x mean-bucket the
test batch falls in: 7 sequences, mean 209 -> 256), each faster than anything shipped, so
the calls below are served by known configs: FA2's default varlen twin for fp16 causal and
bf16 full, and on compute capability 9.0 the Hopper family's default ``_vl`` for fp16 full
(elsewhere FA2's twin). They are built once, in parallel, by the module fixture; nothing else
is built (the ``off``-mode tests use the same FA2 twins).

Checked against a float32 reference per sequence (measure.varlen's check, the dense rule per
sequence): odd lengths including 1, key lengths that differ from query lengths (causal rows
that see no key), GQA, fp16 / bf16, causal / full, the LSE, outputs poisoned through the
caching allocator (a row the kernel does not write stays NaN), new tensors after the first
call (fresh TMA descriptors for fa3), decisions cached per key (no store query per call),
more than 65,535 sequences (offset slices), torch.compile(fullgraph=True), CUDA-graph
capture and replay, the fake implementation (opcheck), and the fallback: torch's own varlen
kernel for strides the kernels do not take, per sequence for D=264 and for gradients, and
``fallback=False`` raising.

Run: ``pytest -m gpu tests/test_gpu_torch_varlen.py``. Skipped without torch, cuda-bindings,
an sm_80+ GPU or a kernel compiler (nvcc, or
NVRTC from the wheels).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from codegen.families.fa3.space import default_config as fa3_default
from core import settings as settings_module
from core.problem import Problem
from core.settings import override_settings
from db.store import Store
from fa2tune.ops.choice import default_varlen_config
from tests.support.factories import H200, ok_result, seed_measurement
from tests.support.gpu import torch_op_skip_reason

_REASON = torch_op_skip_reason()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_REASON is not None, reason=f"fa2tune.torch varlen GPU tests: {_REASON}"),
]

D, HEADS, KV_HEADS = 128, 8, 2
#: 7 sequences, 1469 rows: mean 209, bucket 256 (the seeded problems' count x mean).
LENS_Q = [1, 17, 255, 1000, 3, 64, 129]
#: Key lengths per sequence: the same, or others (sequence 2 has fewer keys than queries, so
#: causal rows there see no key: O = 0, LSE = -inf).
LENS_K = {"same": None, "other": [5, 17, 100, 1200, 1, 64, 300]}
SEEDED_LENS = (256,) * 7
#: (dtype, causal) -> the family expected to serve it.
COMBOS = [("fp16", True), ("bf16", False), ("fp16", False)]


def _is_hopper() -> bool:
    import torch

    return tuple(torch.cuda.get_device_capability(0)) == (9, 0)


def _expected(dtype: str, causal: bool) -> Any:
    if (dtype, causal) == ("fp16", False) and _is_hopper():
        return replace(fa3_default(D, "fp16", False), varlen=True)
    return default_varlen_config(D, dtype, causal)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def seeded_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Any, Any]]:
    """A temporary database whose nearest varlen problem for the test batch is seeded; the
    configs built in parallel up front."""
    import torch

    from codegen.build import build_configs
    from fa2tune.ops import choice, torch_op
    from fa2tune.ops.choice import arch_of

    url = f"sqlite:///{tmp_path_factory.mktemp('torchvarlen') / 'fa2tune.db'}"
    props = torch.cuda.get_device_properties(0)
    cc = f"{props.major}.{props.minor}"
    gpu = replace(H200, name=props.name, sm_count=props.multi_processor_count,
                  compute_capability=cc)  # fmt: skip
    picks = {combo: _expected(*combo) for combo in COMBOS}
    with Store.from_url(url) as store:
        for (dtype, causal), config in picks.items():
            problem = Problem.varlen(props.name, D, SEEDED_LENS, heads=HEADS, kv_heads=KV_HEADS,
                                     dtype=dtype, causal=causal)  # fmt: skip
            # 1 ns: faster than any shipped result, and at distance 0 from the test batch.
            seed_measurement(store, gpu=gpu, problem=problem, config=config,
                             result=ok_result(1e-6, problem))  # fmt: skip
    arch = arch_of(cc)
    assert arch is not None
    reports = build_configs(list(picks.values()), arch)  # the op's first calls find them built
    unbuilt = [f"{r.config.name}: {r.status} {r.error}" for r in reports if not r.usable]
    assert not unbuilt, "configs failed to build:\n" + "\n".join(unbuilt)
    saved = dict(settings_module._overrides)
    override_settings(db_url=url)
    choice.reset_store()
    torch_op.clear_caches()
    yield picks
    choice.reset_store()
    torch_op.clear_caches()
    settings_module._overrides.clear()
    settings_module._overrides.update(saved)


@pytest.fixture(autouse=True)
def _fresh_warnings() -> Iterator[None]:
    from fa2tune.ops import torch_op

    torch_op._warned.clear()
    yield
    torch_op._warned.clear()


def _inputs(dtype: str, causal: bool, lens_k: list[int] | None = None, seed: int = 0) -> Any:
    from measure.varlen import make_varlen_inputs

    return make_varlen_inputs(LENS_Q, lens_k, heads=HEADS, kv_heads=KV_HEADS, d=D, dtype=dtype,
                              causal=causal, seed=seed)  # fmt: skip


def _poison(rows: int, heads: int, d: int, dtype: Any) -> None:
    """Fill blocks of the caching allocator of O's and the LSE's sizes with NaN and free them:
    the op's next allocations of those sizes get them back, so a row it does not write stays
    NaN and fails the check."""
    import torch

    junk = [
        torch.full((rows, heads, d), float("nan"), dtype=dtype, device="cuda"),
        torch.full((heads, rows), float("nan"), dtype=torch.float32, device="cuda"),
    ]
    del junk


def _launcher(q: Any, k: Any, causal: bool, cu_q: Any, max_q: int) -> Any:
    from fa2tune.ops import torch_op
    from fa2tune.ops.choice import decision_key

    key = decision_key(q.device, q.dtype, int(q.shape[2]), int(q.shape[1]), int(k.shape[1]),
                       causal, int(cu_q.numel()) - 1, int(q.shape[0]), max_q)  # fmt: skip
    return torch_op._decisions[key]


def _reference(q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any, causal: bool) -> tuple[Any, Any]:
    """float32 O [total_q, H, D] and LSE [H, total_q] per sequence (bottom-right causal)."""
    import torch

    bq, bk = cu_q.tolist(), cu_k.tolist()
    h, d = q.shape[1], q.shape[2]
    o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full((h, q.shape[0]), float("-inf"), device=q.device)
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
            seen = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(nk - nq)
            s = s.masked_fill(~seen, float("-inf"))
        lse[:, bq[i] : bq[i + 1]] = torch.logsumexp(s, -1)
        o[bq[i] : bq[i + 1]] = (torch.softmax(s, -1).nan_to_num(0.0) @ vi).transpose(0, 1)
    return o, lse


def _close(out: Any, ref: Any, dtype: Any) -> None:
    import torch

    tol = 2e-2 if dtype == torch.float16 else 4e-2
    assert not out.isnan().any(), "NaN in the output"
    err = (out.float() - ref).abs().max().item()
    assert err <= tol, f"max abs error {err} > {tol}"


@pytest.mark.parametrize("lens_k", sorted(LENS_K))
@pytest.mark.parametrize(("dtype", "causal"), COMBOS)
def test_matches_reference(
    seeded_db: dict[Any, Any], dtype: str, causal: bool, lens_k: str
) -> None:
    import torch

    from fa2tune.torch import attention_varlen
    from measure.varlen import check_varlen

    inputs = _inputs(dtype, causal, LENS_K[lens_k])
    q, k, v, cu_q, cu_k = inputs.q, inputs.k, inputs.v, inputs.cu_q, inputs.cu_k
    max_q, max_k = max(inputs.seqlens_q), max(inputs.seqlens_k)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback would warn: the kernel must serve these
        for with_lse in (True, False):
            _poison(q.shape[0], HEADS, D, q.dtype)
            got = attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal,
                                   scale=inputs.scale, return_lse=with_lse)  # fmt: skip
            o, lse = got if with_lse else (got, None)
            torch.cuda.synchronize()
            assert o.shape == q.shape and o.dtype == q.dtype and o.is_contiguous()
            if lse is not None:
                assert lse.shape == (HEADS, q.shape[0]) and lse.dtype == torch.float32
            result = check_varlen(o, lse, inputs)
            assert result.ok, result.message
    launcher = _launcher(q, k, causal, cu_q, max_q)
    assert not isinstance(launcher, str), launcher
    assert launcher.config == seeded_db[(dtype, causal)]
    assert launcher.source == "nearest"
    # Other tensors of the same batch (new pointers: fa3 encodes new descriptors), then the
    # first ones again (their cached launch); the default scale.
    other = _inputs(dtype, causal, LENS_K[lens_k], seed=1)
    o2 = attention_varlen(other.q, other.k, other.v, other.cu_q, other.cu_k, max_q, max_k,
                          causal=causal)  # fmt: skip
    o1 = attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal)
    torch.cuda.synchronize()
    assert check_varlen(o2, None, other).ok
    assert check_varlen(o1, None, inputs).ok


def test_decisions_are_cached_per_key(
    seeded_db: dict[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches of one key (same count, mean in one power-of-two bucket) ask the store once;
    another bucket asks again; no call reads the offsets on the host."""
    import torch

    from fa2tune.ops import autotune, torch_op
    from fa2tune.torch import attention_varlen
    from measure.varlen import check_varlen, make_varlen_inputs

    torch_op.clear_caches()
    asked: list[Any] = []
    real = torch_op.select

    def counting(call: Any) -> Any:
        asked.append(call)
        return real(call)

    monkeypatch.setattr(torch_op, "select", counting)
    autotune.reset()
    try:
        autotune.autotune("off")  # FA2's fp16 causal twin (built by the fixture) serves
        for lens in ([200, 260, 300, 190], [250, 240, 230, 220], [900, 1000, 1100, 1200]):
            inputs = make_varlen_inputs(lens, heads=HEADS, kv_heads=KV_HEADS, d=D,
                                        dtype="fp16", causal=True, seed=2)  # fmt: skip
            o = attention_varlen(inputs.q, inputs.k, inputs.v, inputs.cu_q, inputs.cu_k,
                                 max(lens), max(lens), causal=True)  # fmt: skip
            torch.cuda.synchronize()
            assert check_varlen(o, None, inputs).ok
    finally:
        autotune.reset()
        torch_op.clear_caches()  # off-mode decisions must not serve the tests after this
    assert [(c.packed.count, c.packed.mean) for c in asked] == [(4, 256), (4, 1024)]


def test_more_sequences_than_the_grid_allows(seeded_db: dict[Any, Any]) -> None:
    """70,000 sequences of one query and one key (launches over offset slices): each row's
    output is its key's value row (softmax over one key is 1)."""
    import torch

    from fa2tune.ops import autotune, torch_op
    from fa2tune.torch import attention_varlen

    n = 70_000
    gen = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(n, h, D, generator=gen, device="cuda").to(torch.bfloat16)
               for h in (HEADS, KV_HEADS, KV_HEADS))  # fmt: skip
    cu = torch.arange(n + 1, dtype=torch.int32, device="cuda")
    autotune.reset()
    try:
        autotune.autotune("off")  # FA2's bf16 full twin: built by the fixture
        _poison(n, HEADS, D, torch.bfloat16)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            o = attention_varlen(q, k, v, cu, cu, 1, 1, causal=True)  # 1 row: unmasked
        torch.cuda.synchronize()
    finally:
        autotune.reset()
        torch_op.clear_caches()
    want = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
    assert not o.isnan().any()
    assert torch.allclose(o.float(), want.float(), atol=1e-2)


def test_torch_compile_fullgraph(seeded_db: dict[Any, Any]) -> None:
    import torch

    from fa2tune.torch import FallbackWarning, attention_varlen

    inputs = _inputs("fp16", True, seed=4)
    max_q = max(LENS_Q)

    def block(q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any) -> Any:
        o, lse = attention_varlen(q * 1.0, k, v, cu_q, cu_k, max_q, max_q, causal=True,
                                  return_lse=True)  # fmt: skip
        return o * 2.0, lse

    compiled = torch.compile(block, fullgraph=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, lse = compiled(inputs.q, inputs.k, inputs.v, inputs.cu_q, inputs.cu_k)
    torch.cuda.synchronize()
    assert not [w for w in caught if issubclass(w.category, FallbackWarning)], caught
    ref_o, ref_lse = _reference(inputs.q, inputs.k, inputs.v, inputs.cu_q, inputs.cu_k, True)
    _close(out / 2.0, ref_o, torch.float16)
    assert torch.allclose(lse, ref_lse, atol=1e-2, rtol=1e-3)


def test_cuda_graph_capture_and_replay(seeded_db: dict[Any, Any]) -> None:
    import torch

    from fa2tune.torch import attention_varlen

    static = _inputs("bf16", False, LENS_K["other"], seed=5)
    args = (static.q, static.k, static.v, static.cu_q, static.cu_k, max(LENS_Q),
            max(LENS_K["other"]))  # fmt: skip
    attention_varlen(*args)  # decide, build and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        attention_varlen(*args)  # warm-up on the side stream
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        out = attention_varlen(*args)
    for seed in (6, 7):
        fresh = _inputs("bf16", False, LENS_K["other"], seed=seed)
        for dst, src in ((static.q, fresh.q), (static.k, fresh.k), (static.v, fresh.v)):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        ref, _ = _reference(fresh.q, fresh.k, fresh.v, fresh.cu_q, fresh.cu_k, False)
        _close(out, ref, torch.bfloat16)


def test_fake_implementation(seeded_db: dict[Any, Any]) -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import fa2tune.torch  # noqa: F401  (registers the op)

    with FakeTensorMode():
        q = torch.empty(300, 8, 64, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(500, 2, 64, dtype=torch.bfloat16, device="cuda")
        cu = torch.empty(5, dtype=torch.int32, device="cuda")
        o, lse = torch.ops.fa2tune.attention_varlen(q, k, k, cu, cu, 100, 200, True, 0.125,
                                                    True, True)  # fmt: skip
        assert tuple(o.shape) == (300, 8, 64) and o.dtype == torch.bfloat16
        assert tuple(lse.shape) == (8, 300) and lse.dtype == torch.float32
    inputs = _inputs("fp16", True, seed=8)
    torch.library.opcheck(
        torch.ops.fa2tune.attention_varlen.default,
        (inputs.q, inputs.k, inputs.v, inputs.cu_q, inputs.cu_k, max(LENS_Q), max(LENS_Q),
         True, inputs.scale, True, True),
        test_utils=("test_schema", "test_faketensor"),
    )  # fmt: skip


def test_unsupported_head_dim_falls_back_per_sequence(seeded_db: dict[Any, Any]) -> None:
    import torch

    from fa2tune.torch import FallbackWarning, Unsupported, attention_varlen
    from measure.varlen import make_varlen_inputs

    lens_q, lens_k = [1, 37, 5], [3, 20, 5]
    inputs = make_varlen_inputs(lens_q, lens_k, heads=4, kv_heads=2, d=264, dtype="fp16",
                                causal=True, seed=9, reference=False)  # fmt: skip
    args = (inputs.q, inputs.k, inputs.v, inputs.cu_q, inputs.cu_k, 37, 20)
    with pytest.warns(FallbackWarning, match="head dim 264"):
        o = attention_varlen(*args, causal=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per reason
        o2, lse = attention_varlen(*args, causal=True, return_lse=True)
    ref_o, ref_lse = _reference(*args[:5], causal=True)
    _close(o, ref_o, torch.float16)
    _close(o2, ref_o, torch.float16)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    assert torch.allclose(lse[finite], ref_lse[finite], atol=1e-3)
    with pytest.raises(Unsupported, match="head dim 264"):
        attention_varlen(*args, causal=True, fallback=False)


def test_bad_strides_fall_back_to_torchs_varlen_kernel(
    seeded_db: dict[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of 129 elements (not 16-byte multiples) are refused by the ABI: with no LSE asked
    for, torch's own varlen kernel (``aten._flash_attention_forward``) serves, causal
    bottom-right as here; with the LSE, the per-sequence path."""
    import torch

    from fa2tune.ops import fallback
    from fa2tune.torch import FallbackWarning, Unsupported, attention_varlen

    inputs = _inputs("fp16", True, LENS_K["other"], seed=10)
    odd = []
    for t in (inputs.q, inputs.k, inputs.v):
        buf = torch.zeros(t.shape[0], t.shape[1], D + 1, dtype=t.dtype, device="cuda")
        buf[..., :D].copy_(t)
        odd.append(buf[..., :D])
    args = (*odd, inputs.cu_q, inputs.cu_k, max(LENS_Q), max(LENS_K["other"]))
    ref_o, ref_lse = _reference(inputs.q, inputs.k, inputs.v, inputs.cu_q, inputs.cu_k, True)
    attention_varlen(inputs.q, inputs.k, inputs.v, *args[3:], causal=True)  # the decision
    if hasattr(torch.ops.aten, "_flash_attention_forward"):

        def not_here(*_: Any) -> Any:
            raise AssertionError("torch's varlen kernel should have served this call")

        monkeypatch.setattr(fallback, "_per_sequence", not_here)
    with pytest.warns(FallbackWarning, match="tensor layout"):
        o = attention_varlen(*args, causal=True)
    torch.cuda.synchronize()
    _close(o, ref_o, torch.float16)
    monkeypatch.undo()
    o2, lse = attention_varlen(*args, causal=True, return_lse=True)
    _close(o2, ref_o, torch.float16)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    assert torch.allclose(lse[finite], ref_lse[finite], atol=1e-3)
    with pytest.raises(Unsupported, match="stride"):
        attention_varlen(*args, causal=True, fallback=False)
    # The contiguous tensors still run on the kernel.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        o3 = attention_varlen(inputs.q, inputs.k, inputs.v, *args[3:], causal=True)
    _close(o3, ref_o, torch.float16)


def test_gradients_fall_back_and_flow(seeded_db: dict[Any, Any]) -> None:
    import torch

    from fa2tune.torch import FallbackWarning, attention_varlen

    inputs = _inputs("fp16", True, seed=11)
    q = inputs.q.detach().clone().requires_grad_(True)
    with pytest.warns(FallbackWarning, match="gradients"):
        o = attention_varlen(q, inputs.k, inputs.v, inputs.cu_q, inputs.cu_k, max(LENS_Q),
                             max(LENS_Q), causal=True)  # fmt: skip
    o.float().sum().backward()
    assert q.grad is not None and q.grad.shape == q.shape and torch.isfinite(q.grad).all()
    ref_o, _ = _reference(inputs.q, inputs.k, inputs.v, inputs.cu_q, inputs.cu_k, True)
    _close(o.detach(), ref_o, torch.float16)
    # No gradients recorded: the kernel again, without a warning.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        o2 = attention_varlen(q, inputs.k, inputs.v, inputs.cu_q, inputs.cu_k, max(LENS_Q),
                              max(LENS_Q), causal=True)  # fmt: skip
    _close(o2, ref_o, torch.float16)


def test_bad_offsets_raise_value_error(seeded_db: dict[Any, Any]) -> None:
    import torch

    from fa2tune.torch import attention_varlen

    inputs = _inputs("fp16", True, seed=12)
    args = (inputs.q, inputs.k, inputs.v)
    with pytest.raises(ValueError, match="int32"):
        attention_varlen(*args, inputs.cu_q.long(), inputs.cu_k, 1000, 1000)
    with pytest.raises(ValueError, match="same device"):
        attention_varlen(*args, inputs.cu_q.cpu(), inputs.cu_k, 1000, 1000)
    with pytest.raises(ValueError, match="Python int"):
        attention_varlen(*args, inputs.cu_q, inputs.cu_k, torch.tensor(1000), 1000)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_seqused_runs_the_used_rows_alone(seeded_db: dict[Any, Any], causal: bool) -> None:
    """flash_attn_varlen_func with seqused_q / seqused_k (each sequence using the first rows
    of a longer span, 0 included) against the same call on the used rows packed by hand on the
    host: O and the LSE alike on used rows, zeros and an LSE of +inf on unused ones."""
    import torch

    from fa2tune.flash_attn import flash_attn_varlen_func

    torch.manual_seed(5)
    span_q, span_k = [9, 300, 40, 17], [20, 310, 1, 64]
    used_q, used_k = [9, 250, 0, 3], [11, 310, 0, 60]
    dt, dev = torch.float16, "cuda"
    q = torch.randn(sum(span_q), HEADS, D, device=dev, dtype=dt)
    k, v = (torch.randn(sum(span_k), KV_HEADS, D, device=dev, dtype=dt) for _ in range(2))

    def cu(counts: list[int]) -> Any:
        out = [0]
        for c in counts:
            out.append(out[-1] + c)
        return torch.tensor(out, dtype=torch.int32, device=dev)

    def rows(span: list[int], used: list[int]) -> Any:
        starts = cu(span).tolist()
        return torch.tensor([starts[b] + i for b, n in enumerate(used) for i in range(n)],
                            device=dev)  # fmt: skip

    qi, ki = rows(span_q, used_q), rows(span_k, used_k)
    want, want_lse = flash_attn_varlen_func(q[qi], k[ki], v[ki], cu(used_q), cu(used_k), 300, 310,
                                            causal=causal, return_attn_probs=True)  # fmt: skip
    got, lse = flash_attn_varlen_func(
        q, k, v, cu(span_q), cu(span_k), 300, 310, causal=causal, return_attn_probs=True,
        seqused_q=torch.tensor(used_q, dtype=torch.int32, device=dev),
        seqused_k=torch.tensor(used_k, dtype=torch.int32, device=dev),
    )  # fmt: skip
    torch.cuda.synchronize()
    # The two calls' shapes differ (row totals), so their configs may too: a tolerance.
    assert (got[qi].float() - want.float()).abs().max().item() <= 4e-3
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse[:, qi]), finite)
    assert (lse[:, qi][finite] - want_lse[finite]).abs().max().item() <= 1e-3
    unused = torch.ones(sum(span_q), dtype=torch.bool, device=dev)
    unused[qi] = False
    assert torch.all(got[unused] == 0) and torch.all(lse[:, unused] == float("inf"))
