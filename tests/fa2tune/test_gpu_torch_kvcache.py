"""KV-cache attention through fa2tune.torch and fa2tune.flash_attn on a real GPU (marker
``gpu``).

First-use tuning is off and ``Settings.fa3_cache`` too: every call gets the split-KV cache
kernel of its default tile (``_kvc``, paged ``_kvc_pg<P>``), with ``fallback=False``, but in
the Hopper family's test, which turns it on. Each case draws random caches,
lengths (0, 1, a full cache and values between), new keys to append and queries, runs the
kernel and the op's torch implementation (:mod:`fa2tune.ops.kvcache_fallback`, float32
maths; checked against brute force on CPU in test_torch_kvcache_cpu.py) on copies of the
same caches, and compares O, the LSE and the caches after the append (bit-exact). Outputs
are poisoned with NaN before the kernel writes them (an unwritten row fails). Also: one
captured CUDA graph replayed over 1,000 decode steps of growing lengths against eager calls,
torch.compile (fullgraph) of an append-and-attend step, and fa2tune.flash_attn's
``flash_attn_with_kvcache`` on a paged cache.

Skipped, with the reason, without torch, cuda-bindings, a CUDA GPU of sm_80+ or a kernel
compiler (nvcc, or NVRTC from the wheels).
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.gpu import torch_op_skip_reason
from tests.support.settings import settings_overridden

_REASON = torch_op_skip_reason()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_REASON is not None, reason=f"fa2tune KV-cache GPU tests: {_REASON}"),
]


@pytest.fixture(autouse=True)
def _defaults_only() -> Iterator[None]:
    """Family defaults only, and split-KV's cache kernels only (``fa3_cache`` off: a chunked
    prefill case on an H200 would otherwise run the Hopper family's, which
    :func:`test_hopper_cache_kernels_match_the_torch_path` checks with it on)."""
    from fa2tune.torch import autotune, clear_caches

    with settings_overridden(fa3_cache=False):
        autotune("off")
        clear_caches()
        yield
        clear_caches()
        autotune("cached")


@dataclass(frozen=True)
class Case:
    batch: int = 3
    nq: int = 1
    heads: int = 8
    kv_heads: int = 2
    d: int = 128
    capacity: int = 512  # a paged cache: pages of `page` keys, capacity / page per sequence
    page: int = 0
    new: int = 0
    causal: bool = True
    batch_idx: bool = False
    leftpad: bool = False  # cache_leftpad: 0, the whole cached length, random
    window: tuple[int, int] = (-1, -1)
    chunk: int = 0
    softcap: float = 0.0
    sinks: bool = False
    dtype: str = "bfloat16"
    #: How the block table lies in memory: "rows" (contiguous), "wide" (rows of a wider
    #: table: row stride past max_pages), "gaps" (every other column: copied per call).
    table: str = "rows"

    def id(self) -> str:
        parts = [f"b{self.batch}q{self.nq}h{self.heads}:{self.kv_heads}d{self.d}c{self.capacity}",
                 f"pg{self.page}" if self.page else "contig", f"new{self.new}",
                 "causal" if self.causal else "full"]  # fmt: skip
        if self.batch_idx:
            parts.append("idx")
        if self.leftpad:
            parts.append("lp")
        if self.window != (-1, -1):
            parts.append(f"w{self.window[0]}_{self.window[1]}")
        if self.chunk:
            parts.append(f"ch{self.chunk}")
        if self.softcap:
            parts.append("cap")
        if self.sinks:
            parts.append("snk")
        if self.dtype != "bfloat16":
            parts.append(self.dtype)
        if self.table != "rows":
            parts.append(f"table-{self.table}")
        return "-".join(parts)


CASES = [
    Case(),
    Case(page=1),
    Case(page=4, new=1),
    Case(page=16, new=1),
    Case(page=16, new=3, nq=3),
    Case(page=64, batch_idx=True, new=1),
    Case(page=128, causal=False, nq=4),
    Case(page=256, new=1, capacity=1024),
    Case(new=1, batch_idx=True),
    Case(new=4, nq=4, causal=True),
    Case(nq=16, new=16, page=16, capacity=256),  # a prefill chunk over a cached prefix
    Case(d=64, page=16, heads=64, kv_heads=8, new=1, capacity=2048, batch=4),
    Case(d=96, page=32, new=1, dtype="float16"),
    Case(d=256, page=16, heads=4, kv_heads=4, new=1, capacity=256),
    Case(page=16, new=1, window=(100, 0)),
    Case(page=8, nq=4, new=4, window=(32, 0), causal=True),
    Case(page=16, new=1, chunk=128),
    Case(page=16, new=1, softcap=30.0),
    Case(d=64, heads=64, kv_heads=8, page=16, new=1, sinks=True, window=(128, 0), batch=2),
    Case(page=4, nq=2, new=2, causal=False, sinks=True, softcap=20.0),
    Case(page=16, new=1, table="wide"),
    Case(page=16, new=1, table="gaps", batch_idx=True),
    Case(leftpad=True, new=1, batch=5),
    Case(leftpad=True, batch_idx=True, nq=4, new=4, window=(64, 0), batch=5),
    Case(leftpad=True, nq=8, new=8, chunk=96, batch=5, d=64, dtype="float16"),
    Case(leftpad=True, page=16, nq=2, new=2, batch=5),  # pages: a gathered contiguous copy
    Case(leftpad=True, page=64, batch_idx=True, nq=4, new=4, window=(64, 0), batch=5),
]


def _lengths(case: Case, torch: Any) -> Any:
    """Cached lengths before the append: 0, 1, a full cache and random ones in between."""
    top = case.capacity - case.new
    fixed = [0, min(1, top), top]
    rng = torch.Generator().manual_seed(case.batch * 31 + case.capacity)
    extra = torch.randint(0, top + 1, (case.batch,), generator=rng).tolist()
    return torch.tensor((fixed + extra)[: case.batch], dtype=torch.int32)


def _inputs(case: Case) -> dict[str, Any]:
    import torch

    torch.manual_seed(hash(case.id()) % (2**31))
    dt = getattr(torch, case.dtype)
    dev = "cuda"
    b, hkv, d = case.batch, case.kv_heads, case.d
    out: dict[str, Any] = {"q": torch.randn(b, case.nq, case.heads, d, device=dev, dtype=dt)}
    if case.page:
        per_seq = case.capacity // case.page
        pages = b * per_seq + 3  # spare pages: a table need not use them all
        out["k_cache"] = torch.randn(pages, case.page, hkv, d, device=dev, dtype=dt)
        out["v_cache"] = torch.randn(pages, case.page, hkv, d, device=dev, dtype=dt)
        shuffled = torch.randperm(pages, device=dev)  # pages in any order
        table = shuffled[: b * per_seq].view(b, per_seq).to(torch.int32)
        if case.table != "rows":  # the same entries inside a wider tensor of a spare page
            spare = int(shuffled[-1])  # in no sequence: reading it is a wrong, finite result
            wide = torch.full((b, 2 * per_seq + 3), spare, dtype=torch.int32, device=dev)
            columns = slice(0, 2 * per_seq, 2) if case.table == "gaps" else slice(0, per_seq)
            wide[:, columns] = table
            table = wide[:, columns]
        out["page_table"] = table
    else:
        rows = b + 2 if case.batch_idx else b
        out["k_cache"] = torch.randn(rows, case.capacity, hkv, d, device=dev, dtype=dt)
        out["v_cache"] = torch.randn(rows, case.capacity, hkv, d, device=dev, dtype=dt)
        out["page_table"] = None
    rows = int(out["page_table"].shape[0]) if case.page else int(out["k_cache"].shape[0])
    out["cache_batch_idx"] = (
        torch.randperm(rows, device=dev)[:b].to(torch.int32) if case.batch_idx else None
    )
    out["cache_seqlens"] = _lengths(case, torch).to(dev)
    out["cache_leftpad"] = None
    if case.leftpad:  # first keys: 0, a whole cached length (nothing left but the new rows)
        lens = out["cache_seqlens"].cpu()
        pad = (torch.rand(b) * (lens + 1).float()).long().clamp(max=lens)
        pad[0], pad[-1] = 0, lens[-1]
        out["cache_leftpad"] = pad.to(torch.int32).to(dev)
    if case.new:
        out["k"] = torch.randn(b, case.new, hkv, d, device=dev, dtype=dt)
        out["v"] = torch.randn(b, case.new, hkv, d, device=dev, dtype=dt)
    else:
        out["k"] = out["v"] = None
    out["sinks"] = torch.randn(case.heads, device=dev) * 2 if case.sinks else None
    return out


def _reference(case: Case, x: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """The torch path on copies of the caches: (O, LSE, k_cache, v_cache) after it."""
    from core.variant import normalize
    from fa2tune.ops.kvcache import append_kv
    from fa2tune.ops.kvcache_fallback import kvcache_fallback, sequence_lengths

    kc, vc = x["k_cache"].clone(), x["v_cache"].clone()
    if case.new:
        append_kv(kc, vc, x["k"], x["v"], x["cache_seqlens"], x["page_table"],
                  x["cache_batch_idx"])  # fmt: skip
    causal, variant = normalize(case.causal, *case.window, case.chunk, softcap=case.softcap,
                                sinks=case.sinks)  # fmt: skip
    lengths = sequence_lengths(x["cache_seqlens"], case.new, case.capacity)
    o, lse = kvcache_fallback(x["q"], kc, vc, lengths, page_table=x["page_table"],
                              cache_batch_idx=x["cache_batch_idx"], causal=causal,
                              scale=1.0 / math.sqrt(case.d), variant=variant,
                              sinks=x["sinks"], leftpad=x["cache_leftpad"])  # fmt: skip
    return o, lse, kc, vc


def _poison_next_allocations(torch: Any, nbytes: int) -> None:
    """Fill freed memory of the caching allocator with NaN bytes, so a fresh ``empty`` the op
    makes next holds NaN where the kernel writes nothing."""
    junk = torch.full((nbytes // 2 + 1024,), float("nan"), device="cuda", dtype=torch.float16)
    del junk


def _assert_matches(case: Case, x: dict[str, Any], got: tuple[Any, Any],
                    ref: tuple[Any, Any, Any, Any]) -> None:  # fmt: skip
    """The caches after the append bit for bit, O within the dtype's tolerance, every row
    written, the rows that see no key the same and the LSE within 1e-3 of the torch path."""
    import torch

    o, lse = got
    o_ref, lse_ref, kc_ref, vc_ref = ref
    assert torch.equal(x["k_cache"], kc_ref) and torch.equal(x["v_cache"], vc_ref), "append"
    assert not torch.isnan(o).any(), "rows left unwritten"
    err = (o.float() - o_ref.float()).abs().max().item()
    tol = 2e-2 if case.dtype == "bfloat16" else 4e-3
    assert err <= tol, f"max |O - ref| = {err:.3g} > {tol}"
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), finite), "rows with no key differ"
    lse_err = (lse[finite] - lse_ref[finite]).abs().max().item() if finite.any() else 0.0
    assert lse_err <= 1e-3, f"max |LSE - ref| = {lse_err:.3g}"


@pytest.mark.parametrize("case", CASES, ids=[c.id() for c in CASES])
def test_kvcache_matches_the_torch_path(case: Case) -> None:
    import torch

    from fa2tune.torch import attention_with_kvcache

    x = _inputs(case)
    o_ref, lse_ref, kc_ref, vc_ref = _reference(case, x)
    _poison_next_allocations(torch, 4 * x["q"].numel() * 4)
    o, lse = attention_with_kvcache(
        x["q"], x["k_cache"], x["v_cache"], x["k"], x["v"], cache_seqlens=x["cache_seqlens"],
        page_table=x["page_table"], cache_batch_idx=x["cache_batch_idx"],
        cache_leftpad=x["cache_leftpad"], causal=case.causal, window_size=case.window,
        attention_chunk=case.chunk, softcap=case.softcap, sinks=x["sinks"], return_lse=True,
        fallback=False,
    )  # fmt: skip
    torch.cuda.synchronize()
    _assert_matches(case, x, (o, lse), (o_ref, lse_ref, kc_ref, vc_ref))


def test_one_graph_replays_a_growing_decode_loop() -> None:
    """1,000 decode steps of a captured graph (append one key, attend) over growing lengths
    match eager calls on a twin cache step by step; the caches end bit-identical."""
    import torch

    from fa2tune.torch import attention_with_kvcache

    torch.manual_seed(7)
    b, hq, hkv, d, page, steps = 4, 16, 4, 128, 16, 1000
    per_seq = (steps + 200) // page + 1
    dt = torch.bfloat16
    pages = b * per_seq
    kc = torch.randn(pages, page, hkv, d, device="cuda", dtype=dt)
    vc = torch.randn_like(kc)
    kc_eager, vc_eager = kc.clone(), vc.clone()
    table = torch.randperm(pages, device="cuda").view(b, per_seq).to(torch.int32)
    lens = torch.tensor([0, 5, 77, 190], dtype=torch.int32, device="cuda")
    lens_eager = lens.clone()
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=dt)
    kn = torch.randn(b, 1, hkv, d, device="cuda", dtype=dt)
    vn = torch.randn_like(kn)

    def step(kcache: Any, vcache: Any, seqlens: Any) -> Any:
        return attention_with_kvcache(q, kcache, vcache, kn, vn, cache_seqlens=seqlens,
                                      page_table=table, causal=True, fallback=False)  # fmt: skip

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(kc.clone(), vc.clone(), lens.clone())  # warm-up: decision, build, load
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(kc, vc, lens)
    worst = 0.0
    for i in range(steps):
        q.copy_(torch.randn_like(q))
        kn.copy_(torch.randn_like(kn))
        vn.copy_(torch.randn_like(vn))
        graph.replay()
        eager = step(kc_eager, vc_eager, lens_eager)
        worst = max(worst, (out.float() - eager.float()).abs().max().item())
        lens += 1
        lens_eager += 1
        if i % 250 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    assert worst == 0.0, f"graph and eager differ by {worst}"
    assert torch.equal(kc, kc_eager) and torch.equal(vc, vc_eager)
    assert lens.tolist() == [steps, steps + 5, steps + 77, steps + 190]


def test_torch_compile_fullgraph_append_and_attend() -> None:
    import torch

    from fa2tune.torch import attention_with_kvcache

    case = Case(page=16, new=1, batch=2)
    x = _inputs(case)
    kc2, vc2 = x["k_cache"].clone(), x["v_cache"].clone()

    def decode(q: Any, kc: Any, vc: Any, k: Any, v: Any, lens: Any, table: Any) -> Any:
        return attention_with_kvcache(q * 1.0, kc, vc, k, v, cache_seqlens=lens,
                                      page_table=table, causal=True, fallback=False)  # fmt: skip

    compiled = torch.compile(decode, fullgraph=True)
    args = (x["q"], x["k"], x["v"], x["cache_seqlens"], x["page_table"])
    got = compiled(args[0], x["k_cache"], x["v_cache"], *args[1:])
    want = decode(args[0], kc2, vc2, *args[1:])
    torch.cuda.synchronize()
    assert torch.equal(x["k_cache"], kc2), "the compiled call appended differently"
    assert (got.float() - want.float()).abs().max().item() <= 1e-6


def test_flash_attn_with_kvcache_paged() -> None:
    import torch

    from fa2tune.flash_attn import flash_attn_with_kvcache

    case = Case(page=16, new=1, batch_idx=True)
    x = _inputs(case)
    o_ref, lse_ref, _, _ = _reference(case, x)
    out, lse = flash_attn_with_kvcache(
        x["q"], x["k_cache"], x["v_cache"], x["k"], x["v"], cache_seqlens=x["cache_seqlens"],
        cache_batch_idx=x["cache_batch_idx"], page_table=x["page_table"], causal=True,
        return_softmax_lse=True, num_splits=3, pack_gqa=True,
    )  # fmt: skip
    assert (out.float() - o_ref.float()).abs().max().item() <= 2e-2
    finite = torch.isfinite(lse_ref)
    assert torch.all(lse[~finite] == float("inf")), "FlashAttention's +inf for empty rows"
    assert (lse[finite] - lse_ref[finite]).abs().max().item() <= 1e-3


@pytest.mark.parametrize("page", [0, 16])
def test_append_past_the_capacity_writes_nothing_out_of_bounds(page: int) -> None:
    """Full caches plus new rows: the append kernel drops what does not fit (the memory past
    each sequence's cache is untouched) and the attention clamps the length to the
    capacity."""
    import torch

    from fa2tune.ops.kvcache_fallback import kvcache_fallback, sequence_lengths
    from fa2tune.torch import attention_with_kvcache

    torch.manual_seed(3)
    b, hq, hkv, d, cap, new = 2, 8, 2, 128, 256, 2
    dt = torch.bfloat16
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=dt)
    kn = torch.randn(b, new, hkv, d, device="cuda", dtype=dt)
    vn = torch.randn_like(kn)
    lens = torch.tensor([cap - 1, cap], dtype=torch.int32, device="cuda")
    table = None
    if page:  # every sequence's pages, then guard pages no table entry names
        per = cap // page
        kbig = torch.randn(b * per + 4, page, hkv, d, device="cuda", dtype=dt)
        table = torch.arange(b * per, device="cuda", dtype=torch.int32).view(b, per)
        k_cache, guard = kbig, kbig[b * per :]
    else:  # each cache row followed by guard rows, as a strided view
        kbig = torch.randn(b, cap + 8, hkv, d, device="cuda", dtype=dt)
        k_cache, guard = kbig[:, :cap], kbig[:, cap:]
    v_cache = torch.randn_like(k_cache)
    guard_before = guard.clone()
    k_ref = k_cache.clone()
    o = attention_with_kvcache(q, k_cache, v_cache, kn, vn, cache_seqlens=lens,
                               page_table=table, fallback=False)  # fmt: skip
    torch.cuda.synchronize()
    assert torch.equal(guard, guard_before), "the append wrote past the capacity"
    # The first sequence had room for one new row, the second for none.
    if page:
        assert torch.equal(k_cache[table[0, -1].long(), -1], kn[0, 0])
        second = table[1].long()
        assert torch.equal(k_cache[second], k_ref[second])
    else:
        assert torch.equal(k_cache[0, cap - 1], kn[0, 0])
        assert torch.equal(k_cache[1], k_ref[1])
    lengths = sequence_lengths(lens, new, cap)
    assert lengths.tolist() == [cap, cap]
    scale = 1 / math.sqrt(d)
    want, _ = kvcache_fallback(q, k_cache, v_cache, lengths, page_table=table,
                               cache_batch_idx=None, causal=False, scale=scale)  # fmt: skip
    assert (o.float() - want.float()).abs().max().item() <= 2e-2


def test_debug_mode_refuses_bad_device_values_and_passes_good_ones() -> None:
    """FA2TUNE_CHECK_KVCACHE on CUDA tensors: a block-table entry a sequence reaches that is
    outside the caches raises before the kernels (the caches untouched); good values run
    the kernels, with the same result as without the checks."""
    import torch

    from core import settings as settings_module
    from core.settings import override_settings
    from fa2tune.torch import attention_with_kvcache, clear_caches

    x = _inputs(Case(page=16, new=1))
    args = dict(cache_seqlens=x["cache_seqlens"], page_table=x["page_table"], causal=True,
                fallback=False)  # fmt: skip
    saved = dict(settings_module._overrides)
    try:
        override_settings(check_kvcache=True)
        clear_caches()  # the setting is read when a cache shape is first decided
        bad = x["page_table"].clone()
        bad[1, 0] = int(x["k_cache"].shape[0]) + 5
        before = x["k_cache"].clone()
        with pytest.raises(ValueError, match=r"page_table\[1, 0\]"):
            attention_with_kvcache(x["q"], x["k_cache"], x["v_cache"], x["k"], x["v"],
                                   **{**args, "page_table": bad})  # fmt: skip
        torch.cuda.synchronize()
        assert torch.equal(x["k_cache"], before), "nothing appended before the refusal"
        kc, vc = x["k_cache"].clone(), x["v_cache"].clone()
        checked = attention_with_kvcache(x["q"], kc, vc, x["k"], x["v"], **args)
    finally:
        settings_module._overrides.clear()
        settings_module._overrides.update(saved)
        clear_caches()
    plain = attention_with_kvcache(x["q"], x["k_cache"], x["v_cache"], x["k"], x["v"], **args)
    torch.cuda.synchronize()
    assert torch.equal(checked, plain) and torch.equal(kc, x["k_cache"])


#: Chunked prefills for the Hopper family's cache kernels (FA2TUNE_FA3_CACHE): prefill-length
#: query chunks with an append, over contiguous caches and pages smaller than, equal to and
#: larger than a 128-key tile, causal and not, a window, a mapped batch.
HOPPER_CASES = [
    Case(nq=64, new=64, capacity=1024, heads=16, kv_heads=4),
    Case(nq=200, new=200, page=16, capacity=1024, heads=16, kv_heads=4),
    Case(nq=130, new=130, page=128, capacity=1024, causal=False),
    Case(nq=256, new=256, page=256, capacity=2048, heads=32, kv_heads=8, batch_idx=True),
    Case(nq=100, new=100, page=64, capacity=1024, window=(300, 0)),
    Case(nq=96, new=96, page=16, capacity=512, dtype="float16", d=64, heads=8, kv_heads=8),
    Case(nq=160, new=160, capacity=1024, heads=16, kv_heads=4, leftpad=True, batch=5),
    Case(nq=64, new=64, capacity=1024, leftpad=True, batch_idx=True, window=(200, 0), batch=5),
]


@pytest.mark.parametrize("case", HOPPER_CASES, ids=[c.id() for c in HOPPER_CASES])
def test_hopper_cache_kernels_match_the_torch_path(case: Case) -> None:
    """With FA2TUNE_FA3_CACHE on a compute capability 9.0 GPU, a chunked prefill runs the
    Hopper family's cache kernel (the dense pick's twin) and matches the torch path."""
    import torch

    from core import settings as settings_module
    from core.settings import override_settings
    from fa2tune.ops import kvcache
    from fa2tune.torch import attention_with_kvcache, clear_caches

    if torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip(f"the Hopper family needs compute capability 9.0, not "
                    f"{torch.cuda.get_device_name(0)}")  # fmt: skip
    x = _inputs(case)
    o_ref, lse_ref, kc_ref, vc_ref = _reference(case, x)
    saved = dict(settings_module._overrides)
    try:
        override_settings(fa3_cache=True)
        clear_caches()  # read when a cache shape is first decided
        _poison_next_allocations(torch, 4 * x["q"].numel() * 4)
        o, lse = attention_with_kvcache(
            x["q"], x["k_cache"], x["v_cache"], x["k"], x["v"],
            cache_seqlens=x["cache_seqlens"], page_table=x["page_table"],
            cache_batch_idx=x["cache_batch_idx"], cache_leftpad=x["cache_leftpad"],
            causal=case.causal, window_size=case.window,
            return_lse=True, fallback=False,
        )  # fmt: skip
        torch.cuda.synchronize()
        entries = [d.entry for d in kvcache._decisions.values()]
        assert [e.config.family for e in entries if not isinstance(e, str)] == ["fa3"]
    finally:
        settings_module._overrides.clear()
        settings_module._overrides.update(saved)
        clear_caches()
    _assert_matches(case, x, (o, lse), (o_ref, lse_ref, kc_ref, vc_ref))


@pytest.mark.parametrize("page", [0, 16], ids=["contig", "pg16"])
def test_packed_queries_and_new_keys_match_the_torch_path(page: int) -> None:
    """flash_attn_with_kvcache with cu_seqlens_q / cu_seqlens_k_new (sequences of 0-5 queries
    and 0-3 new rows) on the GPU's kernels against the same packed call on CPU copies (the
    op's torch path): the caches bit for bit after the packed append, O and the LSE."""
    import torch

    from fa2tune.flash_attn import flash_attn_with_kvcache
    from fa2tune.ops.kvcache_varlen import run_packed_with_kvcache

    torch.manual_seed(11 + page)
    hq, hkv, d, cap = 8, 2, 128, 512
    nqs, news = [1, 5, 0, 3], [2, 0, 1, 3]
    lens = torch.tensor([0, 100, 300, cap - 3], dtype=torch.int32)

    def cu(counts: list[int]) -> Any:
        return torch.tensor([0, *itertools.accumulate(counts)], dtype=torch.int32)

    dt = torch.bfloat16
    if page:
        pages = 4 * cap // page + 2
        kc, vc = (torch.randn(pages, page, hkv, d, dtype=dt) for _ in range(2))
        table = torch.randperm(pages)[: 4 * cap // page].view(4, cap // page).to(torch.int32)
    else:
        kc, vc = (torch.randn(4, cap, hkv, d, dtype=dt) for _ in range(2))
        table = None
    q = torch.randn(sum(nqs), hq, d, dtype=dt)
    k, v = (torch.randn(sum(news), hkv, d, dtype=dt) for _ in range(2))
    cpu = [t.clone() if t is not None else None for t in (kc, vc)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        o_ref, lse_ref = run_packed_with_kvcache(
            q, cpu[0], cpu[1], k, v, lens, table, None, None, cu(nqs), 5, cu(news), True,
            d**-0.5, (-1, -1), 0, 0.0, None, True, True,
        )  # fmt: skip
    dev = "cuda"
    kg, vg = kc.to(dev), vc.to(dev)
    o, lse = flash_attn_with_kvcache(
        q.to(dev), kg, vg, k.to(dev), v.to(dev), cache_seqlens=lens.to(dev),
        page_table=table.to(dev) if table is not None else None, cu_seqlens_q=cu(nqs).to(dev),
        max_seqlen_q=5, cu_seqlens_k_new=cu(news).to(dev), causal=True, return_softmax_lse=True,
    )  # fmt: skip
    torch.cuda.synchronize()
    assert torch.equal(kg.cpu(), cpu[0]) and torch.equal(vg.cpu(), cpu[1]), "append"
    assert (o.cpu().float() - o_ref.float()).abs().max().item() <= 2e-2
    lse_ref = lse_ref.masked_fill(lse_ref == float("-inf"), float("inf"))  # FA's convention
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse.cpu()), finite)
    assert (lse.cpu()[finite] - lse_ref[finite]).abs().max().item() <= 1e-3
