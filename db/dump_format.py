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
are :mod:`db.transfer`'s; the field types and limits the records are made of are
:mod:`db.dump_fields`'s.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Final, Literal, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StrictBool,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from core.build_report import BuildStatus
from core.config import Dtype
from core.family import AnyConfig, config_from_name, config_from_params
from core.gpu_name import normalize_gpu_name
from core.kv_lengths import KV_LENGTHS, check_kv_lengths, describe_kv_lengths
from core.problem import KV_PAGE_RULE, MAX_KV_PAGE, describe_kv_page, kv_page_error, kv_page_of
from core.problem import Problem as ProblemSpec
from core.records import MeasureStatus
from core.variant import SWITCHES, Variant, VariantError
from db.dump_fields import (
    ARCH_PATTERN,
    CC_PATTERN,
    INT32_MAX,
    INT64_MAX,
    MAX_CLOCK_SKEW,
    MAX_COMPILE_SECONDS,
    MAX_EXTRA_CHARS,
    MAX_TFLOPS,
    TFLOPS_TOLERANCE,
    ErrorFigure,
    ErrorText,
    GpuName,
    HeadDim,
    Integer,
    Number,
    OptionalInteger,
    OptionalNumber,
    Printable,
    Timestamp,
    error_text_field,
    int32_field,
    json_integer,
    json_object,
    text_field,
    time_field,
)
from db.models import utcnow

FORMAT: Final = "fa2tune-results"
FORMAT_VERSION: Final = 2  # 2: configs carry their kernel family and its params
_MAX_ERRORS_SHOWN = 10

GpuKey = tuple[str, str]
BuildKey = tuple[str, str, str]
#: A problem's attention variant as the store keys it: window left and right, chunk, whether a
#: softcap applies, sinks (:data:`db.models.VARIANT_KEY_COLUMNS`).
VariantKey = tuple[int, int, int, bool, bool]
#: The last items are the KV-cache layout (:attr:`core.problem.Problem.kv_page`; None: dense)
#: and its length pattern (:attr:`core.problem.Problem.kv_lengths`; ``full`` for a dense one).
ProblemKey = tuple[
    GpuKey, int, int, int, int, int, int, str, bool, tuple[int, ...], VariantKey, int | None, str
]
PLAIN_KEY: Final[VariantKey] = (-1, -1, 0, False, False)


def variant_key(variant: Variant) -> VariantKey:
    """The part of a :data:`ProblemKey` that is the problem's variant."""
    return (variant.window_left, variant.window_right, variant.chunk, variant.softcap > 0,
            variant.sinks)  # fmt: skip


class TransferError(ValueError):
    """A results file that cannot be ingested; the message says why, readably."""


class _Record(BaseModel):
    # Unknown fields are errors: a typo must not silently drop data. Non-finite error figures
    # (a wrong result's max error can be inf or NaN) travel as the strings "Infinity"/"NaN",
    # so the file stays standard JSON; the config is per model, hence set on the base.
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="strings")


