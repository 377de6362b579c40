"""Packed variable-length prefill: the varlen kernels against what they replace, in one run.

A batch of sequences of different lengths (default: 16 sequences, 100..4000 tokens, seeded)
runs four ways on the same GPU, each on fresh random inputs:

* fa2tune's varlen kernels (``_vl`` configs: a small grid of fa2 tiles and, on an sm_90 GPU,
  the Hopper family's seeds (``--no-fa3`` leaves them out), every one verified per sequence
  against the float32 reference before its time counts; the fastest is reported, and the
  fastest of each family);
* torch SDPA (flash and cuDNN backends) on the padded batch ``[B, max_len, H, D]`` the packed
  one replaces (their time only: the padding changes their result);
* FlashAttention-2's own varlen forward as torch ships it (``aten._flash_attention_forward``
  with cumulative offsets), when this torch has it;
* the same varlen config's dense twin on the same number of tokens as one dense call
  (``B`` sequences of the mean length): the packing's cost, compared in TFLOP/s since the two
  calls do different amounts of work; and, on sm_90, the Hopper family's dense default on
  those tokens (the dense call the product would make there).

Times are CUDA-event medians with L2 flushed between reps (measure.timing). Writes
``varlen_bench.json`` and ``varlen_bench.md`` to ``--out``::

    python bench/varlen_bench.py --out docs/measurements/varlen
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

from codegen.build import build_configs
from codegen.families.fa2.space import is_valid
from codegen.families.fa3.space import default_config as fa3_default
from codegen.families.fa3.space import seed_configs as fa3_seeds
from core.config import Dtype
from core.fa2_config import Fa2Config
from core.fa3_config import Fa3Config
from core.problem import Problem
from measure.loader import LoadedKernel, ensure_context
from measure.reference import make_inputset
from measure.sdpa import sdpa_times
from measure.timing import TimingOptions, time_with_options
from measure.varlen import check_varlen, make_varlen_inputs
from measure.verify import check_output, poison

log = logging.getLogger("varlen_bench")
#: The families with varlen kernels.
VarlenConfig = Fa2Config | Fa3Config
TIMING = TimingOptions(target_ms=100.0, max_reps=300, budget_ms=3000.0)
#: (br, bc, warps, stages, swizzle) of the varlen configs tried: FA2's tiles and their kin.
TILES = (
    (128, 64, 4, 1, True),
    (128, 64, 4, 2, True),
    (128, 32, 4, 2, True),
    (128, 128, 8, 1, True),
    (128, 64, 8, 2, True),
    (64, 64, 4, 2, True),
    (128, 128, 4, 1, True),
)


def lengths(count: int, lo: int, hi: int, seed: int) -> list[int]:
    """``count`` lengths in ``[lo, hi]``: both ends plus seeded uniform draws, shuffled."""
    rng = random.Random(seed)
    out = [lo, hi, *(rng.randint(lo, hi) for _ in range(max(0, count - 2)))][:count]
    rng.shuffle(out)
    return out


def candidates(d: int, dtype: Dtype, causal: bool, fa3: bool) -> list[VarlenConfig]:
    configs: list[VarlenConfig] = [
        Fa2Config(d, dtype, causal, br, bc, w, s, pad=0, swizzle=swz, varlen=True)
        for br, bc, w, s, swz in TILES
    ]
    configs = [c for c in configs if is_valid(c)[0]]  # type: ignore[arg-type]
    if fa3:
        configs.extend(fa3_seeds(d, dtype, causal, varlen=True))
    return configs


def flash_varlen_ms(inputs: Any) -> float | None:
    """FlashAttention-2's varlen forward through torch's aten op; None when torch lacks it."""
    import torch

    try:
        op = torch.ops.aten._flash_attention_forward
        max_q, max_k = max(inputs.seqlens_q), max(inputs.seqlens_k)

        def call() -> object:
            return op(
                inputs.q, inputs.k, inputs.v, inputs.cu_q, inputs.cu_k, max_q, max_k, 0.0,
                inputs.causal, False, scale=inputs.scale,
            )  # fmt: skip

        call()
        return time_with_options(call, TIMING).median_ms
    except (AttributeError, RuntimeError, TypeError) as exc:
        log.warning("torch's flash varlen forward did not run: %s", exc)
        return None


def run_case(
    lens: list[int], heads: int, kv: int, d: int, dtype: Dtype, causal: bool, fa3: bool
) -> dict:
    import torch

    stream = torch.cuda.current_stream().cuda_stream
    inputs = make_varlen_inputs(lens, heads=heads, kv_heads=kv, d=d, dtype=dtype, causal=causal)
    configs = candidates(d, dtype, causal, fa3)
    dense_twins = [replace(c, varlen=False) for c in configs]
    extra: list[VarlenConfig] = [fa3_default(d, dtype, causal)] if fa3 else []
    reports = {r.config: r for r in build_configs(configs + dense_twins + extra, "sm_90")}
    row: dict[str, Any] = {
        "lengths": lens, "heads": heads, "kv_heads": kv, "d": d, "dtype": dtype,
        "causal": causal, "tflop": inputs.flops / 1e12, "configs": {},
    }  # fmt: skip
    best: tuple[float, VarlenConfig] | None = None
    family_best: dict[str, tuple[float, str]] = {}
    for cfg in configs:
        rep = reports[cfg]
        if not rep.usable or rep.cubin is None:
            row["configs"][cfg.name] = {"status": f"build {rep.status}: {rep.error}"}
            continue
        kernel = LoadedKernel.for_config(cfg, rep.cubin)
        o, lse = inputs.outputs()
        poison(o, lse)
        launch = inputs.bind(kernel, cfg, o, lse, stream)
        launch()
        torch.cuda.synchronize()
        check = check_varlen(o, lse, inputs)
        if not check.ok:
            row["configs"][cfg.name] = {"status": "WRONG", "error": check.message}
            log.error("%s wrong: %s", cfg.name, check.message)
            continue
        ms = time_with_options(launch, TIMING).median_ms
        row["configs"][cfg.name] = {"status": "OK", "ms": ms, "max_abs_err": check.max_abs_err}
        if best is None or ms < best[0]:
            best = (ms, cfg)
        if cfg.family not in family_best or ms < family_best[cfg.family][0]:
            family_best[cfg.family] = (ms, cfg.name)
    if best is None:
        return row
    ms, cfg = best
    row.update(best=cfg.name, ms=ms, tflops=inputs.flops / ms / 1e9)
    row["family_best"] = {
        f: {"config": name, "ms": fms, "tflops": inputs.flops / fms / 1e9}
        for f, (fms, name) in family_best.items()
    }

    # What the packed call replaces: SDPA on the padded batch.
    padded = Problem(
        gpu="bench", d=d, n=max(lens), batch=len(lens), heads=heads,
        kv_heads=kv if kv != heads else None, dtype=dtype, causal=causal,
    )  # fmt: skip
    pin = make_inputset(padded, "bnhd", min_pairs=2, sdpa_ref=False)
    row["padded"] = {
        name: t.median_ms
        for name, t in sdpa_times(pin, backends=("flash", "cudnn"), timing=TIMING).items()
    }
    del pin
    row["flash_varlen_ms"] = flash_varlen_ms(inputs)

    # The same tokens as one dense call, with the dense twin of the chosen config.
    mean = round(sum(lens) / len(lens))
    dense = Problem(
        gpu="bench", d=d, n=mean, batch=len(lens), heads=heads,
        kv_heads=kv if kv != heads else None, dtype=dtype, causal=causal,
    )  # fmt: skip
    din = make_inputset(dense, "bnhd", min_pairs=4, sdpa_ref=True)
    for label, dense_cfg in (("dense", replace(cfg, varlen=False)), *(
        [("dense_fa3_default", extra[0])] if extra else []
    )):  # fmt: skip
        rep = reports[dense_cfg]
        if not rep.usable or rep.cubin is None:
            continue
        kernel = LoadedKernel.for_config(dense_cfg, rep.cubin)
        o, lse = din.outputs()
        poison(o, lse)
        launch = kernel.bind_config(dense_cfg, din.q, din.k, din.v, o, lse, din.scale, "bnhd",
                                    stream)  # fmt: skip
        launch()
        torch.cuda.synchronize()
        ok = check_output(o, lse, din)
        dms = time_with_options(launch, TIMING).median_ms
        row[label] = {
            "config": dense_cfg.name, "n": mean, "ok": ok.ok, "ms": dms,
            "tflops": dense.tflops(dms),
        }  # fmt: skip
    return row


def markdown(rows: list[dict], header: str) -> str:
    out = [
        header,
        "",
        "| dtype | mask | best varlen config | ms | TFLOP/s | x SDPA flash padded "
        "| x cuDNN padded | x FA2 varlen (torch) | dense same tokens TFLOP/s | varlen / dense "
        "| fa3 dense default TFLOP/s | varlen / fa3 dense |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "ms" not in r:
            out.append(f"| {r['dtype']} | {'causal' if r['causal'] else 'full'} | none correct |")
            continue
        pad = r.get("padded", {})

        def ratio(ms: float | None, mine: float = r["ms"]) -> str:
            return f"{ms / mine:.2f}" if ms else "n/a"

        dense = r.get("dense", {})
        dense_tf = dense.get("tflops")
        fa3_tf = r.get("dense_fa3_default", {}).get("tflops")
        fa3_cols = f"| {fa3_tf:.0f} | {r['tflops'] / fa3_tf:.2f} |" if fa3_tf else "| n/a | n/a |"
        out.append(
            f"| {r['dtype']} | {'causal' if r['causal'] else 'full'} | {r['best']} "
            f"| {r['ms']:.3f} | {r['tflops']:.0f} | {ratio(pad.get('flash'))} "
            f"| {ratio(pad.get('cudnn'))} | {ratio(r.get('flash_varlen_ms'))} "
            f"| {dense_tf:.0f} | {r['tflops'] / dense_tf:.2f} " + fa3_cols
            if dense_tf
            else f"| {r['dtype']} | {r['best']} | {r['ms']:.3f} | (no dense twin) |"
        )
    out += [
        "",
        "| dtype | mask | family | fastest _vl config | ms | TFLOP/s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        for fam, fb in sorted(r.get("family_best", {}).items()):
            mask = "causal" if r["causal"] else "full"
            out.append(f"| {r['dtype']} | {mask} | {fam} | {fb['config']} | {fb['ms']:.3f} "
                       f"| {fb['tflops']:.0f} |")  # fmt: skip
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--count", type=int, default=16)
    ap.add_argument("--min-len", type=int, default=100)
    ap.add_argument("--max-len", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--dtype", default="fp16,bf16")
    ap.add_argument("--causal", default="1,0")
    ap.add_argument("--no-fa3", action="store_true", help="fa2 _vl configs only")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    import torch

    ensure_context(torch.cuda.current_device())
    fa3 = not args.no_fa3 and torch.cuda.get_device_capability() == (9, 0)
    lens = lengths(args.count, args.min_len, args.max_len, args.seed)
    log.info("lengths %s (total %d)", lens, sum(lens))
    rows = []
    for dtype in args.dtype.split(","):
        for causal in (c == "1" for c in args.causal.split(",")):
            rows.append(run_case(lens, args.heads, args.kv_heads, args.d, dtype, causal, fa3))
            log.info("%s", json.dumps({k: v for k, v in rows[-1].items() if k != "configs"}))
    args.out.mkdir(parents=True, exist_ok=True)
    when = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    gpu = torch.cuda.get_device_name()
    (args.out / "varlen_bench.json").write_text(
        json.dumps({"when": when, "gpu": gpu, "rows": rows}, indent=1)
    )
    header = (
        f"{gpu}, torch {torch.__version__}, {when}; {args.count} sequences {lens} "
        f"(total {sum(lens)}), H={args.heads} KV={args.kv_heads} D={args.d}"
    )
    (args.out / "varlen_bench.md").write_text(markdown(rows, header))
    print(markdown(rows, header))


if __name__ == "__main__":
    main()
