"""Validated query parameters shared by the routers (invalid input is a 422, never a 500)."""

from __future__ import annotations

import re
import typing
from typing import Annotated, Any, Literal

from fastapi import Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import AfterValidator, BeforeValidator

from core.config import HEAD_DIMS, HEAD_DIMS_RULE
from core.kv_lengths import MIXED_SPREAD, KvLengths
from core.problem import KV_PAGE_RULE, MAX_KV_PAGE, kv_page_error
from core.shape_request import DEFAULT_BATCH, DEFAULT_HEADS

MAX_GPU_NAME = 128  # the gpus.name column
MAX_N = 2**31 - 1  # FaParams.nq is an int32


#: The control characters no query name or value may hold: C0 controls and DEL except the
#: blanks (tab, line feed ... and U+001C..U+001F count as blanks for ``str.strip`` and are
#: handled by the blank rules). A NUL would otherwise reach name matching that ignores
#: punctuation ("H200%00" matched H200).
_CONTROLS = r"\x00-\x08\x0e-\x1b\x7f"
CONTROL_CHARS = re.compile(f"[{_CONTROLS}]")

#: A character that is neither blank (one of the characters ``str.strip`` removes,
#: ``str.isspace``, spelled out because ``\s`` means a different set in each regex engine:
#: Python's has U+001C..U+001F, ECMA-262's and Rust's do not) nor a control character.
_NOT_BLANK = r"[^\x00-\x20\x7f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
#: A name as the API takes it: no control character anywhere, and a non-blank character.
#: Anchored, as JSON Schema's ``pattern`` matches anywhere.
NAME_PATTERN = f"^[^{_CONTROLS}]*{_NOT_BLANK}[^{_CONTROLS}]*$"
#: Any text without a control character (for filters that take blanks as they are).
NO_CONTROL_PATTERN = f"^[^{_CONTROLS}]*$"


#: The only integer spelling a query takes: ASCII digits, a minus sign for a negative value
#: (refused by its range, with the range's message). pydantic's lax mode also reads "4_096",
#: "+4096", " 4096" and "4096.0", and one value must not have several spellings that answer
#: alike: a cache key or a log line would tell them apart.
_PLAIN_INT = re.compile(r"-?[0-9]{1,19}")
#: The number spellings a query takes: ASCII digits with an optional fraction and exponent, a
#: minus sign for a negative value (refused by its range): what JSON and Python write a float
#: as. pydantic's lax mode also reads "inf", "nan", "+30", " 30" and "30_0".
_PLAIN_FLOAT = re.compile(r"-?[0-9]{1,19}(\.[0-9]{1,19})?([eE][-+]?[0-9]{1,3})?")
#: The boolean spellings a query takes (any letter case for true/false); pydantic's lax mode
#: also reads "yes", "on", "t", "y".
_PLAIN_BOOLS = {"true": True, "false": False, "1": True, "0": False}


def _plain_int(value: object) -> object:
    if isinstance(value, str) and not _PLAIN_INT.fullmatch(value):
        raise ValueError("must be a plain decimal integer (digits 0-9, maybe after a minus)")
    return value


def _plain_float(value: object) -> object:
    if isinstance(value, str) and not _PLAIN_FLOAT.fullmatch(value):
        raise ValueError(
            "must be a plain decimal number (digits 0-9, maybe a fraction and an "
            "exponent; not inf or nan)"
        )
    return value


def _plain_bool(value: object) -> object:
    if isinstance(value, str):
        parsed = _PLAIN_BOOLS.get(value.lower())
        if parsed is None:
            raise ValueError("must be true or false (or 1 or 0)")
        return parsed
    return value


#: Before-validators for integer and boolean query parameters (see :data:`_PLAIN_INT`).
PlainInt = BeforeValidator(_plain_int)
PlainBool = BeforeValidator(_plain_bool)
PlainFloat = BeforeValidator(_plain_float)


def _gpu_name(value: str) -> str:
    value = value.strip()
    if not value:
        raise ValueError("must not be blank")
    return value


