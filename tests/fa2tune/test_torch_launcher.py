"""The op's per-call launch paths (:mod:`fa2tune.ops.kernels` launchers) without a GPU.

A fake kernel records what each ``cuLaunchKernel`` would get (the ``FaParams`` bytes as
patched at launch time, the extra pointer arguments, the stream); CPU tensors stand in for
CUDA ones (the CUDA-device check of ``make_params`` is the one check left out). Checked:
pointers and scale patched per call on one bound launch per stride pattern and stream, a new
stride pattern or misaligned pointers re-checked, split-KV's workspace pointers (the
stream's buffers outside capture, one zeroed allocation inside, null with one split), the
stream buffers' growth, and fa3's descriptor cache. Skipped without torch; the real
launches are tests/test_gpu_torch_op.py's.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from codegen.families.fa2.space import fa2_default_config  # noqa: E402
from codegen.families.fa3.space import default_config as fa3_default  # noqa: E402
from codegen.families.splitkv.space import default_config as splitkv_default  # noqa: E402
from core.shape import Shape  # noqa: E402
from measure import params as mp  # noqa: E402

COUNTERS = 0xC0C0
PARTIALS = 0x10000


class FakeBound:
    def __init__(self, log: list[dict[str, Any]], params: Any, extra: Any, stream: int) -> None:
        self.log, self.params, self.extra, self.stream = log, params, tuple(extra), stream

    def __call__(self) -> None:
        p = self.params
        self.log.append({
            "q": p.q, "o": p.o, "lse": p.lse, "scale": p.softmax_scale, "nq": p.nq,
            "extra": [getattr(x, "value", x) for x in self.extra], "stream": self.stream,
            "bound": id(self),
        })  # fmt: skip


class FakeKernel:
    def __init__(self) -> None:
        self.log: list[dict[str, Any]] = []
        self.binds = 0

    def bind(self, params: Any, grid: Any, block: Any, smem: int, stream: int,
             extra: Any = ()) -> FakeBound:  # fmt: skip
        self.binds += 1
        return FakeBound(self.log, params, extra, stream)


def _make_params(q: Any, k: Any, v: Any, o: Any, lse: Any, scale: float, layout: Any) -> Any:
    """make_params's checks and fields, for CPU tensors."""
    for name, t in {"q": q, "k": k, "v": v, "o": o}.items():
        mp._check_tensor(name, t, layout)
    b, nq, hq, _ = mp._dims(q, layout)
    _, nk, hkv, _ = mp._dims(k, layout)
    strides = [s for t in (q, k, v, o) for s in mp._strides(t, layout)]
    return mp.FaParams(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
        lse.data_ptr() if lse is not None else None, *strides, b, hq, hkv, nq, nk, float(scale),
    )  # fmt: skip


@pytest.fixture
def kernels(monkeypatch: pytest.MonkeyPatch) -> Any:
    from fa2tune.ops import kernels as module
    from fa2tune.ops import workspace

    streams = iter(range(100, 10_000))
    state = {"stream": next(streams), "capturing": False}
    monkeypatch.setattr(module, "make_params", _make_params)
    monkeypatch.setattr(module, "current_stream", lambda device: state["stream"])
    monkeypatch.setattr(module, "raw_stream", None)  # the launchers then ask current_stream
    monkeypatch.setattr(module, "capturing", lambda: state["capturing"])
    monkeypatch.setattr(workspace, "_workspaces", {})  # no stream's buffers cached yet
    monkeypatch.setattr(
        workspace, "_stream_workspace", lambda device, stream, n, floats: (COUNTERS, PARTIALS)
    )
    module.test_state = state  # type: ignore[attr-defined]
    return module


def _qkv(b: int, h: int, hkv: int, nq: int, nk: int, d: int) -> tuple[Any, Any, Any]:
    q = torch.randn(b, nq, h, d, dtype=torch.float16)
    k = torch.randn(b, nk, hkv, d, dtype=torch.float16)
    return q, k, torch.randn_like(k)


