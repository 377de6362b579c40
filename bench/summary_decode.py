"""The shipped split-KV pick of each decode shape beside SDPA's backends, timed as
bench/decode_bench.py times (its TIMING; the worker times SDPA on the same inputs), written in
decode_bench's JSON format, each row also naming its pick (``shipped``).

Run from the repository root, as bench/h200/summary_run.sh does::

    python bench/summary_decode.py DB_URL OUT.json DTYPES NKS BATCHES
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from pathlib import Path
from typing import Any

import decode_bench as bench

from codegen.build import build_configs
from core.build_report import BuildReport
from core.problem import Problem
from core.records import MeasureResult, MeasureStatus
from db.results import BestResult
from db.store import Store
from measure.jobs import BenchJob, MeasureOptions
from measure.worker import BenchWorker

log = logging.getLogger("decode_shipped")


def timed(
    worker: BenchWorker, p: Problem, built: BuildReport, row: dict[str, Any]
) -> MeasureResult:
    """The pick with SDPA on the same inputs; alone if that fails: SDPA's flash and efficient
    backends get K/V expanded to every query head (4x), at B=64 Nk=128k more than the GPU
    holds (2026-11-30 decode bench)."""
    assert built.cubin is not None
    res = worker.measure(
        BenchJob.make(built.config, built.cubin, p, MeasureOptions(sdpa=True, timing=bench.TIMING))
    )
    if res.status == MeasureStatus.OK:
        return res
    row["failures"].append(f"{built.config.name} with SDPA: {res.status} {res.error}")
    return worker.measure(
        BenchJob.make(built.config, built.cubin, p, MeasureOptions(timing=bench.TIMING))
    )


def measure_row(
    worker: BenchWorker, p: Problem, pick: BestResult | None, builds: dict[Any, BuildReport]
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "dtype": p.dtype,
        "nq": p.n,
        "nk": p.nk,
        "batch": p.batch,
        "heads": p.heads,
        "kv_heads": p.kv_heads,
        "d": p.d,
        "failures": [],
        "flush_by": bench.TIMING.flush_by,
    }
    if pick is None:
        row["failures"].append("no shipped result for this shape")
        return row
    cfg, built = pick.config, builds[pick.config]
    row.update(shipped=cfg.name, shipped_ms=pick.median_ms)
    if not built.usable or built.cubin is None:
        row["failures"].append(f"{cfg.name}: {built.status}")
        return row
    res = timed(worker, p, built, row)
    if res.status != MeasureStatus.OK or not res.median_ms:
        row["failures"].append(f"{cfg.name}: {res.status} {res.error}")
        return row
    ms = res.median_ms
    gbps = bench.kv_bytes(p) / (ms * 1e-3) / 1e9
    row.update(
        best=cfg.name,
        ms=ms,
        top=[(cfg.name, ms)],
        gbps=gbps,
        hbm_fraction=gbps * 1e9 / bench.H200_PEAK_BYTES_PER_S,
    )
    row[f"{cfg.family}_ms"] = ms
    sdpa = res.extra.get("sdpa")
    for name in bench.BACKENDS:
        t = sdpa.get(name) if isinstance(sdpa, dict) else None
        if isinstance(t, dict) and t.get("median_ms"):
            row[f"{name}_ms"] = t["median_ms"]
            row[f"vs_{name}"] = t["median_ms"] / ms
    return row


def main() -> None:
    db, out, dtypes, nks, batches = sys.argv[1:]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    store = Store.from_url(db)
    rows: list[dict[str, Any]] = []
    with BenchWorker(device=0, job_timeout_s=120.0) as worker:
        assert worker.gpu_info is not None, "the worker reported no GPU"
        gpu = worker.gpu_info.name
        shapes = [
            Problem(gpu=gpu, d=128, n=1, nk=int(nk), batch=int(b), heads=32, kv_heads=8, dtype=t)  # type: ignore[arg-type]
            for t in dtypes.split(",")
            for nk in nks.split(",")
            for b in batches.split(",")
        ]
        picks = {
            p: store.best(
                gpu,
                p.d,
                p.n,
                p.dtype,
                False,
                nk=p.nk,
                batch=p.batch,
                heads=p.heads,
                kv_heads=p.kv_heads,
            )
            for p in shapes
        }
        wanted = dict.fromkeys(pick.config for pick in picks.values() if pick is not None)
        builds = {r.config: r for r in build_configs(list(wanted), "sm_90")}
        for p, pick in picks.items():
            rows.append(measure_row(worker, p, pick, builds))
            log.info("%s", rows[-1])
    stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    Path(out).write_text(json.dumps({"measured_at": stamp, "rows": rows}, indent=1))
    log.info("decode, the shipped picks:\n%s", bench.table(rows))


if __name__ == "__main__":
    main()
