"""Tuned kernels versus torch SDPA's backends, in one run on one GPU.

For every (D, N, causal, dtype) it takes the best config the results database holds for this
GPU (FlashAttention-2's own tile choice when the problem was never tuned, flagged as such),
builds it, and lets one :class:`~measure.worker.BenchWorker` verify it against the float32
reference and time it together with SDPA's flash, efficient and cuDNN backends on the very
same inputs (fresh random inputs per problem, outputs poisoned and checked, CUDA events,
warm-up, median of many reps, L2 flushed between reps).

With ``--families`` each kernel family's own best for the problem is timed too (same
inputs, same worker), so the table shows what the Hopper family adds over the portable one.

Writes ``compare_sdpa.json``, ``compare_sdpa.md`` (a table of TFLOP/s and ratios) and
``compare_sdpa.png`` (a plot) to ``--out``::

    python bench/compare_sdpa.py --db sqlite:///h200.db --out docs/performance
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
from pathlib import Path
from typing import Any

from codegen.build import build_configs
from codegen.families import FAMILIES
from codegen.families.fa2.space import fa2_default_config
from core.family import AnyConfig
from core.problem import Problem
from core.records import MeasureStatus
from db.store import Store
from measure.jobs import BenchJob, MeasureOptions
from measure.worker import BenchWorker

log = logging.getLogger("compare_sdpa")
BACKENDS = ("flash", "efficient", "cudnn")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def pick_config(
    store: Store, gpu: str, problem: Problem, family: str | None = None
) -> tuple[AnyConfig, bool] | None:
    """The stored best for ``problem`` (exact N; of ``family`` if given), else FA2's choice
    (None when a family is given and has no result); second item: tuned?"""
    best = store.best(
        gpu,
        problem.d,
        problem.n,
        problem.dtype,
        problem.causal,
        batch=problem.batch,
        heads=problem.heads,
        kv_heads=problem.kv_heads,
        family=family,
    )
    if best is not None:
        return best.config, True
    if family is not None:
        return None
    return fa2_default_config(problem.d, problem.dtype, problem.causal), False


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    store = Store.from_url(args.db)
    rows: list[dict[str, Any]] = []
    with BenchWorker(device=args.device, job_timeout_s=120.0) as worker:
        gpu = worker.gpu_info
        assert gpu is not None, "the worker reported no GPU"
        problems = [
            Problem(
                gpu=gpu.name,
                d=d,
                n=n,
                batch=args.batch,
                heads=args.heads,
                kv_heads=args.kv_heads,
                dtype=dtype,
                causal=causal,
            )
            for dtype in args.dtype.split(",")
            for causal in {"no": (False,), "yes": (True,), "both": (False, True)}[args.causal]
            for d in _ints(args.d)
            for n in _ints(args.n)
        ]
        chosen = {p: pick_config(store, gpu.name, p) for p in problems}
        per_family: dict[tuple[Problem, str], AnyConfig] = {}
        for p in problems if args.families else []:
            for family in FAMILIES:
                pick = pick_config(store, gpu.name, p, family)
                if pick is not None:
                    per_family[(p, family)] = pick[0]
        winners = [pick[0] for pick in chosen.values() if pick is not None]
        configs = list(dict.fromkeys([*winners, *per_family.values()]))
        builds = {r.config: r for r in build_configs(configs, args.arch)}
        options = MeasureOptions(sdpa=True)
        for p in problems:
            pick = chosen[p]
            assert pick is not None  # without a family, pick_config always has an answer
            config, tuned = pick
            report = builds[config]
            row: dict[str, Any] = {
                "d": p.d,
                "n": p.n,
                "dtype": p.dtype,
                "causal": p.causal,
                "config": config.name,
                "family": config.family,
                "tuned": tuned,
            }
            if not report.usable or report.cubin is None:
                row["status"] = str(report.status)
                rows.append(row)
                continue
            result = worker.measure(BenchJob.make(config, report.cubin, p, options))
            row.update(
                status=str(result.status),
                ms=result.median_ms,
                tflops=result.tflops,
                max_abs_err=result.max_abs_err,
            )
            sdpa = result.extra.get("sdpa")
            for name in BACKENDS:
                t = sdpa.get(name) if isinstance(sdpa, dict) else None
                if isinstance(t, dict) and t.get("median_ms"):
                    row[f"{name}_tflops"] = t.get("tflops")
                    if result.status == MeasureStatus.OK and result.median_ms:
                        row[f"vs_{name}"] = t["median_ms"] / result.median_ms
            for family in FAMILIES:
                other = per_family.get((p, family))
                if other is None:
                    continue
                if other == config:
                    row[f"{family}_tflops"] = result.tflops
                    continue
                built = builds[other]
                if built.usable and built.cubin is not None:
                    timed = worker.measure(BenchJob.make(other, built.cubin, p, MeasureOptions()))
                    if timed.status == MeasureStatus.OK:
                        row[f"{family}_tflops"] = timed.tflops
            log.info("%s", row)
            rows.append(row)
        meta = {
            "gpu": gpu.to_dict(),
            "date": dt.date.today().isoformat(),
            "batch": args.batch,
            "heads": args.heads,
        }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare_sdpa.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    write_table(rows, meta, out / "compare_sdpa.md")
    write_plot(rows, meta, out / "compare_sdpa.png")
    return rows


def _f(x: Any, fmt: str) -> str:
    return format(x, fmt) if isinstance(x, (int, float)) else "-"


def write_table(rows: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    gpu = meta["gpu"]
    lines = [
        f"GPU {gpu['name']} (cc {gpu['compute_capability']}, {gpu['sm_count']} SMs), driver "
        f"{gpu['driver_version']}, CUDA {gpu['cuda_version']}, {meta['date']}; "
        f"batch {meta['batch']}, {meta['heads']} heads. TFLOP/s = 4·B·H·N²·D / t (halved "
        "when causal); ratio = backend time / ours (above 1: ours is faster).",
        "",
        "| dtype | causal | D | N | config | tuned | ours | fa2 best | fa3 best | flash "
        "| efficient | cuDNN | vs flash | vs cuDNN | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dtype']} | {'yes' if r['causal'] else 'no'} | {r['d']} | {r['n']} "
            f"| `{r['config']}` | {'yes' if r['tuned'] else 'no (FA2 default)'} "
            f"| {_f(r.get('tflops'), '.0f')} | {_f(r.get('fa2_tflops'), '.0f')} "
            f"| {_f(r.get('fa3_tflops'), '.0f')} | {_f(r.get('flash_tflops'), '.0f')} "
            f"| {_f(r.get('efficient_tflops'), '.0f')} | {_f(r.get('cudnn_tflops'), '.0f')} "
            f"| {_f(r.get('vs_flash'), '.2f')} | {_f(r.get('vs_cudnn'), '.2f')} | {r['status']} |"
        )
    path.write_text("\n".join(lines) + "\n")


def write_plot(rows: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: no plot")
        return
    groups = sorted({(r["dtype"], r["causal"], r["d"]) for r in rows})
    fig, axes = plt.subplots(2, (len(groups) + 1) // 2, figsize=(16, 8), squeeze=False)
    for ax, (dtype, causal, d) in zip(axes.flat, groups, strict=False):
        sel = sorted(
            (r for r in rows if (r["dtype"], r["causal"], r["d"]) == (dtype, causal, d)),
            key=lambda r: r["n"],
        )
        ns = [r["n"] for r in sel]
        for key, label in (
            ("tflops", "fa2tune (tuned)"),
            ("flash_tflops", "SDPA flash (FA2)"),
            ("cudnn_tflops", "SDPA cuDNN"),
            ("efficient_tflops", "SDPA efficient"),
        ):
            ax.plot(ns, [r.get(key) or float("nan") for r in sel], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{dtype} D={d} {'causal' if causal else 'full'}")
        ax.set_xlabel("N")
        ax.set_ylabel("TFLOP/s")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"{meta['gpu']['name']}, {meta['date']}: B={meta['batch']} H={meta['heads']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True, help="results database URL")
    parser.add_argument("--d", default="64,128")
    parser.add_argument("--n", default="1024,2048,4096,8192,16384")
    parser.add_argument("--dtype", default="fp16,bf16")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=None, help="GQA: KV heads (default heads)")
    parser.add_argument("--causal", choices=("no", "yes", "both"), default="both")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--out", default="docs/performance")
    parser.add_argument(
        "--families", action="store_true", help="also time each kernel family's own best"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    run(args)


if __name__ == "__main__":
    main()
