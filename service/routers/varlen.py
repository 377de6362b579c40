"""``/v1/best/varlen``: the fastest correct varlen config for a packed batch of sequences.

Answered from the store (varlen problems are few and their lengths are part of the question,
so they are not in the in-memory index of ``/v1/best``); the store call runs in a worker
thread.
"""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from fastapi.exceptions import RequestValidationError

from core.shape import MAX_DIM
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

#: Most sequences one request may name (the query string stays a few hundred KB at most).
MAX_SEQUENCES = 65536
SEQLENS_PATTERN = r"^[1-9][0-9]{0,9}(,[1-9][0-9]{0,9})*$"
_SEQLENS_RE = re.compile(SEQLENS_PATTERN)
DEFAULT_VARLEN_HEADS = 16


def parse_seqlens_param(text: str) -> list[int]:
    """``"100,4000,7"`` -> ``[100, 4000, 7]``.

    Raises:
        ValueError: not a comma list of positive integers, a length or their total past
            int32, or more than :data:`MAX_SEQUENCES` of them.
    """
    if not _SEQLENS_RE.fullmatch(text):
        raise ValueError("must be positive integers separated by commas, e.g. 100,4000,7")
    lens = [int(x) for x in text.split(",")]
    if len(lens) > MAX_SEQUENCES:
        raise ValueError(f"at most {MAX_SEQUENCES} lengths, got {len(lens)}")
    if sum(lens) > MAX_DIM:
        raise ValueError(f"the lengths add up to {sum(lens)}, past {MAX_DIM}")
    return lens


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
            "cu_seqlens differences)",
            pattern=SEQLENS_PATTERN,
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
        lens = parse_seqlens_param(seqlens)
    except ValueError as exc:
        raise _invalid("seqlens", str(exc), seqlens) from None
    q_heads = heads if heads is not None else DEFAULT_VARLEN_HEADS
    kv = kv_heads if kv_heads is not None else q_heads
    if q_heads % kv:
        raise _invalid("kv_heads", f"heads ({q_heads}) must be a multiple of kv_heads ({kv})", kv)
    found = store.best_varlen(gpu.strip(), d, dtype, causal, lens, q_heads, kv)
    if found is None:
        mask = "causal" if causal else "full"
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"no varlen results for {gpu.strip()!r}, D={d}, {dtype}, {mask}",
        )
    best, measured = found
    return VarlenBestOut.of(best, lens, measured)


def _invalid(param: str, message: str, value: object) -> RequestValidationError:
    return RequestValidationError(
        [{"type": "value_error", "loc": ("query", param), "msg": message, "input": value}]
    )
