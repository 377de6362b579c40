"""Attention variants: fa2tune against FlexAttention and SDPA with an explicit mask, same inputs.

For each model shape of issue 23 (Mistral-7B's sliding window, Gemma-2's softcap with and
without a window, GPT-OSS's sinks with a 128-token window, Llama-4's chunked attention; prefill
and decode), one run times on the same random inputs:

* ``fa2tune``: ``fa2tune.torch.attention`` with the variant's arguments, ``fallback=False``
  (the store's config for the variant, or its families' default with the variant's switches);
* ``flex``: torch's ``flex_attention`` under ``torch.compile`` (default options) with the
  equivalent block mask and score_mod; sinks as FlexAttention users add them, rescaling O by
  its LSE (``O * sigmoid(lse - sink)``, one small elementwise op);
* ``sdpa``: ``scaled_dot_product_attention`` with an explicit boolean mask (cuDNN, then the
  memory-efficient backend; softcap and sinks have no SDPA form, so those rows say ``-``).

It also prints fa2tune's largest error against FlexAttention's output, its rate over the
(query, key) pairs the variant leaves visible (4 B H D per pair, as FlashAttention's
benchmarks count a window) and, for a prefill with a window or a chunk, the time of the same
fa2tune call without the window or chunk (plain causal, softcap and sinks kept) in the same
run: ``vs causal rate`` is the variant's time over the time that causal call's rate predicts
for the variant's visible pairs (1.00: it costs exactly the keys it must visit). A decode row
also times 20 calls captured in one CUDA graph (fa2tune and FlexAttention both: a decode
kernel's few microseconds are otherwise hidden under host work) and gives the bandwidth over
the K/V rows its window lets it read (``GB/s visible``). Each case compiles FlexAttention
afresh (``torch._dynamo.reset``): past dynamo's recompile limit flex_attention runs unfused.
Times are the median of ``--reps`` CUDA-event timings after warm-up; inputs are N(0, 1)
(never zeros); outputs are fresh per call. Needs torch 2.5+ with a CUDA GPU, nvcc for
fa2tune's first build. From the repository root::

    PYTHONPATH=$PWD python bench/variants_vs_flex.py [--reps 20] [--only mistral,gemma2]
"""

from __future__ import annotations

import argparse
import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

log = logging.getLogger("variants_vs_flex")


@dataclass(frozen=True)
class Case:
    """One model shape: heads, head dim, lengths, and the variant's arguments."""

    name: str
    batch: int
    heads: int
    kv_heads: int
    d: int
    nq: int
    nk: int
    causal: bool = True
    window: tuple[int, int] = (-1, -1)
    chunk: int = 0
    softcap: float = 0.0
    sinks: bool = False


CASES = (
    Case("mistral-prefill", 1, 32, 8, 128, 16384, 16384, window=(4096, 0)),
    Case("mistral-prefill-32k", 1, 32, 8, 128, 32768, 32768, window=(4096, 0)),
    Case("mistral-decode", 8, 32, 8, 128, 1, 32768, window=(4096, 0)),
    Case("mistral-decode-b64", 64, 32, 8, 128, 1, 32768, window=(4096, 0)),
    Case("gemma2-prefill", 1, 16, 8, 256, 8192, 8192, softcap=50.0),
    Case("gemma2-window", 1, 16, 8, 256, 8192, 8192, window=(4096, 0), softcap=50.0),
    Case("gemma2-decode", 8, 16, 8, 256, 1, 8192, softcap=50.0),
    Case("gptoss-window", 1, 64, 8, 64, 8192, 8192, window=(128, 0), sinks=True),
    Case("gptoss-full", 1, 64, 8, 64, 8192, 8192, sinks=True),
    Case("gptoss-decode", 8, 64, 8, 64, 1, 8192, window=(128, 0), sinks=True),
    Case("llama4-chunk", 1, 40, 8, 128, 16384, 16384, chunk=8192),
)


def visible(case: Case, i: int, j: int) -> bool:
    """FlashAttention's rule, bottom-right aligned (core.variant)."""
    pos = i + case.nk - case.nq
    left, right = case.window
    if case.causal:
        right = 0 if right < 0 else min(right, 0)
    if left >= 0 and j < pos - left:
        return False
    if right >= 0 and j > pos + right:
        return False
    return case.chunk <= 0 or j // case.chunk == pos // case.chunk