def test_pointers_patched_on_one_bound_launch(kernels: Any) -> None:
    kernel = FakeKernel()
    launcher = kernels.Launcher(kernel, fa2_default_config(64, "fp16", False), "exact",
                                Shape(128, 128, 2, 4, 4))  # fmt: skip
    q, k, v = _qkv(2, 4, 4, 128, 128, 64)
    o, o2 = torch.empty_like(q), torch.empty_like(q)
    lse = torch.empty(2, 4, 128)
    launcher(q, k, v, o, None, 0.125, "bnhd")
    q2 = torch.randn_like(q)
    launcher(q2, k, v, o2, lse, 0.5, "bnhd")
    first, second = kernel.log
    assert (first["q"], first["o"], first["lse"]) == (q.data_ptr(), o.data_ptr(), None)
    assert (second["q"], second["o"], second["lse"]) == (q2.data_ptr(), o2.data_ptr(),
                                                         lse.data_ptr())  # fmt: skip
    assert (first["scale"], second["scale"]) == (0.125, 0.5)
    assert first["bound"] == second["bound"] and kernel.binds == 1 and first["extra"] == []
    kernels.test_state["stream"] = 7  # another stream: its own bound launch
    launcher(q, k, v, o, None, 0.125, "bnhd")
    assert kernel.log[-1]["stream"] == 7 and kernel.binds == 2


def test_new_stride_patterns_and_misaligned_pointers_are_checked(kernels: Any) -> None:
    kernel = FakeKernel()
    launcher = kernels.Launcher(kernel, fa2_default_config(64, "fp16", False), "exact",
                                Shape(128, 128, 2, 4, 4))  # fmt: skip
    q, k, v = _qkv(2, 4, 4, 128, 128, 64)
    o = torch.empty_like(q)
    launcher(q, k, v, o, None, 0.125, "bnhd")
    padded = torch.randn(2, 128, 4, 72, dtype=torch.float16)[..., :64]
    launcher(padded, k, v, o, None, 0.125, "bnhd")
    assert len(launcher._variants) == 2
    odd = torch.randn(2, 128, 4, 65, dtype=torch.float16)[..., :64]
    with pytest.raises(ValueError, match="multiple of 8"):
        launcher(odd, k, v, o, None, 0.125, "bnhd")
    flat = torch.randn(2 * 128 * 4 * 64 + 1, dtype=torch.float16)
    shifted = flat[1:].view(2, 128, 4, 64)  # the contiguous pattern, a misaligned pointer
    with pytest.raises(ValueError, match="16-byte aligned"):
        launcher(shifted, k, v, o, None, 0.125, "bnhd")
    assert len(kernel.log) == 2


def test_splitkv_workspace_pointers(kernels: Any) -> None:
    kernel = FakeKernel()
    config = splitkv_default(128, "fp16", False)
    launcher = kernels.Launcher(kernel, config, "exact", Shape(1, 8192, 2, 32, 8))
    ws = launcher._ws
    assert (ws.counters, ws.partial_rows) == (16, 16 * 16 * 16)
    assert launcher._grid[0] == ws.counters
    q, k, v = _qkv(2, 32, 8, 1, 8192, 128)
    o = torch.empty_like(q)
    launcher(q, k, v, o, None, 0.1, "bnhd")
    ws_o, ws_lse, count = kernel.log[-1]["extra"]
    assert (count, ws_o) == (COUNTERS, PARTIALS)  # the stream's counters and partials
    assert ws_lse - ws_o == 4 * ws.partial_rows * 128
    kernels.test_state["capturing"] = True  # one allocation: counters (16 B aligned) first
    launcher(q, k, v, o, None, 0.1, "bnhd")
    ws_o, ws_lse, count = kernel.log[-1]["extra"]
    assert ws_o - count == 4 * 16 and ws_o % 16 == 0
    assert ws_lse - ws_o == 4 * ws.partial_rows * 128
    one_split = kernels.Launcher(kernel, config, "exact", Shape(1, 32, 2, 32, 8))
    k1, v1 = k[:, :32], v[:, :32]
    one_split(q, k1, v1, o, None, 0.1, "bnhd")
    assert kernel.log[-1]["extra"] == [None, None, None]  # no workspace: null pointers


def test_fa3_descriptors_cached_per_pointer_triple(kernels: Any) -> None:
    kernel = FakeKernel()
    launcher = kernels.Launcher(kernel, fa3_default(64, "fp16", False), "exact",
                                Shape(128, 128, 2, 4, 4))  # fmt: skip
    encoded: list[int] = []

    def prep(config: Any, q: Any, k: Any, v: Any, layout: str) -> tuple[Any, ...]:
        encoded.append(q.data_ptr())
        return (ctypes.c_uint64(q.data_ptr()),)

    launcher._prep = prep
    q, k, v = _qkv(2, 4, 4, 128, 128, 64)
    o = torch.empty_like(q)
    launcher(q, k, v, o, None, 0.125, "bnhd")
    launcher(q, k, v, o, None, 0.125, "bnhd")
    assert encoded == [q.data_ptr()] and kernel.binds == 1
    others = [torch.randn_like(q) for _ in range(kernels._TMA_CACHE)]
    for other in others:
        launcher(other, k, v, o, None, 0.125, "bnhd")
        assert kernel.log[-1]["extra"] == [other.data_ptr()]
    assert len(launcher._variants[(q.stride(), k.stride(), v.stride())].tma) == kernels._TMA_CACHE
    launcher(q, k, v, o, None, 0.125, "bnhd")  # evicted: encoded again
    assert encoded.count(q.data_ptr()) == 2