def _head_dim(value: int) -> int:
    if value not in HEAD_DIMS:
        raise ValueError(f"must be {HEAD_DIMS_RULE} (got {value})")
    return value


GpuQuery = Annotated[
    str,
    Query(
        min_length=1,
        max_length=MAX_GPU_NAME,
        description='GPU name as you would write it: "H200", "NVIDIA H200" (case-insensitive); '
        "not blank (surrounding blanks are ignored)",
        examples=["NVIDIA H200"],
        # Published only: the validator below refuses blank names with a plainer message
        # than "String should match pattern".
        json_schema_extra={"pattern": NAME_PATTERN},
    ),
    AfterValidator(_gpu_name),
]
HeadDimQuery = Annotated[
    int,
    Query(
        description=f"head dimension, {HEAD_DIMS_RULE}", json_schema_extra={"enum": list(HEAD_DIMS)}
    ),
    PlainInt,
    AfterValidator(_head_dim),
]
SeqLenQuery = Annotated[
    int,
    Query(ge=1, le=MAX_N, description="sequence length (queries = keys)", examples=[4096]),
    PlainInt,
]
#: The rule OpenAPI cannot state per parameter: /v1/best needs ``n`` or ``nq`` (or both, equal).
N_OR_NQ = "one of n and nq is required (both: equal); a request with neither is a 422"
OptionalSeqLenQuery = Annotated[
    int | None,
    Query(
        ge=1,
        le=MAX_N,
        description="sequence length, queries = keys (the per-N answer); with any shape "
        f"parameter, the query length (as nq); {N_OR_NQ}",
        examples=[4096],
    ),
    PlainInt,
]


def _dim_query(description: str) -> object:
    return Query(ge=1, le=MAX_N, description=description)


NqQuery = Annotated[
    int | None,
    _dim_query(f"query length of the shape asked for (default: n); {N_OR_NQ}"),
    PlainInt,
]
NkQuery = Annotated[int | None, _dim_query("key length of the shape (default: nq)"), PlainInt]
BatchQuery = Annotated[
    int | None, _dim_query(f"batch size of the shape (default: {DEFAULT_BATCH})"), PlainInt
]
HeadsQuery = Annotated[
    int | None, _dim_query(f"query heads of the shape (default: {DEFAULT_HEADS})"), PlainInt
]
KvHeadsQuery = Annotated[
    int | None,
    _dim_query("key/value heads of the shape, a divisor of heads (default: heads)"),
    PlainInt,
]
#: The attention variant's parameters (core.variant; FlashAttention's window_size,
#: attention_chunk, softcap and sinks). The route resolves them with the call's lengths
#: (core.shape_request.resolve_variant).
WindowLeftQuery = Annotated[
    int,
    Query(ge=-1, le=MAX_N, description="local attention: a query sees keys at most this far "
          "left of its position (bottom-right aligned); -1: no bound"),
    PlainInt,
]  # fmt: skip
WindowRightQuery = Annotated[
    int,
    Query(ge=-1, le=MAX_N, description="local attention: ... at most this far right; -1: no "
          "bound (a causal call's is 0)"),
    PlainInt,
]  # fmt: skip
ChunkQuery = Annotated[
    int,
    Query(ge=0, le=MAX_N, description="chunked attention (Llama 4): keys only in the query "
          "position's chunk of this many; 0: none"),
    PlainInt,
]  # fmt: skip
SoftcapQuery = Annotated[
    float,
    Query(ge=0, allow_inf_nan=False, description="logit softcap (Gemma 2): scores become "
          "softcap * tanh(s / softcap); 0: none. Any value is served by the configs tuned "
          "with a softcap"),
    PlainFloat,
]  # fmt: skip
SinksQuery = Annotated[
    bool,
    Query(description="attention sinks (GPT-OSS): a learned logit per query head joins "
          "every row's denominator"),
    PlainBool,
]  # fmt: skip
#: The names of the variant's parameters (a request with any of them is not the fast path's).
VARIANT_PARAMS = ("window_left", "window_right", "chunk", "softcap", "sinks")


