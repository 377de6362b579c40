"""The results-file format: its pydantic records, its validation and reading a file.

A results file (``"format": "fa2tune-results"``, :data:`FORMAT_VERSION`) holds GPUs, builds,
problems and measurements, each referring to the others by natural keys, never by database
ids: GPUs by (name, compute capability), builds by (config name, arch, source hash), problems
by their full shape on a GPU (:data:`GpuKey`, :data:`BuildKey`, :data:`ProblemKey`).

Contract: a :class:`DumpFile` that exists is valid as a whole: unknown fields, out-of-range
figures, a config name that does not match its config, a measurement that does not fit its
problem and references that do not resolve inside the file are all refused.
:func:`parse_dump` and :func:`load_dump` turn every such refusal (and unreadable or non-JSON
input) into one :class:`TransferError` whose message lists the problems by location. Format 1
files (before kernel families) are still read. Writing a database out and reading a file in
are :mod:`db.transfer`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from core.build_report import BuildStatus
from core.config import Dtype
from core.family import AnyConfig, config_from_name, config_from_params
from core.gpu_name import normalize_gpu_name
from core.records import MeasureStatus
from db.models import utcnow

FORMAT: Final = "fa2tune-results"
FORMAT_VERSION: Final = 2  # 2: configs carry their kernel family and its params
_MAX_ERRORS_SHOWN = 10

GpuKey = tuple[str, str]
BuildKey = tuple[str, str, str]
ProblemKey = tuple[GpuKey, int, int, int, int, int, int, str, bool]


class TransferError(ValueError):
    """A results file that cannot be ingested; the message says why, readably."""


class _Record(BaseModel):
    # Unknown fields are errors: a typo must not silently drop data. Non-finite error figures
    # (a wrong result's max error can be inf or NaN) travel as the strings "Infinity"/"NaN",
    # so the file stays standard JSON; the config is per model, hence set on the base.
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="strings")


class GpuRecord(_Record):
    """A GPU as the dump's producer last saw it."""

    name: str = Field(min_length=1, max_length=128)
    compute_capability: str = Field(pattern=r"^\d+\.\d+$")
    sm_count: int = Field(ge=0)  # 0 for replayed, not measured, devices
    driver_version: str = Field(max_length=64)
    cuda_version: str = Field(max_length=64)
    memory_bytes: int = Field(default=0, ge=0)
    smem_optin_bytes: int = Field(default=0, ge=0)

    @property
    def key(self) -> GpuKey:
        return (normalize_gpu_name(self.name), self.compute_capability)