def test_stream_workspace_grows_and_is_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per (device, stream) buffers: allocated once, counters zeroed once, reused while big
    enough; growing synchronises the stream before the old buffer is freed."""
    from fa2tune.ops import workspace as module
    from measure import loader

    calls: list[tuple[Any, ...]] = []
    next_ptr = iter(range(0x1000, 0x100000, 0x1000))

    def fake_call(name: str, *args: Any) -> Any:
        calls.append((name, *args))
        return next(next_ptr) if name == "cuMemAlloc" else None

    monkeypatch.setattr(loader, "call", fake_call)
    monkeypatch.setattr(module, "_workspaces", {})
    c1, p1 = module._stream_workspace(0, 5, 16, 1000)
    assert [c[0] for c in calls] == ["cuMemAlloc", "cuMemsetD32Async", "cuMemAlloc"]
    assert calls[1] == ("cuMemsetD32Async", c1, 0, 4096, 5)  # counters zeroed on its stream
    calls.clear()
    assert module._stream_workspace(0, 5, 4000, 60_000) == (c1, p1) and not calls
    c2, p2 = module._stream_workspace(0, 5, 16, 70_000)  # partials grow, counters stay
    assert c2 == c1 and p2 != p1
    assert [c[0] for c in calls] == ["cuMemAlloc", "cuStreamSynchronize", "cuMemFree"]
    assert calls[-1] == ("cuMemFree", p1)
    calls.clear()
    c3, p3 = module._stream_workspace(0, 6, 16, 10)  # another stream: buffers of its own
    assert c3 not in (c1, c2) and p3 not in (p1, p2) and "cuStreamSynchronize" not in calls[0]


def _packed_params(q: Any, k: Any, v: Any, o: Any, lse: Any, scale: float, seqs: Any) -> Any:
    """measure.params.packed_params for CPU tensors (the packed rows as one batch)."""
    params = _make_params(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), o.unsqueeze(0), None,
                          scale, "bnhd")  # fmt: skip
    params.batch, params.nq, params.nk = seqs.count, seqs.max_seqlen_q, seqs.max_seqlen_k
    for name in ("q", "k", "v", "o"):
        setattr(params, f"{name}_batch_stride", 0)
    return params, mp.FaVarlen(seqs.cu_seqlens_q, seqs.cu_seqlens_k, int(q.shape[0]), 0)


def test_packed_launches_patch_offsets_and_lengths(
    kernels: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A packed decision (the one op path with cu_seqlens): per call the pointers, offsets,
    longest lengths and number of sequences are patched into one bound launch per (stream,
    grid x); more sequences than the grid's z allows run over slices of the offsets."""
    from dataclasses import replace

    from measure.loader import GRID_YZ_LIMIT

    monkeypatch.setattr(kernels, "packed_params", _packed_params)
    kernel = FakeKernel()
    config = replace(fa2_default_config(64, "fp16", True), varlen=True)
    launcher = kernels.PackedLauncher(kernel, config, "default", 4, 2)
    q = torch.randn(300, 4, 64, dtype=torch.float16)
    k = torch.randn(500, 2, 64, dtype=torch.float16)
    o = torch.empty_like(q)
    cu_q, cu_k = (
        torch.tensor([0, 100, 300], dtype=torch.int32),
        torch.tensor([0, 200, 500], dtype=torch.int32),
    )
    launcher(q, k, k, o, None, 0.125, "bnhd", kernels.CuSeqlens(cu_q, cu_k, 200, 300))
    launcher(q, k, k, o, None, 0.5, "bnhd", kernels.CuSeqlens(cu_q, cu_k, 210, 300))
    first, second = kernel.log
    assert first["bound"] == second["bound"] and kernel.binds == 1  # same grid x (br=128)
    assert (first["nq"], second["nq"], second["scale"]) == (200, 210, 0.5)
    (vl,) = second["extra"]
    assert (vl.cu_seqlens_q, vl.cu_seqlens_k, vl.total_q) == (cu_q.data_ptr(),
                                                              cu_k.data_ptr(), 300)  # fmt: skip
    launcher(q, k, k, o, None, 0.5, "bnhd", kernels.CuSeqlens(cu_q, cu_k, 1000, 300))
    assert kernel.binds == 2  # another grid x: its own bound launch
    n = GRID_YZ_LIMIT + 5
    many = torch.arange(n + 1, dtype=torch.int32)
    rows = torch.randn(n, 4, 64, dtype=torch.float16)
    kv = torch.randn(n, 2, 64, dtype=torch.float16)
    kernel.log.clear()
    launcher(rows, kv, kv, torch.empty_like(rows), None, 0.5, "bnhd",
             kernels.CuSeqlens(many, many, 1, 1))  # fmt: skip
    assert len(kernel.log) == 2
    assert [e["extra"][0].cu_seqlens_q for e in kernel.log] == [
        many.data_ptr(),
        many.data_ptr() + 4 * GRID_YZ_LIMIT,
    ]


