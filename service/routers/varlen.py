"""``/v1/best/varlen``: the fastest correct varlen config for a packed batch of sequences.

Answered from the store (varlen problems are few and their lengths are part of the question,
so they are not in the in-memory index of ``/v1/best``); the store call runs in a worker
thread.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from fastapi.exceptions import RequestValidationError

from core.shape_request import ShapeParamError
from core.varlen_request import SEQLENS_PATTERN, no_varlen_results, resolve_varlen
from service.deps import StoreDep
from service.params import (
    CausalQuery,
    DtypeQuery,
    GpuQuery,
    HeadDimQuery,
    HeadsQuery,
    KvHeadsQuery,
)
from service.schemas import ErrorOut, ValidationErrorOut, VarlenBestOut

router = APIRouter(prefix="/v1", tags=["best"])


@router.get(
    "/best/varlen",
    response_model=VarlenBestOut,
    summary="Best varlen config for a packed batch",
    responses={
        status.HTTP_404_NOT_FOUND: {
            "model": ErrorOut,
            "description": "no varlen problem of this GPU, head dim, dtype and mask is tuned",
        },
        status.HTTP_422_UNPROCESSABLE_CONTENT: {"model": ValidationErrorOut},
    },
)
def best_varlen(
    store: StoreDep,
    gpu: GpuQuery,
    d: HeadDimQuery,
    seqlens: Annotated[
        str,
        Query(
            description="each sequence's length, comma-separated (the packed batch's "
            "cu_seqlens differences); each 1..2^31-1, their sum too",
            examples=["100,4000,1822"],
            # Published only: core.varlen_request checks it, with the same plain message as
            # `fa2tune best --seqlens` rather than "String should match pattern".
            json_schema_extra={"pattern": SEQLENS_PATTERN},
        ),
    ],
    dtype: DtypeQuery = "fp16",
    causal: CausalQuery = False,
    heads: HeadsQuery = None,
    kv_heads: KvHeadsQuery = None,
) -> VarlenBestOut:
    """The fastest correct varlen (``_vl``) config measured on these lengths, else on the
    nearest tuned varlen batch: each batch is compared as its count of sequences at their
    mean length, by the distance of ``/v1/best`` (``distance``; ``measured_seqlens`` says
    which batch answered). ``heads`` defaults to 16 and ``kv_heads`` to ``heads``."""
    try:
        asked = resolve_varlen(seqlens, heads, kv_heads)
    except ShapeParamError as exc:
        value = seqlens if exc.param == "seqlens" else exc.value
        raise _invalid(exc.param, str(exc), value) from None
    name = gpu.strip()
    found = store.best_varlen(name, d, dtype, causal, asked.seqlens, asked.heads, asked.kv_heads)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, no_varlen_results(name, d, dtype, causal))
    best, measured = found
    return VarlenBestOut.of(best, asked.seqlens, measured)


def _invalid(param: str, message: str, value: object) -> RequestValidationError:
    return RequestValidationError(
        [{"type": "value_error", "loc": ("query", param), "msg": message, "input": value}]
    )
