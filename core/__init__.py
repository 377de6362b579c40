"""The shared floor: value types every stage reads and no stage owns.

Kernel configs, problems, build reports, measurement records and GPU descriptions are frozen
dataclasses passed between code generation, measurement, search, storage and the service.
This package imports nothing of the project (standard library only), so any stage may
import it without pulling in another stage.
"""

from __future__ import annotations

from core.build_report import BuildReport, BuildStatus
from core.config import DTYPES, ELEMENT_BYTES, HEAD_DIMS, Dtype
from core.fa2_config import Fa2Config
from core.problem import Problem
from core.records import GpuInfo, MeasureResult, MeasureStatus

__all__ = [
    "DTYPES",
    "ELEMENT_BYTES",
    "HEAD_DIMS",
    "BuildReport",
    "BuildStatus",
    "Dtype",
    "Fa2Config",
    "GpuInfo",
    "MeasureResult",
    "MeasureStatus",
    "Problem",
]
