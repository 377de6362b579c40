"""Rows written with SQL, for migration tests: a database made by an older revision cannot
be written through today's models. The ``builds`` and ``measurements`` columns used here are
0001's, which no later revision changed."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import text

#: The timestamp of every raw row (naive UTC, as the store keeps them).
RAW_AT = "2026-12-01 00:00:00"


def insert_build_and_measurement(engine: Any, problem_id: int, config: Any, ms: float) -> None:
    """An OK sm_90 build of ``config`` (split-KV, D=128, fp16, unmasked) and one verified
    measurement of it on problem ``problem_id`` taking ``ms``."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO builds (config_key, config_name, family, d, dtype, causal, params, "
                "arch, status, registers, spill_stores, spill_loads, stack_bytes, static_smem, "
                "compile_seconds, source_hash, nvcc_version, flags, error, created_at) VALUES "
                "(:key, :name, 'splitkv', 128, 'fp16', false, :params, 'sm_90', 'OK', 168, 0, "
                "0, 0, 0, 1.0, 'h', 'v', '[]', NULL, :at)"
            ),
            {"key": config.key, "name": config.name, "params": json.dumps(config.params()),
             "at": RAW_AT},
        )  # fmt: skip
        conn.execute(
            text(
                "INSERT INTO measurements (problem_id, build_id, status, median_ms, reps, "
                "driver_version, cuda_version, created_at) SELECT :p, id, 'OK', :ms, 100, 'd', "
                "'c', :at FROM builds WHERE config_key = :key"
            ),
            {"p": problem_id, "ms": ms, "key": config.key, "at": RAW_AT},
        )
