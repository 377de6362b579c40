"""KV-cache decode: the split-KV cache kernels against the contiguous op and torch SDPA, in
one run, plus the host time a decode step costs.

For each decode shape (Nq = 1, GQA, bf16, every sequence at ``n`` keys so that a dense call
computes the same thing) it times, on the same K/V values:

* ``cache`` / ``paged16`` / ``paged256``: ``fa2tune.torch.attention_with_kvcache`` on a
  contiguous cache and on the same keys in pages of 16 and 256 (pages in a random order),
  lengths on the device (the cache kernel on the tile the shipped results give the dense
  call at the cache's capacity, :mod:`fa2tune.ops.cache_choice`);
* ``dense``: ``fa2tune.torch.attention`` on the dense K/V (the shipped tuned choice);
* ``flash``, ``efficient``, ``cudnn``: torch SDPA's backends on the dense K/V (``enable_gqa``).

GPU time per call: CUDA events around one call after an L2 flush (a 256 MB write), median
of ``--reps``; outputs checked against SDPA's before any time counts (fresh random inputs,
outputs poisoned with NaN first). Bandwidth is K and V bytes over time. Then the host side:
eager ``attention_with_kvcache`` calls over growing lengths (one appended key per call, the
lengths never read on the host), host time per call (median of loops of ``--calls`` calls,
not synchronised) next to a bare ``cuLaunchKernel`` of the same kernel, and the
``lens.add_(1)`` each appending step of the loop also makes (a torch op, timed alone).

Writes ``kvcache_bench.json`` and prints a table::

    PYTHONPATH=$PWD python bench/kvcache_bench.py --out docs/measurements/kvcache
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import statistics
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("kvcache_bench")
H200_PEAK_BYTES_PER_S = 4.8e12

SHAPES = [  # (batch, q heads, kv heads, head dim, keys per sequence)
    (8, 32, 8, 128, 4096),
    (8, 32, 8, 128, 16384),
    (64, 32, 8, 128, 4096),
    (64, 32, 8, 128, 16384),
    (16, 64, 8, 64, 8192),
]


def _gpu_us(torch: Any, fn: Any, reps: int, flush: Any) -> float:
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        flush.zero_()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def _paged(torch: Any, dense: Any, page: int, order: Any) -> Any:
    """``dense`` [B, N, H, D] as pages of ``page`` keys: its i-th block of ``page`` keys (in
    batch-major order) goes to page ``order[i]``."""
    b, n, h, d = dense.shape
    pages = torch.empty(b * (n // page), page, h, d, device=dense.device, dtype=dense.dtype)
    pages[order] = dense.reshape(b * (n // page), page, h, d)
    return pages


def bench_shape(torch: Any, shape: tuple[int, ...], reps: int, flush: Any) -> dict[str, Any]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from fa2tune.torch import attention, attention_with_kvcache

    b, hq, hkv, d, n = shape
    dt_ = torch.bfloat16
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=dt_)
    k = torch.randn(b, n, hkv, d, device="cuda", dtype=dt_)
    v = torch.randn(b, n, hkv, d, device="cuda", dtype=dt_)
    lens = torch.full((b,), n, dtype=torch.int32, device="cuda")
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    ref = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True)
    ref = ref.transpose(1, 2)
    calls: dict[str, Any] = {
        "cache": lambda: attention_with_kvcache(q, k, v, cache_seqlens=lens, fallback=False),
        "dense": lambda: attention(q, k, v, fallback=False),
    }
    for page in (16, 256):
        order = torch.randperm(b * (n // page), device="cuda")  # pages in any order
        pk, pv = _paged(torch, k, page, order), _paged(torch, v, page, order)
        table = order.view(b, n // page).to(torch.int32)
        calls[f"paged{page}"] = (lambda pk=pk, pv=pv, table=table: attention_with_kvcache(
            q, pk, pv, cache_seqlens=lens, page_table=table, fallback=False))  # fmt: skip
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION}  # fmt: skip
    for name, backend in backends.items():

        def sdpa(backend: Any = backend) -> Any:
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(
                    qh, kh, vh, enable_gqa=True).transpose(1, 2)  # fmt: skip

        calls[name] = sdpa
    row: dict[str, Any] = {"shape": dict(zip(("batch", "heads", "kv_heads", "d", "n"), shape,
                                             strict=True))}  # fmt: skip
    bytes_kv = 2 * b * n * hkv * d * 2
    for name, fn in calls.items():
        torch.cuda.empty_cache()
        try:
            junk = torch.full((q.numel() * 4,), float("nan"), device="cuda", dtype=dt_)
            del junk  # poisons the allocator's next block
            out = fn()
            err = (out.float() - ref.float()).abs().max().item()
            if not math.isfinite(err) or err > 2e-2:
                row[name] = {"error": f"wrong result: max |O - SDPA| = {err:.3g}"}
                continue
            us = _gpu_us(torch, fn, reps, flush)
        except Exception as exc:
            row[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            continue
        row[name] = {"us": round(us, 2), "tb_s": round(bytes_kv / us / 1e6, 3),
                     "of_peak": round(bytes_kv / us / 1e-6 / H200_PEAK_BYTES_PER_S, 3),
                     "max_err": err}  # fmt: skip
    best_sdpa = min((row[x]["us"] for x in backends if "us" in row[x]), default=None)
    for name in ("cache", "paged16", "paged256", "dense"):
        if "us" in row[name] and best_sdpa:
            row[name]["vs_best_sdpa"] = round(best_sdpa / row[name]["us"], 3)
    return row


def host_times(torch: Any, calls: int, loops: int) -> dict[str, float]:
    """Host µs per eager decode step (append one key, attend; lengths on the device) and per
    bare launch of the same kernel."""
    from fa2tune.ops import kvcache
    from fa2tune.torch import attention_with_kvcache

    b, hq, hkv, d, page = 8, 32, 8, 128, 16
    per = 8192 // page
    kc = torch.randn(b * per, page, hkv, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    table = torch.randperm(b * per, device="cuda").view(b, per).to(torch.int32)
    lens = torch.full((b,), 1000, dtype=torch.int32, device="cuda")
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
    kn = torch.randn(b, 1, hkv, d, device="cuda", dtype=torch.bfloat16)
    vn = torch.randn_like(kn)

    def step(append: bool) -> None:
        attention_with_kvcache(q, kc, vc, kn if append else None, vn if append else None,
                               cache_seqlens=lens, page_table=table, causal=True,
                               fallback=False)  # fmt: skip

    def per_call(fn: Any) -> float:
        samples = []
        for _ in range(loops):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            samples.append((time.perf_counter() - t0) / calls * 1e6)
            lens.fill_(1000)  # keep the loop inside the cache
        return statistics.median(samples)

    kvcache.clear_cache_decisions()  # this loop's decision alone, found below
    step(False)
    torch.cuda.synchronize()
    decision = next(d for d in kvcache._decisions.values() if not isinstance(d.entry, str))
    pattern = next(iter(decision.entry._patterns.values()))
    bound, _ = next(iter(pattern.bound.values()))  # the attention's bound launch
    out = torch.empty_like(q)  # the bare loop's output: alive for the whole loop
    pattern.params.o, pattern.params.lse = out.data_ptr(), None
    bare_us = per_call(bound)
    attend_us = per_call(lambda: step(False))
    lens_add_us = per_call(lambda: lens.add_(1))
    return {
        "bare_launch_us": round(bare_us, 2),
        "attend_us": round(attend_us, 2),
        "attend_over_bare_us": round(attend_us - bare_us, 2),
        # each step also bumps the lengths (a torch op), timed alone beside it
        "append_and_attend_us": round(per_call(lambda: (step(True), lens.add_(1))), 2),
        "lens_add_us": round(lens_add_us, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--loops", type=int, default=20)
    parser.add_argument("--host-only", action="store_true",
                        help="time the host side only (no decode shapes)")  # fmt: skip
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    import torch

    from fa2tune.torch import autotune

    autotune("cached")  # the shipped results: the dense op's tuned choice, the cache's tile
    torch.manual_seed(0)
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device="cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for shape in () if args.host_only else SHAPES:
        rows.append(bench_shape(torch, shape, args.reps, flush))
        (args.out / "kvcache_bench.json").write_text(json.dumps({"rows": rows}, indent=1))
    host = host_times(torch, args.calls, args.loops)
    report = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
        "rows": rows, "host": host,
    }  # fmt: skip
    (args.out / "kvcache_bench.json").write_text(json.dumps(report, indent=1) + "\n")
    names = ("cache", "paged16", "paged256", "dense", "flash", "efficient", "cudnn")
    log.info("%-22s %s", "shape", "  ".join(f"{n:>10}" for n in names))
    for row in rows:
        s = row["shape"]
        label = f"B{s['batch']} {s['heads']}:{s['kv_heads']} d{s['d']} N{s['n']}"
        cells = [f"{row[n]['us']:>8.1f}us" if "us" in row[n] else f"{'err':>10}" for n in names]
        log.info("%-22s %s", label, "  ".join(cells))
    log.info("host per call: %s", host)


if __name__ == "__main__":
    main()