def _kv_page(value: int | None) -> int | None:
    if value is not None and kv_page_error(value) is not None:
        raise ValueError(f"must be {KV_PAGE_RULE}")  # the 422 adds the value given
    return value


KvPageQuery = Annotated[
    int | None,
    Query(
        ge=0,
        le=MAX_KV_PAGE,
        description=f"a call over a KV cache whose lengths live on the device: {KV_PAGE_RULE}. "
        "Answered only by problems tuned on the split-KV cache kernels of this layout "
        "(fa2tune tune --kv-page); absent: a dense call",
        examples=[16],
    ),
    PlainInt,
    AfterValidator(_kv_page),
]
KvLengthsQuery = Annotated[
    KvLengths | None,
    Query(
        description="with kv_page, the length pattern of the tuned cache problems that answer "
        "(core.kv_lengths): full, every sequence at the capacity nk; mixed, a fixed spread "
        f"over [nk/{MIXED_SPREAD}, nk] as a serving batch has (fa2tune tune --kv-lengths). "
        "Absent: the op's and the header's rule, the mixed problems where any answers, else "
        "the full ones; given: only that pattern. Without kv_page: a 422",
        examples=["mixed"],
    ),
]
#: The KV-cache parameters' names (a request with any of them is not the fast path's either:
#: the route answers a cache call from the store, and refuses ``kv_lengths`` without
#: ``kv_page``).
CACHE_PARAMS = ("kv_page", "kv_lengths")
DtypeQuery = Annotated[Literal["fp16", "bf16"], Query(description="element type")]
CausalQuery = Annotated[bool, Query(description="causal (bottom-right aligned) mask"), PlainBool]


def parse_head_dims(values: list[str] | None) -> list[int] | None:
    """Head dims from repeated and/or comma-separated values (``d=64&d=128`` or ``d=64,128``).

    Raises:
        ValueError: a value is not an integer or not a supported head dim.
    """
    if not values:
        return None
    out: list[int] = []
    for item in ",".join(values).split(","):
        item = item.strip()
        if not item:
            continue
        if not _PLAIN_INT.fullmatch(item):
            raise ValueError(f"not a plain decimal integer: {item!r}")
        out.append(_head_dim(int(item)))
    return sorted(set(out)) or None


def _repeatable(annotation: Any) -> bool:
    """Whether a query parameter's type takes several values (``list[...]``, maybe optional)."""
    candidates = (annotation, *typing.get_args(annotation))
    return any(typing.get_origin(arg) is list for arg in candidates)


def strict_query(request: Request) -> None:
    """An app-wide dependency: refuse (422) a scalar query parameter given more than once
    (Starlette would silently take the last: ``gpu=H200&gpu=H100`` answered for H100) and
    any query name or value holding a control character (a NUL included).

    Parameters declared as lists (``/v1/export/header``'s ``d`` and ``dtype``) may repeat.

    Raises:
        RequestValidationError: the first offending parameters, in the 422 format of every
            other invalid input.
    """
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    declared = getattr(dependant, "query_params", None) or []
    repeatable = {f.alias for f in declared if _repeatable(f.field_info.annotation)}
    seen: dict[str, int] = {}
    errors: list[dict[str, Any]] = []
    for key, value in request.query_params.multi_items():
        if CONTROL_CHARS.search(key) or CONTROL_CHARS.search(value):
            errors.append({
                "type": "value_error", "loc": ("query", key), "input": value,
                "msg": "must not contain control characters (such as NUL)",
            })  # fmt: skip
        seen[key] = seen.get(key, 0) + 1
    for key, count in seen.items():
        if count > 1 and key not in repeatable:
            errors.append({
                "type": "value_error", "loc": ("query", key),
                "input": request.query_params.getlist(key),
                "msg": f"given {count} times; give it once",
            })  # fmt: skip
    if errors:
        raise RequestValidationError(errors)
