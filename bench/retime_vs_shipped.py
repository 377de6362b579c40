"""Shipped winners re-timed on today's tree, against the times they shipped with.

After a change to shared code (the attention variants touched every family's template and
the launch path), the plain kernels must not have become slower: their PTX is checked
byte for byte (bench/ptx_identity.py), and this script reads what the GPU says. Run a
campaign that measures each shipped winner once on the current tree::

    fa2tune --db sqlite:////tmp/retime.db tune --d 64,128 --n 1024,4096,16384 \\
        --dtype fp16,bf16 --causal no,yes --family fa2,fa3 \\
        --warm-start db/data/h200_results_families.json --warm-start-top 1 --trials 1 \\
        --summary-json retime.json

then compare its summary with the shipped file (CPU only, no torch)::

    python bench/retime_vs_shipped.py retime.json db/data/h200_results_families.json

The first file may also be that campaign's database dumped (``fa2tune dump``): its fastest
OK measurement per problem is then the re-timed one.

One row per problem of the summary: the shipped best config and time, the re-timed config
and time (the same config when the warm start measured it first), and their ratio; the
last line gives the spread of the ratios over the rows whose config is the shipped one.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
from pathlib import Path
from typing import Any

log = logging.getLogger("retime_vs_shipped")

#: The fields that name a problem in both a dump and a tune summary (absent: the default).
KEY_FIELDS = {
    "d": None, "n": None, "nk": None, "batch": None, "heads": None, "kv_heads": None,
    "dtype": None, "causal": None, "seqlens": None, "window_left": -1, "window_right": -1,
    "chunk": 0, "sinks": False,
}  # fmt: skip


def problem_key(problem: dict[str, Any]) -> tuple[Any, ...]:
    """A problem's identity: nk and kv_heads default to n and heads, as the store's do."""
    p = {k: problem.get(k, default) for k, default in KEY_FIELDS.items()}
    p["nk"] = p["nk"] if p["nk"] is not None else p["n"]
    p["kv_heads"] = p["kv_heads"] if p["kv_heads"] is not None else p["heads"]
    p["softcap"] = bool(problem.get("softcap") or 0.0)  # the switch, not the value
    return tuple(sorted(p.items()))


def shipped_best(paths: list[Path]) -> dict[tuple[Any, ...], tuple[str, float]]:
    """Per problem key, the fastest OK measurement of the dump files: (config, median ms)."""
    best: dict[tuple[Any, ...], tuple[str, float]] = {}
    for path in paths:
        for m in json.loads(path.read_text())["measurements"]:
            if m["status"] != "OK" or m["median_ms"] is None:
                continue
            key = problem_key(m["problem"])
            entry = (m["build"]["config_name"], float(m["median_ms"]))
            if key not in best or entry[1] < best[key][1]:
                best[key] = entry
    return best


def describe(problem: dict[str, Any]) -> str:
    mask = "causal" if problem["causal"] else "full"
    nk = problem.get("nk") or problem["n"]
    kv = problem.get("kv_heads") or problem["heads"]
    return (f"D={problem['d']} {problem['dtype']} {mask} B={problem['batch']} "
            f"H={problem['heads']}/{kv} N={problem['n']}x{nk}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "summary", type=Path, help="fa2tune tune --summary-json output, or its database dumped"
    )
    parser.add_argument("shipped", type=Path, nargs="+", help="results files (fa2tune dump)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    best = shipped_best(args.shipped)
    data = json.loads(args.summary.read_text())
    if "measurements" in data:  # a dump: per problem its fastest OK measurement
        retimed = shipped_best([args.summary])
        problems = {problem_key(m["problem"]): m["problem"] for m in data["measurements"]}
        rows = [{"problem": problems[k], "best_config": c, "best_ms": ms}
                for k, (c, ms) in retimed.items()]  # fmt: skip
    else:
        rows = data["problems"]
    print("| problem | shipped config | shipped ms | re-timed config | re-timed ms | ratio |")
    print("|---|---|---:|---|---:|---:|")
    same: list[float] = []
    for row in rows:
        problem, config, ms = row["problem"], row.get("best_config"), row.get("best_ms")
        old = best.get(problem_key(problem))
        if old is None or config is None or ms is None:
            log.warning("%s: nothing to compare (shipped %s, re-timed %s)",
                        describe(problem), old, config)  # fmt: skip
            continue
        ratio = ms / old[1]
        if config == old[0]:
            same.append(ratio)
        print(f"| {describe(problem)} | {old[0]} | {old[1]:.4f} | {config} | {ms:.4f} | "
              f"{ratio:.3f} |")  # fmt: skip
    if same:
        print(
            f"\nsame config re-timed: {len(same)} problems, ratio re-timed / shipped "
            f"min {min(same):.3f}, median {statistics.median(same):.3f}, max {max(same):.3f}"
        )
    else:
        print("\nno problem re-timed its shipped config")


if __name__ == "__main__":
    main()