class GpuRecord(_Record):
    """A GPU as the dump's producer last saw it.

    GPUs whose names give the same key (``core.gpu_name.normalize_gpu_name``) and the same
    compute capability are one GPU: the first record of them in the file is the one stored."""

    name: GpuName
    compute_capability: str = Field(
        pattern=CC_PATTERN, description='e.g. "9.0"', json_schema_extra={"maxLength": 7}
    )
    sm_count: Integer = int32_field(0, "multiprocessors; 0 for replayed, not measured, devices")
    driver_version: Printable = text_field(64, "driver version")
    cuda_version: Printable = text_field(64, "CUDA version")
    memory_bytes: Integer = Field(
        default=0, ge=0, le=INT64_MAX, description="device memory in bytes (64-bit)"
    )
    smem_optin_bytes: Integer = int32_field(0, "opt-in shared memory per block, bytes", 0)
    l2_bytes: Integer = Field(
        default=0, ge=0, le=INT64_MAX, description="L2 cache in bytes; 0 where not read"
    )

    @model_serializer(mode="wrap")
    def _without_unread_l2(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Written only where read: a dump of GPUs stored before the field came (0) reads, and
        # re-exports, as it did.
        out: dict[str, Any] = handler(self)
        if not self.l2_bytes:
            out.pop("l2_bytes", None)
        return out

    @property
    def key(self) -> GpuKey:
        return (normalize_gpu_name(self.name), self.compute_capability)


class ConfigRecord(_Record):
    """A config: its family, the three fields every family has, and the family's parameters.

    Format 1 files (before kernel families) wrote the fa2 family's parameters flat next to
    ``d``/``dtype``/``causal``; they are read as family ``fa2`` with those as ``params``.
    """

    family: Printable = Field(default="fa2", min_length=1, max_length=16)
    d: HeadDim
    dtype: Dtype
    causal: StrictBool
    params: dict[str, Integer | StrictBool | str]

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

    config_name: Printable = text_field(128, "the config's name; must match config")
    config: ConfigRecord
    arch: str = Field(pattern=ARCH_PATTERN, max_length=16, description='e.g. "sm_90a"')
    status: BuildStatus
    registers: OptionalInteger = int32_field(0, "registers per thread (ptxas)", None)
    spill_stores: Integer = int32_field(0, "spill store bytes (ptxas)", 0)
    spill_loads: Integer = int32_field(0, "spill load bytes (ptxas)", 0)
    stack_bytes: Integer = int32_field(0, "stack frame bytes (ptxas)", 0)
    static_smem: Integer = int32_field(0, "static shared memory bytes (ptxas)", 0)
    compile_seconds: Number = Field(
        default=0.0,
        ge=0,
        le=MAX_COMPILE_SECONDS,
        allow_inf_nan=False,
        description="wall time of the build, seconds (finite)",
    )
    source_hash: Printable = text_field(64, "hash of sources and flags", min_length=1)
    nvcc_version: Printable = text_field(256, "compiler release")
    flags: list[Annotated[Printable, Field(max_length=1024)]] = Field(
        default_factory=list, max_length=1024, description="nvcc flags (printable, one line each)"
    )
    error: ErrorText | None = error_text_field("build log of a failure")

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

    config_name: Printable = text_field(128, "the build's config name")
    arch: str = Field(pattern=ARCH_PATTERN, max_length=16)
    source_hash: Printable = text_field(64, "the build's source hash", min_length=1)

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
    """A problem on a GPU; ``nk`` and ``kv_heads`` are explicit; ``heads`` must be a multiple
    of ``kv_heads``. Lengths, batch and heads are the kernel's int32."""

    gpu: GpuName
    compute_capability: str = Field(pattern=CC_PATTERN, json_schema_extra={"maxLength": 7})
    d: HeadDim
    n: Integer = int32_field(1, "query sequence length")
    nk: Integer = int32_field(1, "key sequence length")
    batch: Integer = int32_field(1, "batch size")
    heads: Integer = int32_field(1, "query heads")
    kv_heads: Integer = int32_field(1, "key/value heads (a divisor of heads)")
    dtype: Dtype
    causal: StrictBool
    seqlens: list[Integer] | None = Field(
        default=None,
        description=(
            "a packed variable-length batch: each sequence's length (then n is the longest, "
            "batch the count and nk the total); null for a dense problem"
        ),
        json_schema_extra={"maxItems": 65536},
    )
    # The attention variant (core.variant), written only when it is not plain's, so files of
    # plain problems read and re-export as they did before variants.
    window_left: Integer = Field(
        default=-1,
        ge=-1,
        le=INT32_MAX,
        exclude_if=lambda v: v == -1,
        description="local attention: keys this far left of a query's position (-1: no bound)",
    )
    window_right: Integer = Field(
        default=-1,
        ge=-1,
        le=INT32_MAX,
        exclude_if=lambda v: v == -1,
        description="local attention: keys this far right of a query's position (-1: no "
        "bound; a causal window's is 0)",
    )
    chunk: Integer = Field(
        default=0,
        ge=0,
        le=INT32_MAX,
        exclude_if=lambda v: v == 0,
        description="chunked attention: keys only in the query position's chunk of this "
        "many (0: none)",
    )
    softcap: Number = Field(
        default=0.0,
        ge=0,
        allow_inf_nan=False,
        exclude_if=lambda v: v == 0,
        description="logit softcap (0: none); finite and >= 0",
    )
    sinks: StrictBool = Field(
        default=False, exclude_if=lambda v: not v,
        description="attention sinks: a per-head logit joins each row's softmax denominator",
    )  # fmt: skip
    # The KV-cache layout (core.problem.Problem.kv_page), written only for a cache problem, so
    # files of dense problems read and re-export as they did before cache problems.
    kv_page: OptionalInteger = Field(
        default=None,
        ge=0,
        le=MAX_KV_PAGE,
        exclude_if=lambda v: v is None,
        description=f"a KV-cache problem's layout, {KV_PAGE_RULE}: timed on the split-KV "
        "cache kernels with each sequence's length (nk) on the device; absent (null) for a "
        "dense problem",
    )
    # A cache problem's length pattern (core.problem.Problem.kv_lengths), written only when
    # not "full", so files written before patterns read and re-export byte for byte. A str
    # checked by the validator below (not a Literal), so a wrong pattern is one clear line.
    kv_lengths: str = Field(
        default="full",
        exclude_if=lambda v: v == "full",
        description=f"a KV-cache problem's length pattern, one of {', '.join(KV_LENGTHS)}: "
        f"full ({describe_kv_lengths('full')}, the default) or mixed "
        f"({describe_kv_lengths('mixed')}; core.kv_lengths); mixed needs kv_page",
        json_schema_extra={"enum": list(KV_LENGTHS)},
    )

    @model_validator(mode="after")
    def _gqa(self) -> Self:
        if self.heads % self.kv_heads:
            raise ValueError(
                f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        lens = self.seqlens
        if lens is not None and (
            not lens
            or min(lens) < 1
            or (self.n, self.batch, self.nk) != (max(lens), len(lens), sum(lens))
        ):
            raise ValueError(
                "seqlens must be lengths >= 1 with n = the longest, batch = their count and "
                f"nk = their total; got n={self.n}, batch={self.batch}, nk={self.nk}"
            )
        try:
            self.variant  # noqa: B018 - validates the combination
        except VariantError as exc:
            raise ValueError(str(exc)) from None
        if self.kv_page is not None:
            why = kv_page_error(self.kv_page)
            if why is not None:
                raise ValueError(why)
            if lens is not None:
                raise ValueError("a KV-cache problem (kv_page) takes no seqlens")
        check_kv_lengths(self.kv_lengths, self.kv_page)
        return self

    @property
    def variant(self) -> Variant:
        return Variant(self.window_left, self.window_right, self.chunk, self.softcap, self.sinks)

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
            tuple(self.seqlens or ()),
            variant_key(self.variant),
            self.kv_page,
            self.kv_lengths,
        )


class MeasurementRecord(_Record):
    """One measurement; error figures may be NaN/inf (wrong results), times may not.

    Rules across fields: an OK measurement has ``median_ms``; ``p10_ms <= median_ms <=
    p90_ms`` where present; ``tflops``, when given with ``median_ms``, is the median's
    throughput on the problem (4·B·H·N·Nk·D FLOPs, halved for causal, a ``mixed`` cache
    problem's over each sequence's own keys; within 0.1%), and that
    throughput is at most 10000 TFLOP/s; the build's d, dtype and causal are the problem's."""

    problem: ProblemRecord
    build: BuildRef
    status: MeasureStatus
    median_ms: OptionalNumber = time_field("median kernel time per launch")
    p10_ms: OptionalNumber = time_field("10th percentile time (<= median_ms)")
    p90_ms: OptionalNumber = time_field("90th percentile time (>= median_ms)")
    reps: Integer = int32_field(0, "timed launches", 0)
    tflops: OptionalNumber = Field(
        default=None,
        ge=0,
        le=MAX_TFLOPS,
        allow_inf_nan=False,
        description="throughput of median_ms on the problem, TFLOP/s",
    )
    max_abs_err: ErrorFigure = None
    rel_err: ErrorFigure = None
    ref_err: ErrorFigure = None
    driver_registers: OptionalInteger = int32_field(0, "registers per thread (driver)", None)
    driver_local_bytes: OptionalInteger = int32_field(
        0, "local memory bytes per thread (driver)", None
    )
    error: ErrorText | None = error_text_field("what went wrong")
    extra: dict[str, Any] | None = Field(
        default=None,
        description="free-form details (standard JSON: no NaN or Infinity; at most "
        f"{MAX_EXTRA_CHARS} characters as compact JSON)",
    )
    driver_version: Printable = text_field(64, "driver version when measured")
    cuda_version: Printable = text_field(64, "CUDA version when measured")
    sm_clock_mhz: OptionalInteger = int32_field(0, "SM clock when measured, MHz", None)
    mem_clock_mhz: OptionalInteger = int32_field(0, "memory clock when measured, MHz", None)
    trial_number: OptionalInteger = int32_field(0, "the tuner's trial number", None)
    created_at: Timestamp = Field(description="when measured (UTC when no offset is given)")

    @field_validator("extra")
    @classmethod
    def _standard_json(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return json_object(value, MAX_EXTRA_CHARS)

    @field_validator("created_at")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        # Naive timestamps are taken as UTC, which is what fa2tune writes.
        try:
            utc = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        except OverflowError:  # year 9999 with a negative offset, year 1 with a positive
            raise ValueError(f"{value.isoformat()} is out of range in UTC") from None
        latest = utcnow() + MAX_CLOCK_SKEW
        if utc > latest:
            raise ValueError(
                f"{utc.isoformat()} is in the future: a measurement's time may be at most "
                f"{MAX_CLOCK_SKEW.days} day past this machine's clock ({latest.isoformat()})"
            )
        return utc

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.status == MeasureStatus.OK and self.median_ms is None:
            raise ValueError("an OK measurement needs median_ms")
        self._times_ordered()
        self._throughput_agrees()
        config = self.build.config
        p = self.problem
        if (config.d, config.dtype, config.causal) != (p.d, p.dtype, p.causal):
            raise ValueError(
                f"build {self.build.config_name} does not fit the problem "
                f"(d={p.d}, dtype={p.dtype}, causal={p.causal})"
            )
        switches = config.variant_switches
        if {n: switches.get(n, False) for n in SWITCHES} != p.variant.needs:
            raise ValueError(
                f"build {self.build.config_name} is not built for the problem's attention "
                f"variant ({p.variant.describe()}): its variant switches must be what it needs"
            )
        if kv_page_of(config) != p.kv_page:
            raise ValueError(
                f"build {self.build.config_name} is not built for the problem's KV-cache "
                f"layout ({describe_kv_page(p.kv_page)}; it reads "
                f"{describe_kv_page(kv_page_of(config))})"
            )
        return self

    def _times_ordered(self) -> None:
        named = [("p10_ms", self.p10_ms), ("median_ms", self.median_ms), ("p90_ms", self.p90_ms)]
        present = [(name, value) for name, value in named if value is not None]
        for (lo_name, lo), (hi_name, hi) in itertools.pairwise(present):
            if lo > hi:
                raise ValueError(f"{lo_name} ({lo}) must not exceed {hi_name} ({hi})")

    def _throughput_agrees(self) -> None:
        if self.median_ms is None:
            return
        p = self.problem
        spec = (
            ProblemSpec.varlen(
                "", p.d, tuple(p.seqlens), heads=p.heads, kv_heads=p.kv_heads, dtype=p.dtype,
                causal=p.causal, variant=p.variant,
            )
            if p.seqlens is not None
            else ProblemSpec(
                gpu="", d=p.d, n=p.n, nk=p.nk, batch=p.batch, heads=p.heads,
                kv_heads=p.kv_heads, dtype=p.dtype, causal=p.causal, variant=p.variant,
                kv_page=p.kv_page, kv_lengths=p.kv_lengths,
            )
        )  # fmt: skip
        implied = spec.tflops(self.median_ms)
        if implied > MAX_TFLOPS:
            raise ValueError(
                f"median_ms ({self.median_ms}) implies {implied:.4g} TFLOP/s on this problem, "
                f"over the {MAX_TFLOPS:g} TFLOP/s any GPU can do"
            )
        if self.tflops is not None and abs(self.tflops - implied) > TFLOPS_TOLERANCE * implied:
            raise ValueError(
                f"tflops ({self.tflops}) is not the throughput of median_ms ({self.median_ms}) "
                f"on this problem ({implied:.6g} TFLOP/s): one measurement's figures must agree"
            )

    @property
    def key(self) -> tuple[ProblemKey, BuildKey, datetime, float | None]:
        return (self.problem.key, self.build.key, self.created_at, self.median_ms)


class DumpFile(_Record):
    """A results file: GPUs, builds, problems and measurements, all by natural keys."""

    format: Literal["fa2tune-results"] = FORMAT
    format_version: Annotated[Literal[1, 2], BeforeValidator(json_integer)] = FORMAT_VERSION
    generator: str = ""
    created_at: Timestamp = Field(default_factory=utcnow)
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
