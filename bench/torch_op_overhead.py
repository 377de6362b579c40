"""Per-call host overhead of ``fa2tune.torch`` over a bare ``cuLaunchKernel`` loop.

For a tiny call (default B=1, H=1, N=128, D=64, fp16: the GPU finishes each kernel in a few
µs, so host time is what is measured) and each family the op launches without extra host
preparation (fa2: split-Q; splitkv: Nq=1, Nk=N, with its workspace), it times host time per
call of:

* ``bare``: a :class:`measure.loader.BoundLaunch` called in a loop (one ``cuLaunchKernel``
  through cuda-bindings, everything prepared): the floor;
* ``launcher``: the op's :class:`fa2tune.ops.kernels.Launcher` on preallocated outputs
  (pointer patching, stride-pattern lookup, split-KV workspace);
* ``attention``: ``fa2tune.torch.attention`` eagerly (decision lookup, output allocation,
  launch): what a model pays; ``overhead`` is this minus ``bare`` (target: at most 10 µs);
* ``op``: ``torch.ops.fa2tune.attention`` (the dispatcher's custom-op path, as traced code
  calls it outside a CUDA graph);
* ``graph``: one call captured in a CUDA graph, replayed (``graph.replay()``: no fa2tune
  Python runs per call);
* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` on the same tensors.

Each figure is the median over ``--reps`` loops of ``--calls`` calls, host time only (the loop
is timed without synchronising; the GPU queue is drained between loops and ``--calls`` stays
well under the launch queue's depth so the host never waits for the GPU).

The decision for each family is pinned (the op's decision cache gets that family's launcher),
so the choice rule does not decide which family is timed. Needs torch, cuda-bindings, a GPU
of sm_80+ and nvcc (first build). Run from the repository root::

    PYTHONPATH=$PWD python bench/torch_op_overhead.py [--n 128 --d 64 --calls 200 --reps 30]

``--growing STEPS`` also runs a decode loop the way a server does (B=8, 32 query heads over 8
KV heads, D=128, bf16, causal, the store's real choice, nothing pinned): K and V are slices of
one preallocated cache, one key longer each step from 4096, so every step is a new shape; it
prints the host time of the first step (the group's store read and the kernel load), of the
later new-shape steps (a match in memory and a launcher for the shape), and of the same
lengths again (each a cached decision).

``--breakdown`` also times, alone, each piece of host work the eager path does per call
(no GPU work; where the microseconds between ``launcher`` and ``attention`` go).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("torch_op_overhead")


def host_us(fn: Callable[[], object], calls: int, reps: int) -> float:
    """Median host time per call of ``fn`` in µs (loops of ``calls``, drained in between)."""
    import torch

    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def _case(family: str, n: int, d: int, dtype: Any) -> tuple[Any, tuple[int, ...]]:
    """The config and (batch, heads, kv_heads, nq, nk) timed for ``family``."""
    from codegen.families.fa2.space import fa2_default_config
    from codegen.families.splitkv.space import default_config as splitkv_default

    name = "fp16" if str(dtype) == "torch.float16" else "bf16"
    if family == "fa2":
        return fa2_default_config(d, name, False), (1, 1, 1, n, n)
    return splitkv_default(d, name, False), (1, 1, 1, 1, n)


def measure(family: str, n: int, d: int, calls: int, reps: int) -> dict[str, float]:
    import torch

    from core.shape import Shape
    from fa2tune.ops import torch_op
    from fa2tune.ops.kernels import Launcher, current_stream, device_info, load_kernel
    from fa2tune.torch import attention

    dtype = torch.float16
    config, (b, h, hkv, nq, nk) = _case(family, n, d, dtype)
    q = torch.randn(b, nq, h, d, device="cuda", dtype=dtype)
    k = torch.randn(b, nk, hkv, d, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    o = torch.empty_like(q)
    scale = d**-0.5
    device = device_info(0)
    kernel = load_kernel(config, device)
    shape = Shape(nq, nk, b, h, hkv)
    launcher = Launcher(kernel, config, "pinned", shape)
    # Pin the decision: the op's cache key, as torch_op.forward builds it.
    key = (q.device, q.dtype, q.shape, k.shape, False, "bnhd")
    torch_op._decisions[key] = launcher

    stream = current_stream(q.device)
    if family == "splitkv":
        from codegen.families.splitkv.host import splitkv_workspace

        extra = splitkv_workspace(config, q, k, v, "bnhd")
        from measure.params import make_params

        bound: Callable[[], None] = kernel.bind(
            make_params(q, k, v, o, None, scale, "bnhd"), launcher._grid, launcher._block,
            config.smem_bytes, stream, extra,
        )  # fmt: skip
    else:
        bound = kernel.bind_config(config, q, k, v, o, None, scale, "bnhd", stream)

    out = attention(q, k, v)  # a check that the pinned launcher runs and is right
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    ).transpose(1, 2)
    err = float((out.float() - ref.float()).abs().max())
    if err > 2e-2:
        raise SystemExit(f"{config.name}: max error {err} against SDPA")

    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        attention(q, k, v)  # warm on the capture stream
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        attention(q, k, v)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

    def op() -> object:
        return torch.ops.fa2tune.attention(q, k, v, False, scale, "bnhd", False, True)

    row = {
        "bare": host_us(bound, calls, reps),
        "launcher": host_us(lambda: launcher(q, k, v, o, None, scale, "bnhd"), calls, reps),
        "attention": host_us(lambda: attention(q, k, v), calls, reps),
        "op": host_us(op, calls, reps),
        "graph": host_us(graph.replay, calls, reps),
        "sdpa": host_us(
            lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt), calls, reps
        ),
    }
    row["overhead"] = row["attention"] - row["bare"]
    log.info("%s: %s", config.name, row)
    return row


def breakdown(n: int, d: int, calls: int, reps: int) -> dict[str, float]:
    """Host time (µs) of each piece of the eager path's per-call work, timed alone."""
    import torch

    from fa2tune.ops import torch_op
    from fa2tune.ops.kernels import current_stream

    q = torch.randn(1, n, 1, d, device="cuda", dtype=torch.float16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    key = (q.device, q.dtype, q.shape, k.shape, False, "bnhd")
    table = {key: None}
    current = torch_op.current_device_index
    pieces: dict[str, Callable[[], object]] = {
        "q.new_empty(q.shape)": lambda: q.new_empty(q.shape),
        "torch.empty_like(q)": lambda: torch.empty_like(q),
        "decision key": lambda: (q.device, q.dtype, q.shape, k.shape, False, "bnhd"),
        "key + dict lookup": lambda: table.get(
            (q.device, q.dtype, q.shape, k.shape, False, "bnhd")
        ),
        "torch.compiler.is_compiling()": torch.compiler.is_compiling,
        "grad checks": lambda: (
            torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        ),
        "current device": current,
        "current stream": lambda: current_stream(q.device),
        "4 data_ptr()": lambda: (q.data_ptr(), k.data_ptr(), v.data_ptr(), q.data_ptr()),
        "3 stride()": lambda: (q.stride(), k.stride(), v.stride()),
        "empty call (floor)": lambda: None,
    }
    return {name: host_us(fn, calls, reps) for name, fn in pieces.items()}


def growing(steps: int, start: int = 4096, reread: bool = False) -> dict[str, float]:
    """Host µs per call of a decode loop over growing lengths (see the module doc);
    ``reread``: the store read again for every new shape, as the op did before it kept each
    group's candidates (the same lookup rule and SQL: the baseline in the same run)."""
    import torch

    from fa2tune.ops import choice, torch_op
    from fa2tune.torch import attention

    keep = choice.candidates_of
    if reread:

        def candidates_of(store: Any, call: Any) -> Any:
            choice.forget_results()
            return keep(store, call)

        choice.candidates_of = candidates_of  # type: ignore[assignment]

    g = torch.Generator(device="cuda").manual_seed(0)
    b, h, hk, d = 8, 32, 8, 128
    q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    cache = [torch.randn(b, start + steps, hk, d, device="cuda", dtype=torch.bfloat16,
                         generator=g) for _ in range(2)]  # fmt: skip
    torch_op.clear_caches()

    def loop() -> list[float]:
        times = []
        for i in range(steps):
            nk = start + i
            t0 = time.perf_counter()
            attention(q, cache[0][:, :nk], cache[1][:, :nk], causal=True, fallback=False)
            times.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        return times

    try:
        first = loop()
        again = loop()
    finally:
        choice.candidates_of = keep  # type: ignore[assignment]
    return {
        "first step": first[0],
        "new shape (median)": statistics.median(first[1:]),
        "new shape (p90)": statistics.quantiles(first[1:], n=10)[-1],
        "same shape again (median)": statistics.median(again),
        "decisions kept": float(len(torch_op._decisions)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=128, help="sequence length (splitkv: Nk)")
    parser.add_argument("--d", type=int, default=64, help="head dim")
    parser.add_argument("--calls", type=int, default=200, help="calls per timed loop")
    parser.add_argument("--reps", type=int, default=30, help="timed loops (median)")
    parser.add_argument("--family", default="fa2,splitkv", help="families to time, comma-separated")
    parser.add_argument("--breakdown", action="store_true", help="time each per-call piece")
    parser.add_argument("--growing", type=int, default=0, metavar="STEPS",
                        help="also time a decode loop over STEPS growing lengths")  # fmt: skip
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

    import torch

    cols = ("bare", "launcher", "attention", "overhead", "op", "graph", "sdpa")
    rows = {
        family: measure(family, args.n, args.d, args.calls, args.reps)
        for family in args.family.split(",")
    }
    print(f"\nhost time per call (µs), B=1 H=1 N={args.n} D={args.d} fp16, "
          f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}")  # fmt: skip
    print("| family | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for family, row in rows.items():
        print(f"| {family} | " + " | ".join(f"{row[c]:.1f}" for c in cols) + " |")
    if args.breakdown:
        print("\n| per-call piece, timed alone | µs |\n|---|---:|")
        for name, us in breakdown(args.n, args.d, args.calls, args.reps).items():
            print(f"| {name} | {us:.2f} |")
    if args.growing:
        print(f"\n| decode loop over {args.growing} growing lengths (B=8, 32:8, D=128, bf16) | "
              "µs |\n|---|---:|")  # fmt: skip
        for reread in (True, False):
            label = "store read per new shape (before)" if reread else "group read once (now)"
            for name, us in growing(args.growing, reread=reread).items():
                print(f"| {label}: {name} | {us:.1f} |")
    worst = max(row["overhead"] for row in rows.values())
    print(f"\nworst overhead over a bare launch: {worst:.1f} µs (target: at most 10 µs)")


if __name__ == "__main__":
    main()
