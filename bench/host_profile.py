"""Where an eager decode call's host time goes: a profile of steady-state calls.

Runs ``fa2tune.torch.attention_with_kvcache`` (attend only, and append-and-attend) and
``fa2tune.torch.attention`` (dense decode) in a loop past their first call, times the loop
with the profiler off (median µs per call of several loops, not synchronised, as
bench/kvcache_bench.py does), then runs it again under :mod:`cProfile` and writes the
functions with the most time of their own. The profile inflates every Python call, so read it
for where the time goes, and the unprofiled figure for how much there is::

    PYTHONPATH=$PWD python bench/host_profile.py --out out
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import pstats
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("host_profile")


def _per_call_us(fn: Callable[[], object], calls: int, loops: int) -> float:
    """Median over ``loops`` of the host µs per call of ``calls`` back-to-back calls."""
    out = []
    for _ in range(loops):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(out)


def _profile(fn: Callable[[], object], calls: int, top: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text).strip_dirs().sort_stats("tottime")
    stats.print_stats(top)
    return text.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--loops", type=int, default=7)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    import torch

    import fa2tune.torch as ft
    from fa2tune.ops import kvcache

    dev = torch.device("cuda")
    b, hq, hkv, d, cap = 8, 32, 8, 128, 8192
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(b, 1, hq, d, device=dev, dtype=torch.bfloat16, generator=g)
    kc = torch.randn(b, cap, hkv, d, device=dev, dtype=torch.bfloat16, generator=g)
    vc = torch.randn_like(kc)
    kn = torch.randn(b, 1, hkv, d, device=dev, dtype=torch.bfloat16, generator=g)
    vn = torch.randn_like(kn)
    lens = torch.full((b,), 4096, device=dev, dtype=torch.int32)
    k_dense, v_dense = kc[:, :4096], vc[:, :4096]

    def attend() -> object:
        return ft.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True)

    def append_attend() -> object:
        o = ft.attention_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, causal=True)
        lens.sub_(0)  # a device op per step, as a loop's lens += 1 (kept at 4096 here)
        return o

    def dense() -> object:
        return ft.attention(q, k_dense, v_dense, causal=True)

    def empty() -> object:
        return torch.empty_like(q)

    cases = {"attend": attend, "append_attend": append_attend, "dense": dense,
             "torch.empty_like": empty}  # fmt: skip
    results: dict[str, Any] = {"shape": f"B={b} {hq}:{hkv} D={d} cache {cap}, 4096 keys"}
    for fn in cases.values():  # first calls: decisions, builds, loads
        fn()
    torch.cuda.synchronize()
    for name, fn in cases.items():
        us = _per_call_us(fn, args.calls, args.loops)
        torch.cuda.synchronize()
        results[name] = round(us, 2)
        log.info("%s: %.2f µs per call", name, us)
    decisions = list(kvcache._decisions.values())
    results["cache_kernel"] = getattr(getattr(decisions[0].entry, "config", None), "name", None)
    profiles = {name: _profile(cases[name], args.calls, args.top)
                for name in ("attend", "dense")}  # fmt: skip
    torch.cuda.synchronize()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_profile.json").write_text(json.dumps(results, indent=1) + "\n")
    text = "".join(f"==== {name} ({args.calls} calls, profiled)\n{p}\n"
                   for name, p in profiles.items())  # fmt: skip
    (args.out / "host_profile.txt").write_text(text)
    log.info("%s", json.dumps(results))


if __name__ == "__main__":
    main()
