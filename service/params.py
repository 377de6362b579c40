"""Validated query parameters shared by the routers (invalid input is a 422, never a 500)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import Query
from pydantic import AfterValidator

from core.config import HEAD_DIMS, HEAD_DIMS_RULE
from core.shape_request import DEFAULT_BATCH, DEFAULT_HEADS

MAX_GPU_NAME = 128  # the gpus.name column
MAX_N = 2**31 - 1  # FaParams.nq is an int32


#: A character that is not blank: not one of the characters ``str.strip`` removes
#: (``str.isspace``), spelled out because ``\s`` means a different set in each regex engine
#: (Python's has U+001C..U+001F, ECMA-262's and Rust's do not). Unanchored: JSON Schema's
#: ``pattern`` matches anywhere, so this says "has a non-blank character".
NOT_BLANK_PATTERN = r"[^\t-\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"


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
        json_schema_extra={"pattern": NOT_BLANK_PATTERN},
    ),
    AfterValidator(_gpu_name),
]
HeadDimQuery = Annotated[
    int,
    Query(
        description=f"head dimension, {HEAD_DIMS_RULE}", json_schema_extra={"enum": list(HEAD_DIMS)}
    ),
    AfterValidator(_head_dim),
]
SeqLenQuery = Annotated[
    int, Query(ge=1, le=MAX_N, description="sequence length (queries = keys)", examples=[4096])
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
]


def _dim_query(description: str) -> object:
    return Query(ge=1, le=MAX_N, description=description)


NqQuery = Annotated[
    int | None,
    _dim_query(f"query length of the shape asked for (default: n); {N_OR_NQ}"),
]
NkQuery = Annotated[int | None, _dim_query("key length of the shape (default: nq)")]
BatchQuery = Annotated[
    int | None, _dim_query(f"batch size of the shape (default: {DEFAULT_BATCH})")
]
HeadsQuery = Annotated[
    int | None, _dim_query(f"query heads of the shape (default: {DEFAULT_HEADS})")
]
KvHeadsQuery = Annotated[
    int | None, _dim_query("key/value heads of the shape, a divisor of heads (default: heads)")
]
DtypeQuery = Annotated[Literal["fp16", "bf16"], Query(description="element type")]
CausalQuery = Annotated[bool, Query(description="causal (bottom-right aligned) mask")]


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
        try:
            d = int(item)
        except ValueError:
            raise ValueError(f"not an integer: {item!r}") from None
        out.append(_head_dim(d))
    return sorted(set(out)) or None
