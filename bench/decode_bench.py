"""Decode shapes: the split-KV family's best against torch SDPA's backends, in one run.

For each decode shape (Nq = 1, long Nk, GQA) it builds a grid of split-KV configs and the
mma.sync and Hopper families' defaults, then lets one :class:`~measure.worker.BenchWorker`
verify every config against the float32 reference and time it on the same inputs as SDPA's
flash, efficient and cuDNN backends (fresh random inputs per shape, outputs poisoned and
checked, CUDA events, warm-up, median of many reps, L2 flushed between reps). The report is
the fastest verified config per shape, its speed relative to each backend and the memory
bandwidth it reaches (K and V bytes read per second; Q and O are a rounding error).

Writes ``decode_bench.json`` and ``decode_bench.md`` to ``--out``::

    python bench/decode_bench.py --out docs/measurements/decode
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import itertools
import json
import logging
from pathlib import Path
from typing import Any

from codegen.build import build_configs
from codegen.families import FAMILIES
from codegen.families.splitkv.space import invalid_reasons
from core.config import Dtype
from core.family import AnyConfig
from core.problem import Problem
from core.records import MeasureStatus
from core.splitkv_config import SplitKvConfig
from measure.jobs import BenchJob, MeasureOptions
from measure.timing import FLUSH_KINDS, TimingOptions
from measure.worker import BenchWorker

log = logging.getLogger("decode_bench")
BACKENDS = ("flash", "efficient", "cudnn")
H200_PEAK_BYTES_PER_S = 4.8e12  # the H200's HBM3e bandwidth as NVIDIA states it
#: The campaign's timing (L2 flushed before every rep, so K/V come from HBM even at Nk=1k)
#: with a shorter target: decode kernels take microseconds, 30 ms is hundreds of reps.
TIMING = TimingOptions(target_ms=30.0, max_reps=500, budget_ms=1500.0)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


#: The split-KV grids (block_n, warps, stages, splits): "decode" the choices that matter for
#: decode at every batch; "wide" more of the space for few (batch, KV head) tiles, where the
#: bytes one SM keeps in flight decide (B = 1: 8 row tiles for 132 SMs).
GRIDS: dict[str, tuple[tuple[int, ...], ...]] = {
    "decode": ((32, 64), (4, 8), (2, 3), (1, 4, 8, 16, 32, 64)),
    "wide": ((16, 32, 64), (1, 2, 4, 8), (2, 3, 4), (8, 16, 24, 32, 48, 64, 96, 128)),
}


def candidates(d: int, dtype: Dtype, causal: bool, grid_name: str = "decode") -> list[AnyConfig]:
    """A grid of split-KV configs plus the other families' defaults, so the table shows what
    the split-KV family adds."""
    grid = (
        SplitKvConfig(d, dtype, causal, 16, n, w, s, k)
        for n, w, s, k in itertools.product(*GRIDS[grid_name])
    )
    configs: list[AnyConfig] = [c for c in grid if not invalid_reasons(c)]
    for name, fam in FAMILIES.items():
        if name != "splitkv":
            with contextlib.suppress(ValueError):  # a head dim the family lacks
                configs.append(fam.default(d, dtype, causal))
    return configs


def kv_bytes(p: Problem) -> int:
    return 2 * p.batch * p.n_kv_heads * p.n_keys * p.d * 2


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with BenchWorker(device=args.device, job_timeout_s=120.0) as worker:
        gpu = worker.gpu_info
        assert gpu is not None, "the worker reported no GPU"
        dtypes: list[Dtype] = [x for x in ("fp16", "bf16") if x in args.dtype.split(",")]  # type: ignore[misc]
        configs = {dt_: candidates(args.d, dt_, False, args.grid) for dt_ in dtypes}
        builds = {
            r.config: r
            for r in build_configs([c for cs in configs.values() for c in cs], args.arch)
        }
        timing = dataclasses.replace(TIMING, flush_by=args.flush)
        for dtype, nk, batch in itertools.product(dtypes, _ints(args.nk), _ints(args.batch)):
            p = Problem(
                gpu=gpu.name, d=args.d, n=args.nq, nk=nk if nk != args.nq else None,
                batch=batch, heads=args.heads, kv_heads=args.kv_heads, dtype=dtype,
            )  # fmt: skip
            results: list[tuple[float, AnyConfig]] = []
            sdpa: dict[str, Any] = {}
            failures: list[str] = []
            for i, config in enumerate(configs[dtype]):
                report = builds[config]
                if not report.usable or report.cubin is None:
                    failures.append(f"{config.name}: {report.status}")
                    continue
                # SDPA once per shape, on the same inputs and with the same timing.
                options = MeasureOptions(sdpa=i == 0, timing=timing)
                res = worker.measure(BenchJob.make(config, report.cubin, p, options))
                if i == 0 and isinstance(res.extra.get("sdpa"), dict):
                    sdpa = res.extra["sdpa"]
                if res.status == MeasureStatus.OK and res.median_ms:
                    results.append((res.median_ms, config))
                else:
                    failures.append(f"{config.name}: {res.status} {res.error}")
            results.sort(key=lambda x: x[0])
            row: dict[str, Any] = {
                "dtype": dtype, "nq": args.nq, "nk": nk, "batch": batch, "heads": args.heads,
                "kv_heads": args.kv_heads, "d": args.d, "failures": failures,
                "flush_by": args.flush,
                "top": [(c.name, ms) for ms, c in results[:8]],
            }  # fmt: skip
            if args.floor:
                row.update(floor_times(p, timing))
            if results:
                ms, best = results[0]
                row.update(best=best.name, ms=ms, gbps=kv_bytes(p) / (ms * 1e-3) / 1e9)
                row["hbm_fraction"] = row["gbps"] * 1e9 / H200_PEAK_BYTES_PER_S
                for fam in FAMILIES:
                    own = [m for m, c in results if c.family == fam]
                    if own:
                        row[f"{fam}_ms"] = own[0]
                for name in BACKENDS:
                    t = sdpa.get(name)
                    if isinstance(t, dict) and t.get("median_ms"):
                        row[f"{name}_ms"] = t["median_ms"]
                        row[f"vs_{name}"] = t["median_ms"] / ms
            log.info("%s", {k: v for k, v in row.items() if k != "failures"})
            rows.append(row)
    return rows


def floor_times(p: Problem, timing: TimingOptions) -> dict[str, float]:
    """What one launch costs on this GPU regardless of the kernel, timed as the configs are
    (same options, L2 flushed): ``read_ms``, torch's sum over a tensor of the problem's K and
    V bytes (one streaming-read launch, the bandwidth a single call of this size can reach),
    and ``empty_ms``, a launch that does nothing measurable (one element)."""
    import torch

    from measure.timing import time_with_options

    kv = torch.randn(2 * p.batch * p.n_keys * p.n_kv_heads * p.d, device="cuda").half()
    one = torch.randn(1, device="cuda")
    out = {
        "read_ms": time_with_options(lambda: kv.sum(dtype=torch.float32), timing).median_ms,
        "empty_ms": time_with_options(lambda: one.add_(1.0), timing).median_ms,
    }
    out["read_hbm_fraction"] = kv_bytes(p) / (out["read_ms"] * 1e-3) / H200_PEAK_BYTES_PER_S
    return out


def table(rows: list[dict[str, Any]]) -> str:
    def f(x: Any, fmt: str = ".3f") -> str:
        return format(x, fmt) if isinstance(x, float) else "-"

    lines = [
        "| dtype | B | Nk | best | µs | GB/s | of HBM | vs flash | vs cuDNN | vs efficient "
        "| fa2 default µs | fa3 default µs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dtype']} | {r['batch']} | {r['nk']} | {r.get('best', 'none')} "
            f"| {f(r.get('ms', 0) * 1e3, '.1f')} | {f(r.get('gbps'), '.0f')} "
            f"| {f(r.get('hbm_fraction'), '.2f')} | {f(r.get('vs_flash'), '.2f')} "
            f"| {f(r.get('vs_cudnn'), '.2f')} | {f(r.get('vs_efficient'), '.2f')} "
            f"| {f(r.get('fa2_ms', 0) * 1e3, '.1f')} | {f(r.get('fa3_ms', 0) * 1e3, '.1f')} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--nq", type=int, default=1)
    ap.add_argument("--nk", default="1024,8192,32768,131072")
    ap.add_argument("--batch", default="1,8,64")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dtype", default="fp16,bf16")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("decode_bench"))
    ap.add_argument("--grid", choices=sorted(GRIDS), default="decode", help="split-KV grid")
    ap.add_argument(
        "--floor", action="store_true", help="also time a streaming read and an empty launch"
    )
    ap.add_argument(
        "--flush", choices=FLUSH_KINDS, default="write", help="how L2 is flushed between reps"
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = run(args)
    stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    (args.out / "decode_bench.json").write_text(
        json.dumps({"measured_at": stamp, "rows": rows}, indent=1)
    )
    (args.out / "decode_bench.md").write_text(f"Measured {stamp}\n\n" + table(rows))
    print(table(rows))


if __name__ == "__main__":
    main()
