"""Time configs built from several copies of the kernel template, side by side on one GPU.

For template experiments before they land: each variant is a directory holding its own copy
of the family templates (``codegen/templates``, edited); every (config, N[, batch]) case, of
any family, is built from each variant (own build cache, so results never mix), verified and
timed by one ``BenchWorker``, and the first case of each problem also times torch SDPA's
backends. One JSON line per case on stdout, all of them in ``<out>/variants.json``.

    python bench/template_variants.py spec.json --out results/ --heads 32 --kv-heads 8
    # spec.json: {"variants": {"base": "codegen/templates", "try": "/path/to/copy"},
    #             "cases": [["fa2_d128_fp16_causal_br128_bc64_w4_s1_swz", 8192],
    #                       ["fa3_d128_fp16_causal_m128_n128_s2_rs_ov_pp_r240", 512, 16], ...]}
    # (the third field of a case, the batch, defaults to --batch)
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from codegen.build import build_configs
from core.family import config_from_name
from core.problem import Problem
from measure.jobs import BenchJob, MeasureOptions
from measure.timing import TimingOptions
from measure.worker import BenchWorker

log = logging.getLogger("template_variants")


def run(
    spec: dict[str, Any], out: Path, device: int, batch: int, heads: int, kv_heads: int | None
) -> list[dict]:
    cases = [
        (config_from_name(str(case[0])), int(case[1]), int(case[2]) if len(case) > 2 else batch)
        for case in spec["cases"]
    ]
    configs = list({c.name: c for c, _, _ in cases}.values())
    rows: list[dict] = []
    sdpa_done: set[tuple] = set()
    with (
        BenchWorker(device=device, job_timeout_s=60) as worker,
        tempfile.TemporaryDirectory() as tmp,
    ):
        gpu = worker.gpu_info.name if worker.gpu_info is not None else "unknown"
        for variant, tdir in spec["variants"].items():
            reports = build_configs(configs, template_dir=Path(tdir), cache_dir=Path(tmp) / variant)
            by_name = {r.config.name: r for r in reports}
            for cfg, n, b in cases:
                r = by_name[cfg.name]
                row: dict[str, Any] = {
                    "variant": variant, "config": cfg.name, "n": n, "batch": b,
                    "build": str(r.status),
                    "registers": r.registers, "spill_bytes": r.spill_bytes,
                }  # fmt: skip
                if r.cubin is not None:
                    key = (cfg.d, cfg.dtype, cfg.causal, n, b)
                    problem = Problem(gpu=gpu, d=cfg.d, n=n, batch=b, heads=heads,
                                      kv_heads=kv_heads, dtype=cfg.dtype,
                                      causal=cfg.causal)  # fmt: skip
                    opts = MeasureOptions(timing=TimingOptions(target_ms=300),
                                          sdpa=key not in sdpa_done)  # fmt: skip
                    res = worker.measure(BenchJob.make(cfg, r.cubin, problem, opts))
                    row.update(status=str(res.status), ms=res.median_ms, tflops=res.tflops,
                               max_abs_err=res.max_abs_err, error=res.error)  # fmt: skip
                    sdpa = res.extra.get("sdpa")
                    if isinstance(sdpa, dict):
                        sdpa_done.add(key)
                        row["sdpa_ms"] = {k: v.get("median_ms") for k, v in sdpa.items()}
                else:
                    row["error"] = r.error
                rows.append(row)
                print(json.dumps(row), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "variants.json").write_text(json.dumps(rows, indent=1))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path, help="JSON with 'variants' and 'cases'")
    parser.add_argument("--out", type=Path, default=Path("variants-out"))
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=None, help="GQA: KV heads (default heads)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    spec = json.loads(args.spec.read_text())
    run(spec, args.out, args.device, args.batch, args.heads, args.kv_heads)


if __name__ == "__main__":
    main()
