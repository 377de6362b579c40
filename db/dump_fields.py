"""The field types of the results-file format (:mod:`db.dump_format`) and its limits.

Each rule is stated in the field's JSON schema (a description, and a pattern or bounds where
JSON Schema can say it), which ``POST /v1/results`` publishes as the ``DumpFile`` schema, and
is enforced by the validator next to it with a message that says what is wrong: numbers,
integers and timestamps as JSON types (no booleans or numeric strings), single-line
printable text, GPU names (with :data:`GPU_NAME_PATTERN`, the same rule as a regex), head
dims, non-negative error figures, and the int32/int64/time limits of the columns and the
kernel. The records built from these types are :mod:`db.dump_format`'s.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timedelta
from typing import Annotated, Any, Final

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema
from pydantic_core import PydanticCustomError

from core.config import HEAD_DIMS, HEAD_DIMS_RULE
from core.gpu_name import normalize_gpu_name

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
#: The longest ``error`` text of a build or a measurement, in characters. What fa2tune writes
#: is far shorter (a failed build's excerpt of its log, a worker's six-frame traceback), and
#: ``fa2tune dump`` clips longer ones (:func:`clip_text`), so the files it writes ingest.
MAX_ERROR_CHARS: Final = 16_384
#: The longest ``extra`` object of a measurement, as compact JSON, in characters.
MAX_EXTRA_CHARS: Final = 16_384
#: How far past the reading machine's clock a measurement's ``created_at`` may lie (clocks
#: of the tuning machines are not exact); later is refused, not stored (year 9999 would stay
#: "the newest measurement" for ever).
MAX_CLOCK_SKEW: Final = timedelta(days=1)

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


def json_integer(value: object) -> object:
    """Refuse what is not a JSON integer or number (a boolean, a string) before pydantic
    converts it; an integral float passes (JSON Schema's "integer")."""
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
Integer = Annotated[int, BeforeValidator(json_integer)]
#: A number: a JSON number, not a boolean or a string.
Number = Annotated[float, BeforeValidator(_json_number)]
# The optional ones check the whole union: a field's bounds on ``Integer | None`` would be
# published under pydantic's names (ge, le) instead of JSON Schema's (minimum, maximum).
OptionalInteger = Annotated[int | None, BeforeValidator(json_integer)]
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


def json_object(
    value: dict[str, Any] | None, max_chars: int | None = None
) -> dict[str, Any] | None:
    """Refuse an object that is not standard JSON (holds NaN or Infinity), or, given
    ``max_chars``, whose compact JSON is longer."""
    if value is not None:
        try:
            text = json.dumps(value, allow_nan=False, separators=(",", ":"))
        except ValueError:
            raise ValueError("must be standard JSON (no NaN or Infinity)") from None
        if max_chars is not None and len(text) > max_chars:
            raise ValueError(
                f"must be at most {max_chars} characters as compact JSON (got {len(text)})"
            )
    return value


def clip_text(value: str | None, max_chars: int = MAX_ERROR_CHARS) -> str | None:
    """``value`` cut to ``max_chars`` characters, saying so at its end, when longer."""
    if value is None or len(value) <= max_chars:
        return value
    marker = f"\n[clipped: {len(value)} characters in all]"
    return value[: max_chars - len(marker)] + marker


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


#: The published pattern of a GPU name; tests/db/test_ingest_strict.py checks that it accepts
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


def text_field(max_length: int, description: str, *, min_length: int = 0) -> Any:
    """A bounded single-line printable string field."""
    return Field(
        min_length=min_length,
        max_length=max_length,
        description=f"{description} (at most {max_length} printable characters, one line)",
        json_schema_extra={"pattern": _PRINTABLE_PATTERN},
    )


Printable = Annotated[str, AfterValidator(_printable)]
NoNul = Annotated[str, AfterValidator(_no_nul)]


#: An ``error`` text: no NUL, at most :data:`MAX_ERROR_CHARS` characters (the length is
#: checked first, so a huge text is refused before it is scanned).
ErrorText = Annotated[str, Field(max_length=MAX_ERROR_CHARS), AfterValidator(_no_nul)]


def error_text_field(description: str) -> Any:
    """An optional :data:`ErrorText` field."""
    return Field(
        default=None, description=f"{description} (no NUL; at most {MAX_ERROR_CHARS} characters)"
    )


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


def int32_field(minimum: int, description: str, default: Any = ...) -> Any:
    """An integer field from ``minimum`` to :data:`INT32_MAX` (required unless ``default``)."""
    return Field(default, ge=minimum, le=INT32_MAX, description=description)


#: A compute capability ("9.0") and an nvcc architecture ("sm_90a").
CC_PATTERN = r"^[0-9]{1,3}\.[0-9]{1,3}$"
ARCH_PATTERN = r"^sm_[0-9]{2,4}[a-z]?$"


def time_field(description: str) -> Any:
    """An optional time in milliseconds: finite, above 0 and at most :data:`MAX_MS`."""
    return Field(
        default=None,
        gt=0,
        le=MAX_MS,
        allow_inf_nan=False,
        description=f"{description}, milliseconds: finite, > 0 and <= {MAX_MS:g}",
    )
