"""Host time of one dense store lookup on the shipped results (what the torch op pays once per
new call shape): ``Store.best_for_shape`` over a fixed list of shapes, median of repeats.

Runs against whatever tree is on PYTHONPATH, so two trees compare on one machine:

    PYTHONPATH=<tree> python bench/lookup_cost.py --db /tmp/x.db
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from core.shape import Shape
from db.shipped import load_shipped_results
from db.store import Store

SHAPES = [
    ("fp16", False, Shape(4096, 4096, 2, 16, 16)),
    ("fp16", True, Shape(2048, 2048, 4, 32, 8)),
    ("bf16", True, Shape(1, 8192, 8, 32, 8)),
    ("fp16", False, Shape(1, 16384, 1, 32, 8)),
    ("bf16", False, Shape(3000, 3000, 2, 16, 16)),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--db", type=Path, required=True, help="a scratch SQLite file")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    with Store.from_url(f"sqlite:///{args.db}") as store:
        load_shipped_results(store)
        for dtype, causal, shape in SHAPES:  # warm the caches and connections once
            store.best_for_shape("H200", 128, dtype, causal, shape)
        times = []
        for _ in range(args.repeats):
            for dtype, causal, shape in SHAPES:
                start = time.perf_counter()
                store.best_for_shape("H200", 128, dtype, causal, shape)
                times.append(time.perf_counter() - start)
    ms = sorted(t * 1e3 for t in times)
    print(
        f"{len(ms)} lookups: median {statistics.median(ms):.2f} ms, "
        f"p10 {ms[len(ms) // 10]:.2f} ms, p90 {ms[9 * len(ms) // 10]:.2f} ms"
    )


if __name__ == "__main__":
    main()
