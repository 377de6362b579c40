"""Build, verify and time fa3 (Hopper wgmma/TMA) kernels on a local sm_90 GPU.

Stages (each a sub-command; bench/h200/fa3_check.sh runs each in its own process, so a
kernel fault in one cannot poison the others):

  micro    the building blocks alone (bench/hopper/fa3_micro.cu): TMA + 128B swizzle,
           S = Q K^T through K-major descriptors, O = P V through the N-major V descriptor
           with P from registers and from shared memory; exact fp32 comparisons.
  correct  every config of a set against the float32 reference over many shapes (tails,
           N = 1, Nq != Nk both ways, causal, GQA 32:8, MQA, bnhd and bhnd, LSE) with the
           product's reference and rule (measure.reference, measure.verify: NaN-poisoned
           outputs, dead rows exactly 0 / -inf, error <= max(2 x SDPA flash's error on the
           same inputs, floor)); fresh random inputs for every check.
  perf     TFLOP/s of configs against torch SDPA flash and cuDNN on the same inputs (the
           product's timing: CUDA events, warm-up, L2 flushed before every timed launch,
           median), outputs verified.

Builds, loading, TMA descriptors and launches are the product's (codegen.build,
measure.loader, codegen.families.fa3.host); fa3_host.py adds only what a harness needs.

Everything is written as JSON under --out; a table is printed last.
Run from the repository root: ``python3 bench/hopper/fa3_check.py correct --set main``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import fa3_host
from fa3_host import Fa3Config, bind, build, compile_source, load

from codegen.families.fa3.host import encode_tensor_map
from core.build_report import BuildReport
from core.problem import Problem
from measure.loader import call, driver, ensure_context
from measure.reference import make_inputset
from measure.timing import TimingOptions, time_with_options
from measure.verify import check_output, poison, tolerance

GPU = "H200"


# ------------------------------------------------------------------------------------------
# Config sets


def main_configs() -> list[Fa3Config]:
    """The first config of step 1: D=128 non-causal, 128x128, 2 stages (RS, overlap, ping-pong)."""
    return [Fa3Config(128, "fp16", False)]


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
            Fa3Config(
                128,
                "bf16",
                causal,
                block_m=192,
                block_n=128,
                pv_regs=False,
                pingpong=False,
                consumer_regs=160,
            ),
            Fa3Config(
                128,
                "fp16",
                causal,
                block_m=64,
                block_n=128,
                pingpong=False,
                consumer_regs=240,
                stages=3,
            ),
            Fa3Config(
                64,
                "fp16",
                causal,
                block_m=192,
                block_n=128,
                pv_regs=False,
                pingpong=False,
                consumer_regs=160,
            ),
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
        Fa3Config(
            64,
            "fp16",
            False,
            block_m=192,
            block_n=128,
            pv_regs=False,
            pingpong=False,
            consumer_regs=160,
        ),
        Fa3Config(64, "fp16", False, block_m=128, block_n=128, stages=3),
        Fa3Config(256, "fp16", False, block_m=128, block_n=80),
    ]
    return cs


def sweep_configs() -> list[Fa3Config]:
    """Tile shapes, stage counts and switches around the step-1 config (second device run)."""
    cs: list[Fa3Config] = []
    for dt in ("fp16", "bf16"):
        cs += [
            Fa3Config(128, dt, False, block_n=bn, stages=st)
            for bn, st in ((128, 2), (128, 3), (112, 3), (144, 2), (160, 2), (176, 2), (192, 2))
        ]
        cs += [
            Fa3Config(128, dt, False, block_n=176, pingpong=False),
            Fa3Config(
                128,
                dt,
                False,
                block_m=192,
                block_n=128,
                pv_regs=False,
                pingpong=False,
                consumer_regs=160,
            ),
        ]
    cs += [
        Fa3Config(128, "fp16", True, block_n=bn, stages=st)
        for bn, st in ((128, 2), (128, 3), (176, 2), (192, 2))
    ]
    cs += [
        Fa3Config(64, "fp16", False, block_n=192),
        Fa3Config(64, "fp16", False, block_n=176, stages=3),
        Fa3Config(64, "fp16", False, block_m=192, block_n=128, pingpong=False, consumer_regs=160),
        Fa3Config(
            64,
            "fp16",
            False,
            block_m=192,
            block_n=160,
            pv_regs=False,
            pingpong=False,
            consumer_regs=160,
        ),
        Fa3Config(
            64,
            "fp16",
            False,
            block_m=192,
            block_n=192,
            pv_regs=False,
            pingpong=False,
            consumer_regs=160,
        ),
        Fa3Config(256, "fp16", False, block_n=80),
        Fa3Config(256, "fp16", False, block_n=64),
    ]
    return cs


def short_configs() -> list[Fa3Config]:
    """The family's default config (codegen.families.fa3.space.default_config) per head dim,
    full and causal, fp16; D=128 also bf16: the short perf table of bench/h200/fa3_check.sh."""
    from codegen.families.fa3.space import default_config

    cs = [default_config(d, "fp16", causal) for d in (64, 128, 256) for causal in (False, True)]
    return cs + [default_config(128, "bf16", causal) for causal in (False, True)]


SETS = {
    "short": short_configs,
    "main": main_configs,
    "features": feature_configs,
    "perf": perf_configs,
    "sweep": sweep_configs,
}


# ------------------------------------------------------------------------------------------
# Correctness (the product's reference and rule: measure.reference, measure.verify)


@dataclass(frozen=True)
class Case:
    batch: int
    heads: int
    kv_heads: int
    nq: int
    nk: int
    layout: str

    def problem(self, c: Fa3Config) -> Problem:
        return Problem(
            gpu=GPU,
            d=c.d,
            n=self.nq,
            batch=self.batch,
            heads=self.heads,
            dtype=c.dtype,
            causal=c.causal,
            kv_heads=self.kv_heads,
            nk=self.nk,
        )


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


def check_case(kernel: Any, config: Fa3Config, case: Case) -> dict[str, Any]:
    """Fresh inputs, the float32 reference and SDPA's error (make_inputset); one launch of
    ``kernel`` into NaN-poisoned outputs; the verdict of measure.verify.check_output."""
    import torch

    inputs = make_inputset(case.problem(config), case.layout)
    o, lse = inputs.outputs()
    poison(o, lse)
    bind(kernel, config, inputs.q, inputs.k, inputs.v, o, lse, inputs.scale, case.layout)()
    torch.cuda.synchronize()
    res = check_output(o, lse, inputs)
    return {
        "config": config.name,
        "case": case.__dict__,
        "ok": bool(res.ok),
        "max_abs_err": res.max_abs_err,
        "rel_err": res.rel_err,
        "tol": tolerance(inputs),
        "sdpa_err": inputs.ref_err,
        "message": res.message,
        "seed": inputs.seed,
    }


def run_correct(configs: list[Fa3Config], builds: dict[str, BuildReport]) -> list[dict]:
    ensure_context(0)
    rows: list[dict] = []
    for c in configs:
        b = builds[c.name]
        if not b.usable or b.cubin is None:
            rows.append({"config": c.name, "ok": False, "message": f"build {b.status}"})
            print(f"BUILD FAIL {c.name}\n{fa3_host.ptxas_log(b)[-2000:]}", flush=True)
            continue
        kernel = load(b)
        for case in CASES:
            try:
                r = check_case(kernel, c, case)
            except Exception as exc:  # a refused launch or bad descriptor: record, go on
                r = {
                    "config": c.name,
                    "case": case.__dict__,
                    "ok": False,
                    "message": f"{type(exc).__name__}: {exc}",
                }
            rows.append(r)
            flag = "ok  " if r["ok"] else "FAIL"
            print(
                f"{flag} {c.name} {case} err={r.get('max_abs_err', float('nan')):.2e} "
                f"tol={r.get('tol', float('nan')):.2e} {r['message'][:160]}",
                flush=True,
            )
        kernel.unload()
    return rows


# ------------------------------------------------------------------------------------------
# Timing (the product's: measure.timing; SDPA baselines: measure.sdpa)

TIMING = TimingOptions(warmup=5, target_ms=150.0, min_reps=10, max_reps=300, flush_l2=True)


def run_perf(
    configs: list[Fa3Config], builds: dict[str, BuildReport], ns: list[int], batch: int, heads: int
) -> list[dict]:
    import torch

    from measure.sdpa import sdpa_times

    ensure_context(0)
    rows: list[dict] = []
    groups: dict[tuple, list[Fa3Config]] = {}
    for c in configs:
        groups.setdefault((c.d, c.dtype, c.causal), []).append(c)
    for (d, dtype, causal), cs in groups.items():
        for n in ns:
            problem = Problem(
                gpu=GPU, d=d, n=n, batch=batch, heads=heads, dtype=dtype, causal=causal
            )
            inputs = make_inputset(problem, "bnhd")
            base = {
                name: t.tflops
                for name, t in sdpa_times(
                    inputs, backends=("flash", "cudnn"), timing=TIMING
                ).items()
            }
            for c in cs:
                b = builds[c.name]
                if not b.usable or b.cubin is None:
                    continue
                kernel = load(b)
                o, lse = inputs.outputs()
                poison(o, lse)
                launch = bind(kernel, c, inputs.q, inputs.k, inputs.v, o, lse, inputs.scale, "bnhd")
                launch()
                torch.cuda.synchronize()
                res = check_output(o, lse, inputs)
                ms = time_with_options(launch, TIMING).median_ms
                tf = problem.tflops(ms)
                row = {
                    "config": c.name,
                    "d": d,
                    "dtype": dtype,
                    "causal": causal,
                    "n": n,
                    "batch": batch,
                    "heads": heads,
                    "ms": ms,
                    "tflops": tf,
                    "ok": bool(res.ok),
                    "max_abs_err": res.max_abs_err,
                    "flash_tflops": base.get("flash"),
                    "cudnn_tflops": base.get("cudnn"),
                    "regs": b.registers,
                    "spill_stores": b.spill_stores,
                }
                rows.append(row)
                print(
                    f"{c.name:60s} n={n:5d} {tf:6.1f} TF/s  flash "
                    f"{row['flash_tflops'] or float('nan'):6.1f}  cudnn "
                    f"{row['cudnn_tflops'] or float('nan'):6.1f}  ok={res.ok}",
                    flush=True,
                )
                kernel.unload()
            del inputs
            torch.cuda.empty_cache()
    return rows


def perf_table(rows: list[dict]) -> str:
    lines = [
        f"{'config':58s} {'N':>5s} {'TF/s':>6s} {'flash':>6s} {'cudnn':>6s} "
        f"{'x fl':>5s} {'x cu':>5s} ok"
    ]
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
        ok, cubin, secs, log = compile_source(
            src, name, workdir, extra=(f"-DMICRO_D={d}", f"-DMICRO_BN={bn}")
        )
        if not ok:
            rows.append({"name": name, "ok": False, "log": log[-1500:]})
            print(f"micro {name}: BUILD FAIL\n{log[-1500:]}", flush=True)
            continue
        img = cubin.read_bytes()
        buf = ctypes.create_string_buffer(img, len(img))
        mod = call("cuModuleLoadData", ctypes.addressof(buf))
        fn = call("cuModuleGetFunction", mod, b"fa3_micro")
        smem = 1024 + 128 * math.ceil(d / 64) * (64 + 2 * bn) + math.ceil(bn / 64) * 8192 + 64
        call(
            "cuFuncSetAttribute",
            fn,
            cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem,
        )
        g = torch.Generator(device="cuda").manual_seed(1234 + d)
        q = torch.randn(1, 64, 1, d, device="cuda", dtype=torch.float16, generator=g)
        k = torch.randn(1, bn, 1, d, device="cuda", dtype=torch.float16, generator=g)
        v = torch.randn(1, bn, 1, d, device="cuda", dtype=torch.float16, generator=g)
        p = torch.rand(64, bn, device="cuda", dtype=torch.float16, generator=g)
        s_out = torch.full((64, bn), math.nan, device="cuda")
        o_rs = torch.full((64, d), math.nan, device="cuda")
        o_ss = torch.full((64, d), math.nan, device="cuda")
        sm = torch.zeros(1, dtype=torch.int32, device="cuda")
        maps = [
            encode_tensor_map(q, "bnhd", 64),
            encode_tensor_map(k, "bnhd", bn),
            encode_tensor_map(v, "bnhd", bn),
        ]
        ptrs = [ctypes.c_uint64(t.data_ptr()) for t in (s_out, p, o_rs, o_ss, sm)]
        args = (ctypes.c_void_p * 8)(
            *(ctypes.addressof(m) for m in maps), *(ctypes.addressof(x) for x in ptrs)
        )
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
        rows.append(
            {
                "name": name,
                "ok": ok,
                "smem_kernel": int(sm.item()),
                "smem_host": smem,
                "compile_s": secs,
                **errs,
            }
        )
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
    builds = build(configs, args.work, args.jobs)
    summary = [fa3_host.summary(b) for b in builds.values()]
    for s in summary:
        print(
            f"build {s['name']:60s} ok={s['ok']} {s['seconds']:5.1f}s regs={s['regs']} "
            f"spill={s['spill_stores']}/{s['spill_loads']}",
            flush=True,
        )
    if args.stage == "build":
        (args.out / f"build_{args.set}.json").write_text(json.dumps(summary, indent=1))
        return 0 if all(s["ok"] for s in summary) else 1
    if args.stage == "correct":
        rows = run_correct(configs, builds)
        n_ok = sum(r["ok"] for r in rows)
        print(f"correct: {n_ok}/{len(rows)} passed in {time.time() - t0:.0f}s", flush=True)
        (args.out / f"correct_{args.set}.json").write_text(
            json.dumps({"builds": summary, "checks": rows}, indent=1)
        )
        return 0 if n_ok == len(rows) else 1
    ns = [int(x) for x in args.n.split(",")]
    rows = run_perf(configs, builds, ns, args.batch, args.heads)
    (args.out / f"perf_{args.set}.json").write_text(
        json.dumps({"builds": summary, "timings": rows}, indent=1)
    )
    print(perf_table(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
