"""bench/varlen_bench.py with each case's shipped pick among its candidates, so that its time
is in the row (``configs``) and the row names it (``shipped``): the bench's own tiles and
seeds miss some shipped picks (the causal bf16 one at its default lengths).

Run from the repository root, as bench/h200/summary_run.sh does::

    python bench/summary_varlen.py DB_URL OUT_DIR DTYPES
"""

from __future__ import annotations

import sys
from typing import Any

import varlen_bench as bench

from db.store import Store

own_candidates, own_case = bench.candidates, bench.run_case


def with_shipped(store: Store) -> Any:
    """varlen_bench.run_case, the case's shipped pick added to its candidates."""

    def run_case(
        lens: list[int], heads: int, kv: int, d: int, dtype: Any, causal: bool, fa3: bool
    ) -> dict[str, Any]:
        import torch

        gpu = torch.cuda.get_device_name()
        found = store.best_varlen(gpu, d, dtype, causal, lens, heads, kv)
        pick = found[0].config if found else None

        def candidates(*args: Any) -> list[Any]:
            configs = own_candidates(*args)
            return configs if pick is None or pick in configs else [*configs, pick]

        bench.candidates = candidates  # type: ignore[assignment]  # run_case looks it up
        row: dict[str, Any] = own_case(lens, heads, kv, d, dtype, causal, fa3)
        if found is not None:  # none shipped: the table counts the bench's fastest, and says so
            row.update(shipped=found[0].config.name, shipped_lengths=list(found[1]))
        return row

    return run_case


if __name__ == "__main__":
    db, out, dtypes = sys.argv[1:]
    bench.run_case = with_shipped(Store.from_url(db))  # main looks it up when called
    sys.argv = ["varlen_bench.py", "--out", out, "--dtype", dtypes]
    bench.main()