def visible_pairs(case: Case) -> int:
    """Visible (query, key) pairs of one (batch, head): per row, the interval's length."""
    total = 0
    for i in range(case.nq):
        pos = i + case.nk - case.nq
        lo, hi = 0, case.nk
        left, right = case.window
        if case.causal:
            right = 0
        if left >= 0:
            lo = max(lo, pos - left)
        if right >= 0:
            hi = min(hi, pos + right + 1)
        if case.chunk > 0:
            start = pos - pos % case.chunk
            lo, hi = max(lo, start), min(hi, start + case.chunk)
        total += max(0, hi - lo)
    return total


def visible_kv_bytes(case: Case, elem: int) -> int:
    """The K and V bytes a decode call must read: each KV head's keys its window reaches."""
    keys = visible_pairs(case) if case.nq == 1 else case.nk
    return 2 * case.batch * case.kv_heads * keys * case.d * elem


def time_ms(fn: Callable[[], object], reps: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def time_graph_ms(fn: Callable[[], object], reps: int, calls: int = 20) -> float | None:
    """Per-call time of ``calls`` calls captured in one CUDA graph (no host work in the loop,
    as a serving engine replays decode); None when the call cannot be captured."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture stream, as torch advises
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    except Exception as exc:  # a call that cannot be captured is a result, not a stop
        log.warning("graph capture failed: %s", str(exc).splitlines()[0][:200])
        return None
    return time_ms(graph.replay, reps) / calls


def inputs(case: Case, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cuda").manual_seed(0)
    shape_q = (case.batch, case.heads, case.nq, case.d)
    shape_k = (case.batch, case.kv_heads, case.nk, case.d)
    q = torch.randn(shape_q, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(shape_k, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(shape_k, device="cuda", dtype=dtype, generator=g)
    if case.softcap > 0:  # scores within the cap's range, as FlashAttention's tests do
        q = q * (case.softcap / 4)
    sinks = torch.randn(case.heads, device="cuda", generator=g) * 2 if case.sinks else None
    return q, k, v, sinks


def run_fa2tune(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                sinks: torch.Tensor | None, plain: bool = False,
                ) -> Callable[[], torch.Tensor]:  # fmt: skip
    """fa2tune's call for the case; ``plain``: the same call with no window or chunk."""
    from fa2tune.torch import attention

    window, chunk = ((-1, -1), 0) if plain else (case.window, case.chunk)
    softcap, sink = case.softcap, sinks

    def call() -> torch.Tensor:
        out = attention(
            q, k, v, causal=case.causal, layout="bhnd", window_size=window,
            attention_chunk=chunk, softcap=softcap, sinks=sink, fallback=False,
        )  # fmt: skip
        assert isinstance(out, torch.Tensor)
        return out

    return call


def run_flex(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             sinks: torch.Tensor | None) -> Callable[[], torch.Tensor]:  # fmt: skip
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    diag = case.nk - case.nq
    left, right = case.window
    right = 0 if case.causal else right

    def mask_mod(b, h, qi, kj):  # type: ignore[no-untyped-def]
        pos = qi + diag
        ok = kj >= 0
        if left >= 0:
            ok = ok & (kj >= pos - left)
        if right >= 0:
            ok = ok & (kj <= pos + right)
        if case.chunk > 0:
            ok = ok & ((kj // case.chunk) == (pos // case.chunk))
        return ok

    cap = case.softcap

    def score_mod(score, b, h, qi, kj):  # type: ignore[no-untyped-def]
        return cap * torch.tanh(score / cap)

    torch._dynamo.reset()  # a fresh compile per case: no recompile limit, no unfused fallback
    block_mask = create_block_mask(mask_mod, None, None, case.nq, case.nk, device="cuda")
    flex = torch.compile(flex_attention)
    gqa = case.heads != case.kv_heads

    def call() -> torch.Tensor:
        out = flex(
            q, k, v, score_mod=score_mod if cap > 0 else None, block_mask=block_mask,
            enable_gqa=gqa, return_lse=sinks is not None,
        )  # fmt: skip
        if sinks is None:
            return out  # type: ignore[no-any-return]
        o, lse = out
        # The sink joins the denominator: O * l / (l + e^sink) = O * sigmoid(lse - sink).
        return o * torch.sigmoid(lse - sinks[None, :, None]).unsqueeze(-1).to(o.dtype)

    return call


def run_sdpa(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             backend: object) -> Callable[[], torch.Tensor] | None:  # fmt: skip
    if case.softcap > 0 or case.sinks:
        return None
    from torch.nn.attention import sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    i = torch.arange(case.nq, device="cuda")[:, None]
    j = torch.arange(case.nk, device="cuda")[None, :]
    pos = i + case.nk - case.nq
    left, right = case.window
    right = 0 if case.causal else right
    ok = torch.ones(case.nq, case.nk, dtype=torch.bool, device="cuda")
    if left >= 0:
        ok &= j >= pos - left
    if right >= 0:
        ok &= j <= pos + right
    if case.chunk > 0:
        ok &= (j // case.chunk) == (pos // case.chunk)
    gqa = case.heads != case.kv_heads

    def call() -> torch.Tensor:
        with sdpa_kernel([backend]):  # type: ignore[list-item]
            return sdpa(q, k, v, attn_mask=ok, enable_gqa=gqa)

    return call


def bench_case(case: Case, dtype: torch.dtype, reps: int) -> str:
    """One table row: each implementation's median time, the ratio, rate and agreement."""
    from torch.nn.attention import SDPBackend

    q, k, v, sinks = inputs(case, dtype)
    row: dict[str, float | None] = {}
    outs: dict[str, torch.Tensor] = {}
    runs: dict[str, Callable[[], Callable[[], torch.Tensor] | None]] = {
        "fa2tune": lambda: run_fa2tune(case, q, k, v, sinks),
        "causal": lambda: (
            run_fa2tune(case, q, k, v, sinks, plain=True) if masked_prefill(case) else None
        ),
        "flex": lambda: run_flex(case, q, k, v, sinks),
        "cudnn": lambda: run_sdpa(case, q, k, v, SDPBackend.CUDNN_ATTENTION),
        "efficient": lambda: run_sdpa(case, q, k, v, SDPBackend.EFFICIENT_ATTENTION),
    }
    for name, make in runs.items():
        try:
            fn = make()
            if fn is None:
                row[name] = None
                continue
            outs[name] = fn()
            row[name] = time_ms(fn, reps)
            if case.nq == 1 and name in ("fa2tune", "flex"):
                row[f"{name} graph"] = time_graph_ms(fn, reps)
        except Exception as exc:  # a backend refusing a shape is a result, not a stop
            log.warning("%s %s: %s", case.name, name, str(exc).splitlines()[0][:200])
            row[name] = None
    flops = 4.0 * case.batch * case.heads * case.d * visible_pairs(case)
    err = (
        (outs["fa2tune"].float() - outs["flex"].float()).abs().max().item()
        if "fa2tune" in outs and "flex" in outs
        else float("nan")
    )
    fa, fx = row.get("fa2tune"), row.get("flex")

    def cell(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    ratio = f"{fx / fa:.2f}x" if fa and fx else "-"
    rate = f"{flops / (fa * 1e-3) / 1e12:.0f}" if fa else "-"
    causal_ms = row.get("causal")
    vs_causal = "-"
    if fa and causal_ms:
        plain = Case(case.name, case.batch, case.heads, case.kv_heads, case.d, case.nq, case.nk,
                     softcap=case.softcap, sinks=case.sinks)  # fmt: skip
        predicted = causal_ms * visible_pairs(case) / visible_pairs(plain)
        vs_causal = f"{fa / predicted:.2f}"
    fg, xg = row.get("fa2tune graph"), row.get("flex graph")
    graph_ratio = f"{xg / fg:.2f}x" if fg and xg else "-"
    bandwidth = "-"
    if fg:  # the kernel's own rate: host work per call would hide it in a decode's few us
        bandwidth = f"{visible_kv_bytes(case, q.element_size()) / (fg * 1e-3) / 1e9:.0f}"
    cells = [case.name, cell(fa), cell(fx), cell(row.get("cudnn")), cell(row.get("efficient"))]
    extra = [ratio, rate, cell(causal_ms), vs_causal, cell(fg), cell(xg), graph_ratio,
             bandwidth, f"{err:.2e}"]  # fmt: skip
    return "| " + " | ".join([*cells, *extra]) + " |"


def masked_prefill(case: Case) -> bool:
    """A prefill whose window or chunk hides keys: its cost is set beside plain causal's."""
    return case.nq > 1 and case.causal and (case.window[0] >= 0 or case.chunk > 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    parser.add_argument("--only", default="", help="comma-separated case name prefixes")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    wanted = [w for w in args.only.split(",") if w]
    gpu = torch.cuda.get_device_name()
    print(f"{gpu}, torch {torch.__version__}, CUDA {torch.version.cuda}, {args.dtype}, "
          f"median of {args.reps} (ms)")  # fmt: skip
    print("| case | fa2tune | flex | sdpa cudnn | sdpa efficient | flex / fa2tune | "
          "TFLOP/s (visible) | fa2tune causal | vs causal rate | fa2tune graph | flex graph | "
          "flex / fa2tune graphed | GB/s visible (graph) | max err vs flex |")  # fmt: skip
    print("|---|" + "---:|" * 13)
    for case in CASES:
        if not wanted or any(case.name.startswith(w) for w in wanted):
            print(bench_case(case, dtype, args.reps), flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
