"""bench/retime_vs_shipped.py: re-timed winners set against the shipped file's times (CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "retime_vs_shipped.py"


def _problem(n: int, **extra: Any) -> dict[str, Any]:
    return {"gpu": "NVIDIA H200", "d": 128, "n": n, "batch": 2, "heads": 16, "dtype": "bf16",
            "causal": True, "seqlens": None, **extra}  # fmt: skip


def _measurement(
    problem: dict[str, Any], config: str, ms: float | None, status: str = "OK"
) -> dict[str, Any]:
    return {"problem": problem, "build": {"config_name": config}, "status": status,
            "median_ms": ms}  # fmt: skip


def test_ratios_against_the_fastest_ok_shipped_measurement(tmp_path: Path) -> None:
    shipped = {"measurements": [
        _measurement(_problem(4096), "a", 2.0),
        _measurement(_problem(4096), "b", 1.0),  # the fastest OK one is the shipped winner
        _measurement(_problem(4096), "c", 0.1, status="WRONG"),  # never a winner
        _measurement(_problem(8192, nk=8192, kv_heads=16), "d", 4.0),  # explicit defaults
        _measurement(_problem(8192, window_left=128, window_right=0), "e", 1.0),  # a variant
    ]}  # fmt: skip
    summary = {"problems": [
        {"problem": _problem(4096), "best_config": "b", "best_ms": 1.1},
        {"problem": _problem(8192), "best_config": "d", "best_ms": 3.6},
        {"problem": _problem(2048), "best_config": "z", "best_ms": 1.0},  # not shipped
    ]}  # fmt: skip
    (tmp_path / "shipped.json").write_text(json.dumps(shipped))
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "summary.json"),
         str(tmp_path / "shipped.json")],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| D=")]
    assert len(rows) == 2
    assert "| b | 1.0000 | b | 1.1000 | 1.100 |" in rows[0]
    assert "| d | 4.0000 | d | 3.6000 | 0.900 |" in rows[1]
    assert "2 problems, ratio re-timed / shipped min 0.900, median 1.000, max 1.100" in proc.stdout
    assert "nothing to compare" in proc.stderr  # the N=2048 problem