def test_variant_argument_is_last_and_its_sinks_pointer_patched(
    kernels: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A config built with variant switches gets FaVariant as its last kernel argument (one
    object per launcher, its run-time values from the decision's variant); the sinks
    pointer is patched per call; a plain config's arguments stay as they were."""
    from dataclasses import replace

    from core.variant import Variant

    kernel = FakeKernel()
    config = replace(fa2_default_config(64, "fp16", True), local=True, sinks=True)
    variant = Variant(16, 0, sinks=True)
    launcher = kernels.Launcher(kernel, config, "default", Shape(128, 128, 2, 4, 4), None,
                                variant)  # fmt: skip
    q, k, v = _qkv(2, 4, 4, 128, 128, 64)
    o = torch.empty_like(q)
    sinks, sinks2 = torch.zeros(4), torch.ones(4)
    launcher(q, k, v, o, None, 0.125, "bnhd", None, sinks)
    (fv,) = kernel.log[-1]["extra"]
    assert isinstance(fv, mp.FaVariant)
    assert (fv.window_left, fv.window_right, fv.chunk) == (16, 0, 0)
    launcher(q, k, v, o, None, 0.125, "bnhd", None, sinks2)
    assert kernel.binds == 1 and fv.sinks == sinks2.data_ptr()  # one bound launch, patched
    plain = kernels.Launcher(FakeKernel(), fa2_default_config(64, "fp16", True), "default",
                             Shape(128, 128, 2, 4, 4))  # fmt: skip
    assert plain._fv is None and plain._fv_args == ()
    # split-KV: the workspace arguments first, FaVariant last.
    skv = replace(splitkv_default(64, "fp16", False), softcap=True)
    kernel = FakeKernel()
    launcher = kernels.Launcher(kernel, skv, "default", Shape(1, 4096, 1, 4, 4), None,
                                Variant(softcap=30.0))  # fmt: skip
    q, k, v = _qkv(1, 4, 4, 1, 4096, 64)
    launcher(q, k, v, torch.empty_like(q), None, 0.125, "bnhd")
    extra = kernel.log[-1]["extra"]
    assert isinstance(extra[-1], mp.FaVariant) and abs(extra[-1].softcap - 30.0) < 1e-6
    assert extra[-1].sinks is None and len(extra) >= 2


def test_packed_variant_argument_follows_the_varlen_argument(
    kernels: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataclasses import replace

    from core.variant import Variant

    monkeypatch.setattr(kernels, "packed_params", _packed_params)
    kernel = FakeKernel()
    config = replace(fa2_default_config(64, "fp16", True), varlen=True, local=True)
    launcher = kernels.PackedLauncher(kernel, config, "default", 4, 2, Variant(chunk=32))
    q = torch.randn(300, 4, 64, dtype=torch.float16)
    k = torch.randn(500, 2, 64, dtype=torch.float16)
    cu_q = torch.tensor([0, 100, 300], dtype=torch.int32)
    cu_k = torch.tensor([0, 200, 500], dtype=torch.int32)
    launcher(q, k, k, torch.empty_like(q), None, 0.125, "bnhd",
             kernels.CuSeqlens(cu_q, cu_k, 200, 300))  # fmt: skip
    vl, fv = kernel.log[-1]["extra"]
    assert vl.total_q == 300 and isinstance(fv, mp.FaVariant) and fv.chunk == 32
