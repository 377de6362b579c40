"""The compile tier of every GPU target: the portable families' defaults, seeds and a sample
of each space built for each target with ptxas's reports, and the exported header built for
each target alone and for all of them together (a fat build).

No GPU is needed: this is what can be shown for GPUs the project has no machine of
(Blackwell, Orin, Thor). Writes ``compile_tier.json`` (every report) and prints a summary per
(target, family) and per header build::

    PYTHONPATH=$PWD python bench/targets_compile.py --out docs/measurements/targets -j 16
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

log = logging.getLogger("targets_compile")

PORTABLE = ("fa2", "splitkv")
#: One head dim per tile width of the portable families (D=40 runs D=64's tile).
TILE_DIMS = (32, 64, 96, 128, 160, 192, 224, 256)
SAMPLE_DIMS = (64, 128, 256)


def configs_for(arch: str, sample: int, seed: int) -> list[Any]:
    """Defaults (fitted to the target's shared memory), the seeds that fit it (a campaign
    drops the others: they are outside its space) and a random sample of each portable
    family's space at the target's limit, without duplicates."""
    from codegen.families import family
    from codegen.targets import ARCH_SMEM_LIMIT

    limit = ARCH_SMEM_LIMIT[arch]
    rng = random.Random(f"{seed}-{arch}")
    out: dict[Any, None] = {}
    for name in PORTABLE:
        fam = family(name)
        for d in TILE_DIMS:
            for dtype, causal in (("fp16", False), ("bf16", True)):
                fitted = fam.default_within(d, dtype, causal, limit)
                if fitted is not None:
                    out[fitted] = None
        for d in SAMPLE_DIMS:
            for c in fam.seeds(d, "fp16", False):
                if fam.check(c, limit)[0]:
                    out[c] = None
                else:
                    log.info("%s: seed %s does not fit (%d B)", arch, c.name, c.smem_bytes)
            space = fam.space(d, "bf16", True, limit, arch)
            for c in rng.sample(space, min(sample, len(space))):
                out[c] = None
    return list(out)


def build_targets(archs: Sequence[str], jobs: int, sample: int, seed: int) -> list[dict[str, Any]]:
    from codegen.build import build_batch, report_to_dict

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fa2tune-targets-") as cache:
        for arch in archs:
            configs = configs_for(arch, sample, seed)
            t0 = time.perf_counter()
            batch = build_batch(configs, arch=arch, cache_dir=Path(cache), jobs=jobs)
            log.info("%s: %d configs in %.1f s", arch, len(configs), time.perf_counter() - t0)
            for r in batch.reports:
                row = report_to_dict(r)
                row.pop("cubin", None)  # a temporary path
                row["family"] = r.config.family
                row["target_arch"] = arch
                rows.append(row)
    return rows


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (target, family): counts by status, register range, spill bytes, largest smem."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["target_arch"], r["family"]), []).append(r)
    out = []
    for (arch, fam), rs in groups.items():
        built = [r for r in rs if r["registers"] is not None]
        regs = [r["registers"] for r in built]
        out.append({
            "arch": arch,
            "family": fam,
            "configs": len(rs),
            **{s: sum(r["status"] == s for r in rs)
               for s in ("OK", "SPILLS", "SMEM_OVERFLOW", "COMPILE_FAILED")},
            "registers_min": min(regs, default=None),
            "registers_max": max(regs, default=None),
            "spill_store_bytes_max": max((r["spill_stores"] for r in built), default=None),
            "smem_max": max((r["static_smem"] + r["dynamic_smem"] for r in built), default=None),
        })  # fmt: skip
    return out


def header_builds(archs: Sequence[str], jobs: int) -> list[dict[str, Any]]:
    """The exported H200 header (shipped results, D=128 fp16: its tuned configs of all three
    families and the defaults) built for each target alone, then for all of them with sm_90a
    in one fat build (nvcc's ``--threads 0``: the targets compile in parallel)."""
    from db.shipped import load_shipped_results
    from db.store import Store
    from service.header import export_header

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise SystemExit("nvcc is not on PATH")
    with Store.from_url("sqlite://") as store:
        load_shipped_results(store)
        text = export_header(
            store, "H200", [128], dtypes=["fp16"], generated_at=dt.datetime(2026, 12, 2)
        )
    work = Path(tempfile.mkdtemp(prefix="fa2tune-header-"))
    (work / "fa2_tuned.cuh").write_text(text, encoding="utf-8")
    (work / "lib.cu").write_text('#include "fa2_tuned.cuh"\n', encoding="utf-8")

    def gencode(arch: str) -> str:
        n = arch.removeprefix("sm_")
        return f"-gencode=arch=compute_{n},code=sm_{n}"

    builds = [(a, [gencode(a)]) for a in archs]
    builds.append(("all+sm_90a", [*(gencode(a) for a in archs), gencode("sm_90a")]))

    def one(item: tuple[str, list[str]]) -> dict[str, Any]:
        name, flags = item
        out = work / f"lib_{name.replace('+', '_')}.o"
        cmd = [nvcc, "-std=c++17", "-O3", "--threads", "0", "-c", *flags, "lib.cu", "-o", out.name]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=1800)
        return {
            "build": name,
            "flags": flags,
            "returncode": proc.returncode,
            "seconds": round(time.perf_counter() - t0, 1),
            "object_bytes": out.stat().st_size if out.exists() else 0,
            "stderr_tail": proc.stderr[-2000:],
        }

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(one, builds[::-1]))[::-1]  # the fat build starts first
    shutil.rmtree(work, ignore_errors=True)
    return results


def main() -> None:
    from codegen.build import nvcc_version
    from codegen.targets import SUPPORTED_ARCHS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--sample", type=int, default=12, help="configs drawn per space")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arch", action="append", help="targets (default: every one)")
    ap.add_argument("--no-header", action="store_true")
    args = ap.parse_args()
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.INFO, format=fmt)
    archs = args.arch or list(SUPPORTED_ARCHS)
    rows = build_targets(archs, args.jobs, args.sample, args.seed)
    summary = summarize(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "nvcc": nvcc_version(shutil.which("nvcc") or "nvcc"),
        "summary": summary,
        "headers": [],
        "reports": rows,
    }
    path = args.out / "compile_tier.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")  # before the headers: they take longest
    print(f"{'arch':8} {'family':8} {'n':>4} {'ok':>4} {'spill':>5} {'smem':>5} {'fail':>4}"
          f" {'regs':>9} {'spill B':>7} {'max smem':>8}")  # fmt: skip
    for s in summary:
        print(f"{s['arch']:8} {s['family']:8} {s['configs']:4d} {s['OK']:4d} {s['SPILLS']:5d}"
              f" {s['SMEM_OVERFLOW']:5d} {s['COMPILE_FAILED']:4d}"
              f" {s['registers_min']:>4}-{s['registers_max']:<4} {s['spill_store_bytes_max']:7d}"
              f" {s['smem_max']:8d}")  # fmt: skip
    sys.stdout.flush()
    headers = [] if args.no_header else header_builds(archs, args.jobs)
    doc["headers"] = headers
    path.write_text(json.dumps(doc, indent=1) + "\n")
    for h in headers:
        print(f"header {h['build']:12} rc={h['returncode']} {h['seconds']:6.1f} s "
              f"{h['object_bytes']:>9} B")  # fmt: skip


if __name__ == "__main__":
    main()
