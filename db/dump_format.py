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

import itertools
import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Final, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from core.build_report import BuildStatus
from core.config import HEAD_DIMS, HEAD_DIMS_RULE, Dtype
from core.family import AnyConfig, config_from_name, config_from_params
from core.gpu_name import normalize_gpu_name
from core.problem import Problem as ProblemSpec
from core.records import MeasureStatus
from db.models import utcnow

FORMAT: Final = "fa2tune-results"
FORMAT_VERSION: Final = 2  # 2: configs carry their kernel family and its params
_MAX_ERRORS_SHOWN = 10

#: The largest value of an ``Integer`` column (32-bit signed on PostgreSQL), and the kernel's
#: limit on sequence lengths, batch and heads (``FaParams`` holds them as int32).
INT32_MAX: Final = 2**31 - 1
#: The largest value of a ``BigInteger`` column (64-bit signed).
INT64_MAX: Final = 2**63 - 1
#: The longest time a measurement may report, in milliseconds (over 16 minutes per launch).
MAX_MS: Final = 1e6
#: The highest throughput a measurement may imply, in TFLOP/s (10 PFLOP/s: ten times a B200).
MAX_TFLOPS: Final = 1e4
#: How far a recorded ``tflops`` may be from the one its median gives (relative).
TFLOPS_TOLERANCE: Final = 1e-3
#: The longest compile time a build may report, in seconds.
MAX_COMPILE_SECONDS: Final = 1e6
MAX_GPU_NAME: Final = 128  # the gpus.name column

GpuKey = tuple[str, str]
BuildKey = tuple[str, str, str]
ProblemKey = tuple[GpuKey, int, int, int, int, int, int, str, bool, tuple[int, ...]]


class TransferError(ValueError):
    """A results file that cannot be ingested; the message says why, readably."""


# ---------------------------------------------------------------------- field rules
# Each rule is stated in the field's JSON schema (a description, and a pattern/bounds where
# JSON Schema can say it), which POST /v1/results publishes as the DumpFile schema, and is
# enforced by the validator next to it with a message that says what is wrong.

#: What single-line text must not contain: control characters (C0 with NUL and newline, DEL,
#: C1), line and paragraph separators, zero-width and bidirectional format characters (which
#: reorder what a reader sees in a comment). One class, used both by the validator and in the
#: ``pattern`` the JSON schema states, so the two agree.
_CONTROL = (
    r"\x00-\x1f\x7f-\x9f\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064"
    r"\u2066-\u206f\ufeff\ufff9-\ufffb"
)
#: Lone surrogates are refused too, but only by the validator: ECMA-262 and Rust regexes (what
#: OpenAPI tools compile ``pattern`` with) cannot name a surrogate range, and would drop the
#: whole pattern; a JSON string can only carry one as a lone ``\udXXX`` escape anyway.
_SURROGATES = r"\ud800-\udfff"
_PRINTABLE_PATTERN = f"^[^{_CONTROL}]*$"
_NOT_PRINTABLE = re.compile(f"[{_CONTROL}{_SURROGATES}]")


def _printable(value: str) -> str:
    """One line of printable text (see :data:`_CONTROL`)."""
    bad = _NOT_PRINTABLE.search(value)
    if bad is not None:
        raise ValueError(
            f"must be printable text on one line; contains {bad[0]!r} (U+{ord(bad[0]):04X})"
        )
    return value


def _no_nul(value: str) -> str:
    # PostgreSQL text cannot hold NUL; anything else (newlines in a compiler log) is fine.
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


def _gpu_name(value: str) -> str:
    _printable(value)
    value = value.strip()
    if not value:
        raise ValueError("must not be blank")
    if not normalize_gpu_name(value):
        raise ValueError(
            f"{value!r} names no GPU: it needs a letter or digit besides a leading 'NVIDIA' "
            "(GPU names are matched by their letters and digits)"
        )
    return value


