"""What crosses the worker pipe: one measurement job, its options, and a failed result.

A job is a :class:`BenchJob` of typed, frozen, picklable values (a
:class:`~core.fa2_config.Fa2Config`, a cubin path, a :class:`~core.problem.Problem` and
:class:`MeasureOptions`); the parent sends it to the child as it is and gets a
:class:`~core.records.MeasureResult` back. The dict forms (:meth:`BenchJob.to_dict`,
:meth:`BenchJob.from_dict`) are JSON views for logs and for callers that hold a job as data;
nothing in the pipe uses them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.build_report import BuildReport
from core.family import AnyConfig, config_type
from core.problem import Problem
from core.records import MeasureResult, MeasureStatus
from measure.params import LAYOUTS, Layout
from measure.timing import TimingOptions


@dataclass(frozen=True)
class MeasureOptions:
    """How one job is measured.

    A handler other than the GPU one may take a subclass carrying its own settings (the
    tests' fake handler does); the worker only passes the value through.

    Attributes:
        layout: storage of q, k, v and O (``"bnhd"`` or ``"bhnd"``).
        timing: warm-up, repetition and L2-flush settings.
        sdpa: also time torch SDPA's flash, efficient and cuDNN backends on the same inputs
            (result in ``extra["sdpa"]``).
        recheck: verify the output again after timing (catches races that show only
            sometimes).
        seed: input seed; a fresh one per input set when ``None``.
        min_pairs: (batch, head) pairs the reference covers at least on problems past its
            budget (:func:`measure.reference.choose_pairs`; every pair below it).
        symbol: kernel symbol to launch instead of ``config.name`` (test kernels).
    """

    layout: Layout = "bnhd"
    timing: TimingOptions = field(default_factory=TimingOptions)
    sdpa: bool = False
    recheck: bool = True
    seed: int | None = None
    min_pairs: int = 3
    symbol: str | None = None

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "layout": self.layout,
            "timing": self.timing.to_dict(),
            "sdpa": self.sdpa,
            "recheck": self.recheck,
            "seed": self.seed,
            "min_pairs": self.min_pairs,
            "symbol": self.symbol,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MeasureOptions:
        """Build from :meth:`to_dict` output; unknown keys are ignored."""
        timing = data.get("timing")
        return cls(
            layout=data.get("layout", "bnhd"),
            timing=TimingOptions.from_dict(dict(timing)) if timing else TimingOptions(),
            sdpa=bool(data.get("sdpa", False)),
            recheck=bool(data.get("recheck", True)),
            seed=None if data.get("seed") is None else int(data["seed"]),
            min_pairs=int(data.get("min_pairs", 3)),
            symbol=data.get("symbol"),
        )


@dataclass(frozen=True)
class BenchJob:
    """One (config, cubin, problem) measurement request, sent to the worker as it is.

    Attributes:
        config: the kernel configuration.
        cubin: path of the cubin holding the kernel.
        problem: the problem to measure it on.
        options: how to measure.
    """

    config: AnyConfig
    cubin: str
    problem: Problem
    options: MeasureOptions = field(default_factory=MeasureOptions)

    @classmethod
    def make(
        cls,
        config: AnyConfig,
        cubin: str | Path,
        problem: Problem,
        options: MeasureOptions | None = None,
    ) -> BenchJob:
        """A job from its parts (the cubin path as a string; default options when ``None``)."""
        return cls(config, str(cubin), problem, options or MeasureOptions())

    @classmethod
    def from_build(
        cls, report: BuildReport, problem: Problem, options: MeasureOptions | None = None
    ) -> BenchJob:
        """A job for a build's cubin.

        Raises:
            ValueError: when the build has no cubin.
        """
        if report.cubin is None:
            raise ValueError(f"{report.config.name}: build {report.status} has no cubin")
        return cls.make(report.config, report.cubin, problem, options)

    def to_dict(self) -> dict[str, Any]:
        """JSON view: the config, problem and options as their ``to_dict()`` forms."""
        return {
            "config": {"family": self.config.family, **self.config.to_dict()},
            "cubin": self.cubin,
            "problem": self.problem.to_dict(),
            "options": self.options.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchJob:
        """Inverse of :meth:`to_dict` (options missing: the defaults).

        Raises:
            KeyError, TypeError, ValueError: when ``data`` is not a job.
        """
        return cls(
            config=_config_from_dict(dict(data["config"])),
            cubin=str(data["cubin"]),
            problem=Problem.from_dict(data["problem"]),
            options=MeasureOptions.from_dict(data.get("options") or {}),
        )


def _config_from_dict(data: dict[str, Any]) -> AnyConfig:
    # Dicts written before kernel families carry no family: they are mma.sync (fa2) configs.
    return config_type(str(data.pop("family", "fa2"))).from_dict(data)


def failure(status: MeasureStatus, error: str, **extra: Any) -> MeasureResult:
    """A result for a job that produced no timing; ``extra`` goes to ``MeasureResult.extra``."""
    return MeasureResult(status=status, error=error, extra=dict(extra))
