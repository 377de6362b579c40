"""``/v1/results``: list measurements (paginated) and ingest results files."""

from __future__ import annotations

import logging
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi.concurrency import run_in_threadpool

from core.records import MeasureStatus
from db.dump_format import TransferError, parse_dump
from db.results import MAX_PAGE
from db.transfer import IngestSummary, ingest
from service.deps import IndexHolderDep, IngestAuth, StoreDep
from service.params import MAX_GPU_NAME, MAX_N, HeadDimQuery
from service.schemas import ErrorOut, IngestOut, ResultOut, ResultPageOut, ValidationErrorOut

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1", tags=["results"])

MAX_INGEST_BYTES = 256 * 1024 * 1024  # a full campaign dump is a few MB; this is a guard


@router.get(
    "/results",
    response_model=ResultPageOut,
    summary="List measurements",
    responses={status.HTTP_422_UNPROCESSABLE_CONTENT: {"model": ValidationErrorOut}},
)
def list_results(
    store: StoreDep,
    gpu: Annotated[
        str | None,
        Query(min_length=1, max_length=MAX_GPU_NAME, description="GPU name, any spelling"),
    ] = None,
    d: HeadDimQuery | None = None,
    n: Annotated[int | None, Query(ge=1, le=MAX_N, description="sequence length")] = None,
    dtype: Annotated[Literal["fp16", "bf16"] | None, Query()] = None,
    causal: Annotated[bool | None, Query()] = None,
    status_: Annotated[
        MeasureStatus | None, Query(alias="status", description="measurement outcome")
    ] = None,
    offset: Annotated[int, Query(ge=0, le=2**62, description="rows to skip")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="rows per page")] = 100,
) -> ResultPageOut:
    """Measurements matching the filters, ordered by GPU and problem, fastest first; follow
    ``next_offset`` for the next page."""
    page = store.results(
        gpu.strip() if gpu else None,
        d,
        n,
        dtype=dtype,
        causal=causal,
        status=status_.value if status_ is not None else None,
        offset=offset,
        limit=limit,
    )
    end = page.offset + len(page.items)
    return ResultPageOut(
        total=page.total,
        offset=page.offset,
        limit=page.limit,
        next_offset=end if end < page.total else None,
        items=[ResultOut.of(r) for r in page.items],
    )


_DUMP_BODY = {
    "required": True,
    "description": "a results file as written by `fa2tune dump`",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/DumpFile"}}},
}


@router.post(
    "/results",
    response_model=IngestOut,
    summary="Ingest a results file",
    dependencies=[IngestAuth],
    openapi_extra={"requestBody": _DUMP_BODY},
    responses={
        status.HTTP_401_UNAUTHORIZED: {"model": ErrorOut, "description": "no bearer token"},
        status.HTTP_403_FORBIDDEN: {
            "model": ErrorOut,
            "description": "wrong token, or writes disabled (no token configured)",
        },
        status.HTTP_413_CONTENT_TOO_LARGE: {"model": ErrorOut},
        status.HTTP_422_UNPROCESSABLE_CONTENT: {
            "model": ValidationErrorOut,
            "description": "not a valid results file (nothing was written)",
        },
    },
)
async def ingest_results(request: Request, store: StoreDep, holder: IndexHolderDep) -> IngestOut:
    """Ingest a ``fa2tune dump`` file; needs ``Authorization: Bearer <FA2TUNE_INGEST_TOKEN>``.

    The whole file is validated before anything is written, and it is written in one
    transaction. Ingest is idempotent: measurements already present are counted as
    ``skipped``, so re-posting a file adds nothing. The best-config index is rebuilt after.
    """
    # The body is read here, after authentication, rather than declared as a model
    # parameter: FastAPI would decode it before running the token check.
    body = await _read_limited(request, MAX_INGEST_BYTES)
    try:
        dump = await run_in_threadpool(parse_dump, body)
    except TransferError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
    summary: IngestSummary = await run_in_threadpool(ingest, store, dump)
    if summary.added:
        await run_in_threadpool(holder.refresh)
    log.info("POST /v1/results: %d added, %d skipped", summary.added, summary.skipped)
    return IngestOut(**summary.to_dict())


async def _read_limited(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, f"body over {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, f"body over {limit} bytes")
        chunks.append(chunk)
    if size == 0:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT, "empty body: expected a results file (JSON)"
        )
    return b"".join(chunks)