# ---------------------------------------------------------------------- JSON types
# pydantic's lax mode takes JSON true/false and numeric strings for numbers ("smem_optin_bytes":
# false was stored as 0), numbers for booleans and timestamps: values the published schema
# calls invalid. These checks run first and refuse them; what is left is converted as before.
# An integral float (5.0) stays an integer: JSON Schema's "integer" is any number with a zero
# fractional part, and OpenAPI tools send such numbers as valid integers.


def _json_integer(value: object) -> object:
    # None passes: the optional fields' type says whether it is allowed.
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return value


def _json_number(value: object) -> object:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise PydanticCustomError("float_type", "Input should be a valid number")
    return value


#: The strings a non-finite error figure is written as (``ser_json_inf_nan="strings"``).
_NON_FINITE = ("NaN", "Infinity", "-Infinity")


def _json_error_figure(value: object) -> object:
    if value is None or value in _NON_FINITE:
        return value
    return _json_number(value)


def _json_timestamp(value: object) -> object:
    # A datetime: what fa2tune's own code passes when it builds records.
    if not isinstance(value, str | datetime):
        raise PydanticCustomError("datetime_type", "Input should be a valid datetime string")
    return value


#: An integer: a JSON integer or integral number, not a boolean or a string.
Integer = Annotated[int, BeforeValidator(_json_integer)]
#: A number: a JSON number, not a boolean or a string.
Number = Annotated[float, BeforeValidator(_json_number)]
# The optional ones check the whole union: a field's bounds on ``Integer | None`` would be
# published under pydantic's names (ge, le) instead of JSON Schema's (minimum, maximum).
OptionalInteger = Annotated[int | None, BeforeValidator(_json_integer)]
OptionalNumber = Annotated[float | None, BeforeValidator(_json_number)]
#: A timestamp: an ISO 8601 string, not a number of seconds.
Timestamp = Annotated[datetime, BeforeValidator(_json_timestamp)]


def _error_figure(value: float | None) -> float | None:
    if value is not None and not math.isnan(value) and value < 0:
        raise ValueError(f"must not be negative (got {value})")
    return value


def _head_dim(value: int) -> int:
    if value not in HEAD_DIMS:
        raise ValueError(f"must be a supported head dim ({HEAD_DIMS_RULE}), got {value}")
    return value


def _json_object(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is not None:
        try:
            json.dumps(value, allow_nan=False)
        except ValueError:
            raise ValueError("must be standard JSON (no NaN or Infinity)") from None
    return value


_ALNUM = frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


def _char_class(chars: frozenset[str]) -> str:
    """``[...]`` matching exactly ``chars`` (ASCII letters and digits), as ranges."""
    codes = sorted(map(ord, chars))
    runs: list[list[int]] = []
    for code in codes:
        if runs and code == runs[-1][1] + 1:
            runs[-1][1] = code
        else:
            runs.append([code, code])
    body = "".join(chr(lo) if lo == hi else f"{chr(lo)}-{chr(hi)}" for lo, hi in runs)
    return f"[{body}]"


def _other_word(word: str) -> str:
    """A regex for a run of ASCII letters and digits that is not ``word`` in any case.

    Spelled out (shorter, longer, or first differing at each position) rather than with a
    lookahead or ``(?i)``, which not every regex engine behind OpenAPI tools supports."""
    any_char = _char_class(_ALNUM)
    n = len(word)
    alternatives = [f"{any_char}{{1,{n - 1}}}", f"{any_char}{{{n + 1},}}"]
    for i, letter in enumerate(word):
        same = "".join(_char_class(frozenset({c.lower(), c.upper()})) for c in word[:i])
        other = _char_class(_ALNUM - {letter.lower(), letter.upper()})
        left = n - i - 1
        rest = "" if left == 0 else any_char if left == 1 else f"{any_char}{{{left}}}"
        alternatives.append(f"{same}{other}{rest}")
    return f"(?:{'|'.join(alternatives)})"


def _gpu_name_pattern() -> str:
    """The GPU-name rule of :func:`_gpu_name` as a regex: printable on one line, and with an
    ASCII letter or digit that :func:`core.gpu_name.normalize_gpu_name` keeps, i.e. either a
    first word (run of ASCII letters and digits) other than "nvidia", or a second word."""
    word_char = _char_class(_ALNUM)
    separator = f"[^0-9A-Za-z{_CONTROL}]"  # printable, and not a letter or digit
    printable = f"[^{_CONTROL}]"
    first_word_not_nvidia = f"{separator}*{_other_word('nvidia')}(?:{separator}{printable}*)?"
    two_words = f"{printable}*{word_char}{separator}+{word_char}{printable}*"
    return f"^(?:{first_word_not_nvidia}|{two_words})$"


#: The published pattern of a GPU name; tests/test_ingest_strict.py checks that it accepts
#: exactly what :func:`_gpu_name` accepts.
GPU_NAME_PATTERN: Final = _gpu_name_pattern()

#: A GPU name as its driver reports it (stored stripped of surrounding blanks).
GpuName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_GPU_NAME,
        description=(
            "GPU name as the driver reports it: at most 128 characters, printable on one line "
            "(no control characters such as NUL or newline, no line separators, zero-width or "
            "bidirectional format characters), not blank, and with a letter or "
            "digit besides a leading 'NVIDIA'. Names are matched by their letters and "
            "digits, case-insensitively, without a leading 'NVIDIA': 'NVIDIA H200', "
            "'nvidia-h200' and 'H200' are one GPU."
        ),
        json_schema_extra={"pattern": GPU_NAME_PATTERN},
    ),
    AfterValidator(_gpu_name),
]