class ConfigRecord(_Record):
    """A config: its family, the three fields every family has, and the family's parameters.

    Format 1 files (before kernel families) wrote the fa2 family's parameters flat next to
    ``d``/``dtype``/``causal``; they are read as family ``fa2`` with those as ``params``.
    """

    family: str = Field(default="fa2", min_length=1, max_length=16)
    d: int = Field(ge=1)
    dtype: Dtype
    causal: bool
    params: dict[str, StrictInt | StrictBool | str]

    @model_validator(mode="before")
    @classmethod
    def _format_1(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "params" not in data:
            common = {"family", "d", "dtype", "causal"}
            return {
                **{k: v for k, v in data.items() if k in common},
                "params": {k: v for k, v in data.items() if k not in common},
            }
        return data

    @model_validator(mode="after")
    def _valid_for_family(self) -> Self:
        self.to_config()  # UnknownFamilyError/ValueError name the family and the parameter
        return self

    def to_config(self) -> AnyConfig:
        return config_from_params(self.family, self.d, self.dtype, self.causal, self.params)

    @classmethod
    def of(cls, config: AnyConfig) -> ConfigRecord:
        return cls(
            family=config.family,
            d=config.d,
            dtype=config.dtype,
            causal=config.causal,
            params=config.params(),
        )


class BuildRecord(_Record):
    """A build with ptxas's report (cubin paths are machine-local and not carried)."""

    config_name: str
    config: ConfigRecord
    arch: str = Field(pattern=r"^sm_\d+[a-z]?$")
    status: BuildStatus
    registers: int | None = Field(default=None, ge=0)
    spill_stores: int = Field(default=0, ge=0)
    spill_loads: int = Field(default=0, ge=0)
    stack_bytes: int = Field(default=0, ge=0)
    static_smem: int = Field(default=0, ge=0)
    compile_seconds: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    source_hash: str = Field(min_length=1, max_length=64)
    nvcc_version: str = Field(max_length=256)
    flags: list[str] = Field(default_factory=list)
    error: str | None = None

    @model_validator(mode="after")
    def _name_matches_config(self) -> Self:
        expected = self.config.to_config().name
        if self.config_name != expected:
            raise ValueError(f"config_name {self.config_name!r} does not match config ({expected})")
        return self

    @property
    def key(self) -> BuildKey:
        return (self.config.to_config().key, self.arch, self.source_hash)


class BuildRef(_Record):
    """A measurement's reference to a build in the same file."""

    config_name: str
    arch: str
    source_hash: str

    @field_validator("config_name")
    @classmethod
    def _parses(cls, value: str) -> str:
        config_from_name(value)  # ValueError with an example of a valid name
        return value

    @property
    def config(self) -> AnyConfig:
        return config_from_name(self.config_name)

    @property
    def key(self) -> BuildKey:
        return (self.config.key, self.arch, self.source_hash)


class ProblemRecord(_Record):
    """A problem on a GPU; ``nk`` and ``kv_heads`` are explicit."""

    gpu: str = Field(min_length=1, max_length=128)
    compute_capability: str = Field(pattern=r"^\d+\.\d+$")
    d: int = Field(ge=1)
    n: int = Field(ge=1)
    nk: int = Field(ge=1)
    batch: int = Field(ge=1)
    heads: int = Field(ge=1)
    kv_heads: int = Field(ge=1)
    dtype: Dtype
    causal: bool

    @model_validator(mode="after")
    def _gqa(self) -> Self:
        if self.heads % self.kv_heads:
            raise ValueError(
                f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        return self

    @property
    def gpu_key(self) -> GpuKey:
        return (normalize_gpu_name(self.gpu), self.compute_capability)

    @property
    def key(self) -> ProblemKey:
        return (
            self.gpu_key,
            self.d,
            self.n,
            self.nk,
            self.batch,
            self.heads,
            self.kv_heads,
            self.dtype,
            self.causal,
        )


_Time = Field(default=None, gt=0, allow_inf_nan=False)


class MeasurementRecord(_Record):
    """One measurement; error figures may be NaN/inf (wrong results), times may not."""

    problem: ProblemRecord
    build: BuildRef
    status: MeasureStatus
    median_ms: float | None = _Time
    p10_ms: float | None = _Time
    p90_ms: float | None = _Time
    reps: int = Field(default=0, ge=0)
    tflops: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    max_abs_err: float | None = None
    rel_err: float | None = None
    ref_err: float | None = None
    driver_registers: int | None = Field(default=None, ge=0)
    driver_local_bytes: int | None = Field(default=None, ge=0)
    error: str | None = None
    extra: dict[str, Any] | None = None
    driver_version: str = Field(max_length=64)
    cuda_version: str = Field(max_length=64)
    sm_clock_mhz: int | None = Field(default=None, ge=0)
    mem_clock_mhz: int | None = Field(default=None, ge=0)
    trial_number: int | None = Field(default=None, ge=0)
    created_at: datetime

    @field_validator("created_at")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        # Naive timestamps are taken as UTC, which is what fa2tune writes.
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.status == MeasureStatus.OK and self.median_ms is None:
            raise ValueError("an OK measurement needs median_ms")
        config = self.build.config
        p = self.problem
        if (config.d, config.dtype, config.causal) != (p.d, p.dtype, p.causal):
            raise ValueError(
                f"build {self.build.config_name} does not fit the problem "
                f"(d={p.d}, dtype={p.dtype}, causal={p.causal})"
            )
        return self

    @property
    def key(self) -> tuple[ProblemKey, BuildKey, datetime, float | None]:
        return (self.problem.key, self.build.key, self.created_at, self.median_ms)


class DumpFile(_Record):
    """A results file: GPUs, builds, problems and measurements, all by natural keys."""

    format: Literal["fa2tune-results"] = FORMAT
    format_version: Literal[1, 2] = FORMAT_VERSION
    generator: str = ""
    created_at: datetime = Field(default_factory=utcnow)
    gpus: list[GpuRecord] = Field(default_factory=list)
    builds: list[BuildRecord] = Field(default_factory=list)
    problems: list[ProblemRecord] = Field(default_factory=list)
    measurements: list[MeasurementRecord] = Field(default_factory=list)

    @model_validator(mode="after")
    def _references_resolve(self) -> Self:
        gpus = {g.key for g in self.gpus}
        builds = {b.key for b in self.builds}
        problems = {p.key for p in self.problems}
        errors: list[str] = []
        for i, p in enumerate(self.problems):
            if p.gpu_key not in gpus:
                errors.append(f"problems.{i}: GPU {p.gpu!r} ({p.compute_capability}) not in gpus")
        for i, m in enumerate(self.measurements):
            if m.problem.key not in problems:
                errors.append(f"measurements.{i}: problem not in problems")
            if m.build.key not in builds:
                errors.append(
                    f"measurements.{i}: build {m.build.config_name} ({m.build.arch}, "
                    f"{m.build.source_hash}) not in builds"
                )
            if len(errors) >= _MAX_ERRORS_SHOWN:
                break
        if errors:
            raise ValueError("unresolved references: " + "; ".join(errors))
        return self


def _describe(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    lines = [f"invalid results file ({len(errors)} error{'s' if len(errors) != 1 else ''}):"]
    for err in errors[:_MAX_ERRORS_SHOWN]:
        location = ".".join(str(part) for part in err["loc"]) or "(file)"
        lines.append(f"  {location}: {err['msg']}")
    if len(errors) > _MAX_ERRORS_SHOWN:
        lines.append(f"  ... and {len(errors) - _MAX_ERRORS_SHOWN} more")
    return "\n".join(lines)


def parse_dump(data: bytes | str | Mapping[str, Any]) -> DumpFile:
    """Validate a results file given as JSON text/bytes or as already-decoded data.

    Raises:
        TransferError: the data is not valid JSON or not a valid results file; the message
            lists the problems by location (e.g. ``measurements.3.median_ms``).
    """
    try:
        if isinstance(data, bytes | str):
            return DumpFile.model_validate_json(data)
        return DumpFile.model_validate(data)
    except ValidationError as exc:
        raise TransferError(_describe(exc)) from exc


def load_dump(path: Path) -> DumpFile:
    """Read and validate a results file.

    Raises:
        TransferError: unreadable or invalid file.
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TransferError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return parse_dump(raw)
