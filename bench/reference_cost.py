"""What checking every (batch, head) pair costs: the float32 reference of the largest
shipped problems, timed (measure.reference.make_inputset, once per problem in a campaign).

    PYTHONPATH=$PWD python bench/reference_cost.py
"""

from __future__ import annotations

import logging
import time

from core.problem import Problem
from core.variant import Variant

log = logging.getLogger("reference_cost")

PROBLEMS = [
    # Mistral-7B prefill, window 4096: the largest shipped problem (2^44 multiply-adds).
    Problem(gpu="H200", d=128, n=32768, batch=4, heads=32, kv_heads=8, dtype="bf16",
            causal=True, variant=Variant(window_left=4096, window_right=0)),
    Problem(gpu="H200", d=128, n=8192, batch=16, heads=32, kv_heads=8, dtype="bf16",
            causal=True),  # GQA prefill, B=16
    Problem(gpu="H200", d=256, n=16384, batch=2, heads=16, dtype="bf16"),
    Problem(gpu="H200", d=128, n=1, nk=131072, batch=64, heads=32, kv_heads=8, dtype="bf16"),
]  # fmt: skip


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
    import torch

    from measure.reference import make_inputset

    for p in PROBLEMS:
        torch.cuda.synchronize()
        start = time.perf_counter()
        inputs = make_inputset(p, "bnhd", seed=1)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        log.info("%s: %d of %d pairs, reference + yardstick in %.2f s, ref_err %.3g (%s)",
                 f"B={p.batch} H={p.heads}/{p.n_kv_heads} Nq={p.n} Nk={p.n_keys} D={p.d}",
                 len(inputs.pairs),
                 p.batch * p.heads, seconds, inputs.ref_err, inputs.ref_backend)  # fmt: skip
        del inputs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