def _text(max_length: int, description: str, *, min_length: int = 0) -> Any:
    """A bounded single-line printable string field."""
    return Field(
        min_length=min_length,
        max_length=max_length,
        description=f"{description} (at most {max_length} printable characters, one line)",
        json_schema_extra={"pattern": _PRINTABLE_PATTERN},
    )


Printable = Annotated[str, AfterValidator(_printable)]
NoNul = Annotated[str, AfterValidator(_no_nul)]
ErrorFigure = Annotated[
    float | None,
    BeforeValidator(_json_error_figure),
    AfterValidator(_error_figure),
    # Stated in full: the strings are part of the format, which float | None does not say.
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "minimum": 0},
                {"enum": ["NaN", "Infinity"]},
                {"type": "null"},
            ]
        }
    ),
    Field(
        default=None,
        description='non-negative; "NaN" or "Infinity" (as strings) for a wrong result',
    ),
]
HeadDim = Annotated[
    Integer,
    Field(description=f"head dim, {HEAD_DIMS_RULE}", json_schema_extra={"enum": list(HEAD_DIMS)}),
    AfterValidator(_head_dim),
]


def _int32(minimum: int, description: str, default: Any = ...) -> Any:
    return Field(default, ge=minimum, le=INT32_MAX, description=description)


_CC_PATTERN = r"^[0-9]{1,3}\.[0-9]{1,3}$"
_ARCH_PATTERN = r"^sm_[0-9]{2,4}[a-z]?$"


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
        pattern=_CC_PATTERN, description='e.g. "9.0"', json_schema_extra={"maxLength": 7}
    )
    sm_count: Integer = _int32(0, "multiprocessors; 0 for replayed, not measured, devices")
    driver_version: Printable = _text(64, "driver version")
    cuda_version: Printable = _text(64, "CUDA version")
    memory_bytes: Integer = Field(
        default=0, ge=0, le=INT64_MAX, description="device memory in bytes (64-bit)"
    )
    smem_optin_bytes: Integer = _int32(0, "opt-in shared memory per block, bytes", 0)

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

    config_name: Printable = _text(128, "the config's name; must match config")
    config: ConfigRecord
    arch: str = Field(pattern=_ARCH_PATTERN, max_length=16, description='e.g. "sm_90a"')
    status: BuildStatus
    registers: OptionalInteger = _int32(0, "registers per thread (ptxas)", None)
    spill_stores: Integer = _int32(0, "spill store bytes (ptxas)", 0)
    spill_loads: Integer = _int32(0, "spill load bytes (ptxas)", 0)
    stack_bytes: Integer = _int32(0, "stack frame bytes (ptxas)", 0)
    static_smem: Integer = _int32(0, "static shared memory bytes (ptxas)", 0)
    compile_seconds: Number = Field(
        default=0.0,
        ge=0,
        le=MAX_COMPILE_SECONDS,
        allow_inf_nan=False,
        description="wall time of the build, seconds (finite)",
    )
    source_hash: Printable = _text(64, "hash of sources and flags", min_length=1)
    nvcc_version: Printable = _text(256, "compiler release")
    flags: list[Annotated[Printable, Field(max_length=1024)]] = Field(
        default_factory=list, max_length=1024, description="nvcc flags (printable, one line each)"
    )
    error: NoNul | None = Field(default=None, description="build log of a failure (no NUL)")

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

    config_name: Printable = _text(128, "the build's config name")
    arch: str = Field(pattern=_ARCH_PATTERN, max_length=16)
    source_hash: Printable = _text(64, "the build's source hash", min_length=1)

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
    compute_capability: str = Field(pattern=_CC_PATTERN, json_schema_extra={"maxLength": 7})
    d: HeadDim
    n: Integer = _int32(1, "query sequence length")
    nk: Integer = _int32(1, "key sequence length")
    batch: Integer = _int32(1, "batch size")
    heads: Integer = _int32(1, "query heads")
    kv_heads: Integer = _int32(1, "key/value heads (a divisor of heads)")
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
            tuple(self.seqlens or ()),
        )


