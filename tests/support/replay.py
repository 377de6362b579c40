"""A synthetic but structured replay table, shared by the search, campaign and replay tests.

Time is a smooth product of per-parameter factors, so there is one best config and the
parameters carry signal a model-based sampler can learn; some configs fail at build time
(spills, compile failures) or verification (wrong results).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path

from codegen.families.fa2.space import enumerate_space
from core.fa2_config import Fa2Config
from core.problem import Problem
from core.records import GpuInfo
from db.store import Store
from tuner.replay_table import ReplayEntry, ReplayTable
from tuner.search import params_of

GPU = GpuInfo(
    name="Test GPU",
    compute_capability="9.0",
    sm_count=132,
    driver_version="560.0",
    cuda_version="12.6",
    memory_bytes=141 * 2**30,
    smem_optin_bytes=227 * 1024,
)

LAYOUT_FACTOR = {"swz": 0.97, "pad8": 1.0, "pad16": 1.03, "pad0": 1.25}


def _layout(config: Fa2Config) -> object:
    return params_of(config)["layout"]


def small_space(d: int = 64, causal: bool = False) -> list[Fa2Config]:
    """A slice of the real space: ~two dozen configs."""
    return [
        c
        for c in enumerate_space(d, "fp16", causal)
        if c.br in (64, 128) and c.bc in (64, 128) and c.stages in (1, 2)
        and _layout(c) in ("pad8", "swz", "pad0")
    ]  # fmt: skip


def tiny_space(d: int = 64, causal: bool = False) -> list[Fa2Config]:
    """Two stages only: ~two dozen configs with every kind of failure, for quick campaigns."""
    return [c for c in small_space(d, causal) if c.stages == 2]


def medium_space(d: int = 64, causal: bool = False) -> list[Fa2Config]:
    """A larger slice, ~100 configs, for sampler comparisons."""
    return [c for c in enumerate_space(d, "fp16", causal) if c.stages <= 2 and c.br <= 128]


def synthetic_time(config: Fa2Config, n: int) -> float:
    """Milliseconds: a smooth function of the parameters, best at 128x64/16rpw/2st/swz."""
    t = (n / 1024) ** 2 * 0.05
    t *= 1 + 0.18 * abs(math.log2(config.br / 128))
    t *= 1 + 0.11 * abs(math.log2(config.bc / 64))
    t *= 1.0 if config.rows_per_warp == 16 else 1.09
    t *= 1.0 if config.stages == 2 else 1.06
    t *= LAYOUT_FACTOR[_layout(config)]
    return t


def synthetic_entry(config: Fa2Config, n: int) -> ReplayEntry:
    """Failures on structured corners, never on the best config."""
    if config.bc >= 128 and config.rows_per_warp == 32:
        # A heavy spill, over the default limit: recorded untimed.
        return ReplayEntry(status="SPILLS", build_status="SPILLS", spill_bytes=512)
    if config.br == 64 and config.bc == 128 and _layout(config) == "pad0":
        return ReplayEntry(status="COMPILE_FAILED", build_status="COMPILE_FAILED")
    if _layout(config) == "pad0" and config.stages == 2:
        return ReplayEntry(status="WRONG_RESULT", build_status="OK")
    return ReplayEntry(status="OK", median_ms=synthetic_time(config, n), build_status="OK")


def problems_for(ns: Iterable[int], d: int = 64, causal: bool = False) -> list[Problem]:
    return [Problem(gpu=GPU.name, d=d, n=n, causal=causal) for n in ns]


def synthetic_table(
    problems: Iterable[Problem],
    space: list[Fa2Config] | Callable[[int, bool], list[Fa2Config]] = small_space,
) -> ReplayTable:
    """The synthetic table of ``problems`` over ``space`` (a list, or a function of D and
    causal)."""
    studies = {}
    by_study = {}
    for p in problems:
        configs = space(p.d, p.causal) if callable(space) else space
        studies[p.study_name] = {c.name: synthetic_entry(c, p.n) for c in configs}
        by_study[p.study_name] = p
    return ReplayTable(studies=studies, problems=by_study, gpu=GPU, arch="sm_90")


def open_store(tmp_path: Path) -> Store:
    return Store.from_url(f"sqlite:///{tmp_path / 'results.db'}")


def optuna_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'studies.db'}"
