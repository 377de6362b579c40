"""Build, verify and time fa3 (Hopper wgmma/TMA) kernels on a local sm_90 GPU.

Stages (each a sub-command; bench/h200/fa3_check.sh runs each in its own process, so a
kernel fault in one cannot poison the others):

  micro    the building blocks alone (bench/hopper/fa3_micro.cu): TMA + 128B swizzle,
           S = Q K^T through K-major descriptors, O = P V through the N-major V descriptor
           with P from registers and from shared memory; exact fp32 comparisons.
  correct  every config of a set against the float32 reference over many shapes (tails,
           N = 1, Nq != Nk both ways, causal, GQA 32:8, MQA, bnhd and bhnd, LSE) with the
           product's rule (restated in fa3_ref.py: NaN-poisoned outputs, dead rows exactly
           0 / -inf, error <= max(2 x SDPA flash's error on the same inputs, floor)); fresh
           random inputs for every check.
  perf     TFLOP/s of configs against torch SDPA flash and cuDNN on the same inputs (CUDA
           events, warm-up, L2 flushed before every timed launch, median), outputs verified.

Everything is written as JSON under --out; a table is printed last.
Run from the repository root: ``python3 bench/hopper/fa3_check.py correct --set main``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fa3_host import (
    BuildResult,
    Fa3Config,
    Fa3Kernel,
    call,
    compile_config,
    compile_source,
    driver,
    encode_tensor_map,
    ensure_context,
    invalid_reasons,
)
from fa3_ref import Shape, check, make_inputs, poison, sdpa_callable, time_ms

GPU = "H200"


# ------------------------------------------------------------------------------------------
# Config sets


def main_configs() -> list[Fa3Config]:
    """The first config of step 1: D=128 non-causal, 128x128, 2 stages (RS, overlap, ping-pong)."""
    return [Fa3Config(128, "fp16")]


def feature_configs() -> list[Fa3Config]:
    """Every switch of the template at least once, both dtypes, causal, D 64/128/256."""
    cs: list[Fa3Config] = []
    for causal in (False, True):
        cs += [
            Fa3Config(128, "fp16", causal),
            Fa3Config(128, "bf16", causal),
            Fa3Config(128, "fp16", causal, pv_regs=False),
            Fa3Config(128, "fp16", causal, overlap=False, pingpong=False),
            Fa3Config(128, "fp16", causal, overlap=False, pingpong=True),
            Fa3Config(128, "fp16", causal, overlap=True, pingpong=False),
            Fa3Config(128, "fp16", causal, block_n=176),
            Fa3Config(128, "bf16", causal, block_m=192, block_n=128, pv_regs=False,
                      pingpong=False, consumer_regs=160),
            Fa3Config(128, "fp16", causal, block_m=64, block_n=128, pingpong=False,
                      consumer_regs=240, stages=3),
            Fa3Config(64, "fp16", causal, block_m=192, block_n=128, pv_regs=False,
                      pingpong=False, consumer_regs=160),
            Fa3Config(64, "bf16", causal, block_m=128, block_n=128, stages=4),
            Fa3Config(256, "fp16", causal, block_m=128, block_n=80),
            Fa3Config(256, "bf16", causal, block_m=128, block_n=64, pv_regs=False),
            Fa3Config(96, "fp16", causal, block_m=128, block_n=128),
        ]
    return cs


def perf_configs() -> list[Fa3Config]:
    cs: list[Fa3Config] = []
    for dt in ("fp16", "bf16"):
        for causal in (False, True):
            cs += [
                Fa3Config(128, dt, causal, block_n=128),
                Fa3Config(128, dt, causal, block_n=176),
                Fa3Config(128, dt, causal, block_n=128, overlap=False),
                Fa3Config(128, dt, causal, block_n=128, pingpong=False),
                Fa3Config(128, dt, causal, block_n=128, pv_regs=False),
            ]
    cs += [
        Fa3Config(64, "fp16", False, block_m=192, block_n=128, pv_regs=False, pingpong=False,
                  consumer_regs=160),
        Fa3Config(64, "fp16", False, block_m=128, block_n=128, stages=3),
        Fa3Config(256, "fp16", False, block_m=128, block_n=80),
    ]
    return cs


def sweep_configs() -> list[Fa3Config]:
    """Tile shapes, stage counts and switches around the step-1 config (second device run)."""
    cs: list[Fa3Config] = []
    for dt in ("fp16", "bf16"):
        cs += [Fa3Config(128, dt, block_n=bn, stages=st)
               for bn, st in ((128, 2), (128, 3), (112, 3), (144, 2), (160, 2), (176, 2), (192, 2))]
        cs += [Fa3Config(128, dt, block_n=176, pingpong=False),
               Fa3Config(128, dt, block_m=192, block_n=128, pv_regs=False, pingpong=False,
                         consumer_regs=160)]
    cs += [Fa3Config(128, "fp16", True, block_n=bn, stages=st)
           for bn, st in ((128, 2), (128, 3), (176, 2), (192, 2))]
    cs += [
        Fa3Config(64, "fp16", block_n=192),
        Fa3Config(64, "fp16", block_n=176, stages=3),
        Fa3Config(64, "fp16", block_m=192, block_n=128, pingpong=False, consumer_regs=160),
        Fa3Config(64, "fp16", block_m=192, block_n=160, pv_regs=False, pingpong=False,
                  consumer_regs=160),
        Fa3Config(64, "fp16", block_m=192, block_n=192, pv_regs=False, pingpong=False,
                  consumer_regs=160),
        Fa3Config(256, "fp16", block_n=80),
        Fa3Config(256, "fp16", block_n=64),
    ]
    return cs


SETS = {"main": main_configs, "features": feature_configs, "perf": perf_configs,
        "sweep": sweep_configs}


# ------------------------------------------------------------------------------------------
# Building


def build_all(configs: list[Fa3Config], workdir: Path, jobs: int) -> dict[str, BuildResult]:
    """Compile configs in parallel (nvcc processes); returns results by config name."""
    for c in configs:
        why = invalid_reasons(c)
        if why:
            raise ValueError(f"{c.name} is outside the space: {why}")
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(lambda c: compile_config(c, workdir), configs))
    return {r.config.name: r for r in results}


# ------------------------------------------------------------------------------------------
# Correctness


@dataclass(frozen=True)
class Case:
    batch: int
    heads: int
    kv_heads: int
    nq: int
    nk: int
    layout: str


CASES: tuple[Case, ...] = (
    Case(2, 4, 4, 512, 512, "bnhd"),
    Case(1, 2, 2, 1, 1, "bnhd"),
    Case(1, 3, 3, 77, 77, "bhnd"),
    Case(2, 2, 2, 300, 1000, "bnhd"),
    Case(2, 2, 2, 1000, 300, "bhnd"),
    Case(1, 32, 8, 257, 257, "bnhd"),
    Case(1, 8, 1, 200, 129, "bhnd"),
    Case(1, 2, 2, 1, 333, "bnhd"),
    Case(1, 2, 2, 333, 1, "bhnd"),
    Case(1, 4, 2, 2048, 2048, "bhnd"),
)


def check_case(kernel: Fa3Kernel, case: Case) -> dict[str, Any]:
    """Fresh inputs, reference, SDPA yardstick; run ``kernel`` once; the verdict of fa3_ref."""
    import torch

    c = kernel.config
    shape = Shape(c.d, case.nq, case.nk, case.batch, case.heads, case.kv_heads, c.dtype,
                  c.causal)
    inputs = make_inputs(shape, case.layout)
    o, lse = inputs.outputs()
    poison(o, lse)
    kernel(inputs.q, inputs.k, inputs.v, o, lse, inputs.scale, case.layout)
    torch.cuda.synchronize()
    res = check(o, lse, inputs)
    return {
        "config": c.name,
        "case": case.__dict__,
        "ok": bool(res.ok),
        "max_abs_err": res.max_abs_err,
        "rel_err": res.rel_err,
        "tol": res.tol,
        "sdpa_err": inputs.sdpa_err,
        "message": res.message,
        "seed": inputs.seed,
    }


def run_correct(configs: list[Fa3Config], builds: dict[str, BuildResult]) -> list[dict]:
    ensure_context(0)
    rows: list[dict] = []
    for c in configs:
        b = builds[c.name]
        if not b.ok or b.cubin is None:
            rows.append({"config": c.name, "ok": False, "message": "build failed"})
            print(f"BUILD FAIL {c.name}\n{b.log[-2000:]}", flush=True)
            continue
        kernel = Fa3Kernel(c, b.cubin)
        for case in CASES:
            if case.heads % case.kv_heads:
                continue
            try:
                r = check_case(kernel, case)
            except Exception as exc:  # a refused launch or bad descriptor: record, go on
                r = {"config": c.name, "case": case.__dict__, "ok": False,
                     "message": f"{type(exc).__name__}: {exc}"}
            rows.append(r)
            flag = "ok  " if r["ok"] else "FAIL"
            print(f"{flag} {c.name} {case} err={r.get('max_abs_err', float('nan')):.2e} "
                  f"tol={r.get('tol', float('nan')):.2e} {r['message'][:160]}", flush=True)
        kernel.unload()
    return rows


# ------------------------------------------------------------------------------------------
# Timing


def time_fn(fn: Any) -> float:
    """Median ms of ``fn`` (CUDA events, warm-up, L2 flushed before each timed call)."""
    return time_ms(fn)[0]


def run_perf(configs: list[Fa3Config], builds: dict[str, BuildResult], ns: list[int],
             batch: int, heads: int) -> list[dict]:
    import torch

    ensure_context(0)
    rows: list[dict] = []
    groups: dict[tuple, list[Fa3Config]] = {}
    for c in configs:
        groups.setdefault((c.d, c.dtype, c.causal), []).append(c)
    for (d, dtype, causal), cs in groups.items():
        for n in ns:
            problem = Shape(d, n, n, batch, heads, heads, dtype, causal)
            inputs = make_inputs(problem, "bnhd")
            qb, kb, vb = inputs.bhnd()
            base: dict[str, float | None] = {}
            for backend in ("flash", "cudnn"):
                try:
                    fn = sdpa_callable(qb, kb, vb, causal, inputs.scale, backend)
                    base[backend] = time_fn(fn)
                except RuntimeError as exc:
                    print(f"sdpa {backend} unsupported: {exc}", flush=True)
                    base[backend] = None
            for c in cs:
                b = builds[c.name]
                if not b.ok or b.cubin is None:
                    continue
                kernel = Fa3Kernel(c, b.cubin)
                o, lse = inputs.outputs()
                poison(o, lse)
                launch = kernel.bind(inputs.q, inputs.k, inputs.v, o, lse, inputs.scale, "bnhd")
                launch()
                torch.cuda.synchronize()
                res = check(o, lse, inputs)
                ms = time_fn(launch)
                tf = problem.flops / (ms * 1e-3) / 1e12
                row = {
                    "config": c.name, "d": d, "dtype": dtype, "causal": causal, "n": n,
                    "batch": batch, "heads": heads, "ms": ms, "tflops": tf, "ok": bool(res.ok),
                    "max_abs_err": res.max_abs_err,
                    "flash_tflops": problem.flops / (base["flash"] * 1e-3) / 1e12
                    if base["flash"] else None,
                    "cudnn_tflops": problem.flops / (base["cudnn"] * 1e-3) / 1e12
                    if base["cudnn"] else None,
                    "regs": b.regs, "spill_stores": b.spill_stores,
                }
                rows.append(row)
                print(f"{c.name:60s} n={n:5d} {tf:6.1f} TF/s  flash "
                      f"{row['flash_tflops'] or float('nan'):6.1f}  cudnn "
                      f"{row['cudnn_tflops'] or float('nan'):6.1f}  ok={res.ok}", flush=True)
                kernel.unload()
            del inputs
            torch.cuda.empty_cache()
    return rows


def perf_table(rows: list[dict]) -> str:
    lines = [f"{'config':58s} {'N':>5s} {'TF/s':>6s} {'flash':>6s} {'cudnn':>6s} "
             f"{'x fl':>5s} {'x cu':>5s} ok"]
    for r in rows:
        fl, cu = r["flash_tflops"], r["cudnn_tflops"]
        lines.append(
            f"{r['config']:58s} {r['n']:5d} {r['tflops']:6.1f} {fl or math.nan:6.1f} "
            f"{cu or math.nan:6.1f} {r['tflops'] / fl if fl else math.nan:5.2f} "
            f"{r['tflops'] / cu if cu else math.nan:5.2f} {'y' if r['ok'] else 'N'}"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# Micro-tests


def run_micro(workdir: Path) -> list[dict]:
    import ctypes

    import torch

    ensure_context(0)
    cu = driver()
    src = (Path(__file__).resolve().parent / "fa3_micro.cu").read_text()
    rows = []
    for d, bn in ((128, 128), (64, 176), (256, 80), (96, 64)):
        name = f"micro_d{d}_n{bn}"
        ok, cubin, secs, log = compile_source(src, name, workdir,
                                              extra=(f"-DMICRO_D={d}", f"-DMICRO_BN={bn}"))
        if not ok:
            rows.append({"name": name, "ok": False, "log": log[-1500:]})
            print(f"micro {name}: BUILD FAIL\n{log[-1500:]}", flush=True)
            continue
        img = cubin.read_bytes()
        buf = ctypes.create_string_buffer(img, len(img))
        mod = call("cuModuleLoadData", ctypes.addressof(buf))
        fn = call("cuModuleGetFunction", mod, b"fa3_micro")
        smem = 1024 + 128 * math.ceil(d / 64) * (64 + 2 * bn) + math.ceil(bn / 64) * 8192 + 64
        call("cuFuncSetAttribute", fn,
             cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
        g = torch.Generator(device="cuda").manual_seed(1234 + d)
        q = torch.randn(1, 64, 1, d, device="cuda", dtype=torch.float16, generator=g)
        k = torch.randn(1, bn, 1, d, device="cuda", dtype=torch.float16, generator=g)
        v = torch.randn(1, bn, 1, d, device="cuda", dtype=torch.float16, generator=g)
        p = torch.rand(64, bn, device="cuda", dtype=torch.float16, generator=g)
        s_out = torch.full((64, bn), math.nan, device="cuda")
        o_rs = torch.full((64, d), math.nan, device="cuda")
        o_ss = torch.full((64, d), math.nan, device="cuda")
        sm = torch.zeros(1, dtype=torch.int32, device="cuda")
        maps = [encode_tensor_map(q, "bnhd", 64), encode_tensor_map(k, "bnhd", bn),
                encode_tensor_map(v, "bnhd", bn)]
        ptrs = [ctypes.c_uint64(t.data_ptr()) for t in (s_out, p, o_rs, o_ss, sm)]
        args = (ctypes.c_void_p * 8)(*(int(m.getPtr()) for m in maps),
                                     *(ctypes.addressof(x) for x in ptrs))
        stream = cu.CUstream(torch.cuda.current_stream().cuda_stream)
        call("cuLaunchKernel", fn, 1, 1, 1, 128, 1, 1, smem, stream, ctypes.addressof(args), 0)
        torch.cuda.synchronize()
        s_ref = q[0, :, 0].float() @ k[0, :, 0].float().T
        o_ref = p.float() @ v[0, :, 0].float()
        errs = {
            "s": float((s_out - s_ref).abs().max()),
            "o_rs": float((o_rs - o_ref).abs().max()),
            "o_ss": float((o_ss - o_ref).abs().max()),
        }
        ok = all(e < 1e-2 * max(1.0, float(o_ref.abs().max())) for e in errs.values())
        rows.append({"name": name, "ok": ok, "smem_kernel": int(sm.item()), "smem_host": smem,
                     "compile_s": secs, **errs})
        print(f"micro {name}: ok={ok} {errs} smem {int(sm.item())}/{smem}", flush=True)
        call("cuModuleUnload", mod)
    return rows


# ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", choices=("micro", "build", "correct", "perf"))
    ap.add_argument("--set", default="main", choices=tuple(SETS))
    ap.add_argument("--out", type=Path, default=Path("out"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/fa3build"))
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--n", default="4096,8192")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--only", default="", help="comma-separated config names to keep")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    if args.stage == "micro":
        rows = run_micro(args.work)
        (args.out / "micro.json").write_text(json.dumps(rows, indent=1))
        return 0 if all(r["ok"] for r in rows) else 1

    configs = SETS[args.set]()
    if args.only:
        keep = set(args.only.split(","))
        configs = [c for c in configs if c.name in keep]
    builds = build_all(configs, args.work, args.jobs)
    summary = [b.summary() for b in builds.values()]
    for s in summary:
        print(f"build {s['name']:60s} ok={s['ok']} {s['seconds']:5.1f}s regs={s['regs']} "
              f"spill={s['spill_stores']}/{s['spill_loads']}", flush=True)
    if args.stage == "build":
        (args.out / f"build_{args.set}.json").write_text(json.dumps(summary, indent=1))
        return 0 if all(s["ok"] for s in summary) else 1
    if args.stage == "correct":
        rows = run_correct(configs, builds)
        n_ok = sum(r["ok"] for r in rows)
        print(f"correct: {n_ok}/{len(rows)} passed in {time.time() - t0:.0f}s", flush=True)
        (args.out / f"correct_{args.set}.json").write_text(
            json.dumps({"builds": summary, "checks": rows}, indent=1))
        return 0 if n_ok == len(rows) else 1
    ns = [int(x) for x in args.n.split(",")]
    rows = run_perf(configs, builds, ns, args.batch, args.heads)
    (args.out / f"perf_{args.set}.json").write_text(
        json.dumps({"builds": summary, "timings": rows}, indent=1))
    print(perf_table(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