def _time(description: str) -> Any:
    return Field(
        default=None,
        gt=0,
        le=MAX_MS,
        allow_inf_nan=False,
        description=f"{description}, milliseconds: finite, > 0 and <= {MAX_MS:g}",
    )


class MeasurementRecord(_Record):
    """One measurement; error figures may be NaN/inf (wrong results), times may not.

    Rules across fields: an OK measurement has ``median_ms``; ``p10_ms <= median_ms <=
    p90_ms`` where present; ``tflops``, when given with ``median_ms``, is the median's
    throughput on the problem (4·B·H·N·Nk·D FLOPs, halved for causal, within 0.1%), and that
    throughput is at most 10000 TFLOP/s; the build's d, dtype and causal are the problem's."""

    problem: ProblemRecord
    build: BuildRef
    status: MeasureStatus
    median_ms: OptionalNumber = _time("median kernel time per launch")
    p10_ms: OptionalNumber = _time("10th percentile time (<= median_ms)")
    p90_ms: OptionalNumber = _time("90th percentile time (>= median_ms)")
    reps: Integer = _int32(0, "timed launches", 0)
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
    driver_registers: OptionalInteger = _int32(0, "registers per thread (driver)", None)
    driver_local_bytes: OptionalInteger = _int32(0, "local memory bytes per thread (driver)", None)
    error: NoNul | None = Field(default=None, description="what went wrong (no NUL)")
    extra: dict[str, Any] | None = Field(
        default=None, description="free-form details (standard JSON: no NaN or Infinity)"
    )
    driver_version: Printable = _text(64, "driver version when measured")
    cuda_version: Printable = _text(64, "CUDA version when measured")
    sm_clock_mhz: OptionalInteger = _int32(0, "SM clock when measured, MHz", None)
    mem_clock_mhz: OptionalInteger = _int32(0, "memory clock when measured, MHz", None)
    trial_number: OptionalInteger = _int32(0, "the tuner's trial number", None)
    created_at: Timestamp = Field(description="when measured (UTC when no offset is given)")

    @field_validator("extra")
    @classmethod
    def _standard_json(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return _json_object(value)

    @field_validator("created_at")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        # Naive timestamps are taken as UTC, which is what fa2tune writes.
        try:
            return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        except OverflowError:  # year 9999 with a negative offset, year 1 with a positive
            raise ValueError(f"{value.isoformat()} is out of range in UTC") from None

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
                causal=p.causal,
            )
            if p.seqlens is not None
            else ProblemSpec(
                gpu="", d=p.d, n=p.n, nk=p.nk, batch=p.batch, heads=p.heads,
                kv_heads=p.kv_heads, dtype=p.dtype, causal=p.causal,
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
    format_version: Annotated[Literal[1, 2], BeforeValidator(_json_integer)] = FORMAT_VERSION
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
