"""The same configs built by nvcc and by NVRTC (no toolkit): results and speed, in one run.

For a sample of the shipped H200 winners (each family; prefill and decode shapes) it builds
every config twice through the product's build (``FA2TUNE_COMPILER=nvcc`` and ``nvrtc``, two
cache directories), loads both cubins, runs both on the same random inputs (outputs poisoned
with NaN first) against a float32 reference and times both alternately (CUDA events, L2
flushed before each rep, median). Prints per config the registers and spills each build
reports, the max error of each and the time ratio NVRTC / nvcc; writes ``nvrtc_vs_nvcc.json``
to ``--out``::

    PYTHONPATH=$PWD python bench/nvrtc_vs_nvcc.py --out docs/measurements/nvrtc
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import statistics
from pathlib import Path
from typing import Any

log = logging.getLogger("nvrtc_vs_nvcc")


def _cases() -> list[tuple[Any, tuple[int, int, int, int, int]]]:
    """The fastest OK config of a few problems of the shipped results, with their shapes."""
    from db.dump_format import load_dump

    root = Path(__file__).resolve().parent.parent / "db" / "data"
    picked: dict[str, tuple[Any, tuple[int, int, int, int, int]]] = {}
    for path in sorted(root.glob("*.json")):
        best: dict[Any, tuple[float, Any]] = {}
        for m in load_dump(path).measurements:
            p = m.problem
            plain = (p.window_left, p.window_right, p.chunk, p.softcap, p.sinks) == (
                -1, -1, 0, 0.0, False)  # fmt: skip
            if str(m.status) != "OK" or m.median_ms is None or p.seqlens or not plain:
                continue
            key = m.problem.key
            if key not in best or m.median_ms < best[key][0]:
                best[key] = (m.median_ms, m)
        for _, m in best.values():
            family = m.build.config_name.split("_")[0]
            regime = "decode" if m.problem.n <= 4 else "prefill"
            slot = f"{family}-{regime}-{m.problem.d}-{m.problem.dtype}"
            p = m.problem
            if slot not in picked and p.batch * p.heads * p.n * p.nk <= 2**33:
                picked[slot] = (m.build, (p.batch, p.n, p.nk, p.heads, p.kv_heads))
    return list(picked.values())


def _time(torch: Any, launches: list[Any], reps: int, flush: Any) -> list[float]:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples: list[list[float]] = [[] for _ in launches]
    for _ in range(reps):
        for i, launch in enumerate(launches):  # alternate: drift hits both alike
            flush.zero_()
            start.record()
            launch()
            end.record()
            end.synchronize()
            samples[i].append(start.elapsed_time(end) * 1e3)
    return [statistics.median(s) for s in samples]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    import os

    import torch

    from codegen.build import build_configs
    from core import settings
    from core.family import config_from_name
    from fa2tune.ops.fallback import sdpa_fallback
    from measure.loader import LoadedKernel, ensure_context

    cases = _cases()
    configs = [config_from_name(b.config_name) for b, _ in cases]
    reports: dict[str, dict[str, Any]] = {}
    for compiler in ("nvcc", "nvrtc"):
        os.environ["FA2TUNE_COMPILER"] = compiler
        settings._from_environment.cache_clear()
        cache = args.out / f"cache-{compiler}"
        for r in build_configs(configs, "sm_90", cache_dir=cache):
            reports.setdefault(r.config.name, {})[compiler] = r
    ensure_context(0)
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    rows = []
    for config, (_, (b, nq, nk, h, hkv)) in zip(configs, cases, strict=True):
        torch.manual_seed(0)
        dtype = torch.float16 if config.dtype == "fp16" else torch.bfloat16
        q = torch.randn(b, nq, h, config.d, device="cuda", dtype=dtype)
        k = torch.randn(b, nk, hkv, config.d, device="cuda", dtype=dtype)
        v = torch.randn_like(k)
        scale = 1 / math.sqrt(config.d)
        ref, _ = sdpa_fallback(q, k, v, config.causal, scale, "bnhd", True)  # float32 maths
        row: dict[str, Any] = {"config": config.name, "shape": [b, nq, nk, h, hkv]}
        launches = []
        for compiler in ("nvcc", "nvrtc"):
            r = reports[config.name][compiler]
            row[compiler] = {"registers": r.registers, "spill_stores": r.spill_stores,
                             "release": r.nvcc_version}  # fmt: skip
            kernel = LoadedKernel.for_config(config, r.cubin)
            o = torch.full_like(q, float("nan"))
            launch = kernel.bind_config(config, q, k, v, o, None, scale, "bnhd", stream)
            launch()
            torch.cuda.synchronize()
            row[compiler]["max_err"] = (o.float() - ref.float()).abs().max().item()
            launches.append(launch)
        us = _time(torch, launches, args.reps, flush)
        row["nvcc"]["us"], row["nvrtc"]["us"] = round(us[0], 2), round(us[1], 2)
        row["nvrtc_over_nvcc"] = round(us[1] / us[0], 3)
        rows.append(row)
        log.info("%-52s regs %s/%s  err %.2g/%.2g  %.1f/%.1f us  NVRTC/nvcc %.3f", config.name,
                 row["nvcc"]["registers"], row["nvrtc"]["registers"], row["nvcc"]["max_err"],
                 row["nvrtc"]["max_err"], us[0], us[1], row["nvrtc_over_nvcc"])  # fmt: skip
    when = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    report = {"date": when, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "rows": rows}  # fmt: skip
    (args.out / "nvrtc_vs_nvcc.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
