"""``/v1/results``: list measurements (paginated) and ingest results files."""

from __future__ import annotations

import logging
from typing import Annotated, Literal

import anyio
from fastapi import APIRouter, HTTPException, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from core.records import MeasureStatus
from db.dump_format import DumpFile, TransferError, parse_dump
from db.results import MAX_PAGE
from db.transfer import IngestSummary, ingest
from service.deps import (
    IndexHolderDep,
    IngestAuth,
    SettingsDep,
    SlowDep,
    StoreDep,
)
from service.params import (
    MAX_GPU_NAME,
    MAX_N,
    NO_CONTROL_PATTERN,
    HeadDimQuery,
    PlainBool,
    PlainInt,
)
from service.render import PageQuery, render_page
from service.routers import SLOW_REFUSALS
from service.schemas import ErrorOut, IngestOut, ResultPageOut, ValidationErrorOut

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1", tags=["results"])


@router.get(
    "/results",
    response_model=ResultPageOut,
    summary="List measurements",
    responses={
        status.HTTP_422_UNPROCESSABLE_CONTENT: {"model": ValidationErrorOut},
        **SLOW_REFUSALS,
    },
)
async def list_results(
    holder: IndexHolderDep,
    slow: SlowDep,
    gpu: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=MAX_GPU_NAME,
            description="GPU name, any spelling",
            json_schema_extra={"pattern": NO_CONTROL_PATTERN},
        ),
    ] = None,
    d: HeadDimQuery | None = None,
    n: Annotated[int | None, Query(ge=1, le=MAX_N, description="sequence length"), PlainInt] = None,
    dtype: Annotated[Literal["fp16", "bf16"] | None, Query()] = None,
    causal: Annotated[bool | None, Query(), PlainBool] = None,
    status_: Annotated[
        MeasureStatus | None, Query(alias="status", description="measurement outcome")
    ] = None,
    offset: Annotated[int, Query(ge=0, le=2**62, description="rows to skip"), PlainInt] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="rows per page"), PlainInt] = 100,
) -> Response:
    """Measurements matching the filters, ordered by GPU and problem, fastest first; follow
    ``next_offset`` for the next page.

    Pages are read and rendered in a worker process, a bounded number of requests at a time
    (more wait in a bounded queue; past it, 429, and 503 after waiting too long, both with
    ``Retry-After``), and cached until the database changes (an ingest here, or within
    about a minute when other writers add measurements)."""
    key = PageQuery(
        gpu=gpu.strip() if gpu else None,
        d=d,
        n=n,
        dtype=dtype,
        causal=causal,
        status=status_.value if status_ is not None else None,
        offset=offset,
        limit=limit,
        generation=holder.generation,
    )
    body = slow.pages.get(key)
    if body is None:
        body = (await slow.renderer.run(render_page, key)).raise_for_status()
        slow.pages.put(key, body)
    return Response(content=body, media_type="application/json")


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
        status.HTTP_408_REQUEST_TIMEOUT: {
            "model": ErrorOut,
            "description": "the body did not arrive within FA2TUNE_INGEST_BODY_TIMEOUT_S",
        },
        status.HTTP_413_CONTENT_TOO_LARGE: {"model": ErrorOut},
        status.HTTP_429_TOO_MANY_REQUESTS: {
            "model": ErrorOut,
            "description": "another ingest runs and the queue is full (Retry-After)",
        },
        status.HTTP_503_SERVICE_UNAVAILABLE: {
            "model": ErrorOut,
            "description": "the database is unavailable, its SQLite file was deleted, or the "
            "ingest waited too long behind another (Retry-After)",
        },
        status.HTTP_415_UNSUPPORTED_MEDIA_TYPE: {
            "model": ErrorOut,
            "description": "a body declared as something other than JSON",
        },
        status.HTTP_422_UNPROCESSABLE_CONTENT: {
            "model": ValidationErrorOut,
            "description": "not a valid results file (nothing was written)",
        },
    },
)
async def ingest_results(
    request: Request,
    store: StoreDep,
    holder: IndexHolderDep,
    settings: SettingsDep,
) -> IngestOut:
    """Ingest a ``fa2tune dump`` file; needs ``Authorization: Bearer <FA2TUNE_INGEST_TOKEN>``.

    The whole file is validated before anything is written, and it is written in one
    transaction. Ingest is idempotent: measurements already present are counted as
    ``skipped``, so re-posting a file adds nothing. The best-config index is rebuilt after.

    The body may be at most ``FA2TUNE_INGEST_MAX_BYTES`` (8 MiB by default; larger files go
    through ``fa2tune ingest``): a larger one is refused with 413 as soon as its declared
    length or the bytes received so far exceed that, without reading the rest. It must
    arrive within ``FA2TUNE_INGEST_BODY_TIMEOUT_S`` (30 s by default) of the server starting
    to read it, else 408. Both close the connection. Ingests run one at a time.
    """
    # The body is read here, after authentication, rather than declared as a model
    # parameter: FastAPI would decode it before running the token check. One ingest at a
    # time holds a body (and its parsed form, about 7x its size) in memory: the admission
    # limit of service.admission.SlowGate.
    _require_json(request.headers.get("content-type"))
    state = request.app.state.dbfile.check()
    if not state.ok:  # never acknowledge rows written into an unlinked file
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"writes refused: {state.problem}",
            headers={"Retry-After": "5"},
        )
    body = await _read_limited(request, settings.ingest_max_bytes, settings.ingest_body_timeout_s)
    try:
        dump: DumpFile = await run_in_threadpool(parse_dump, body)
    except TransferError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
    finally:
        del body
    summary: IngestSummary = await run_in_threadpool(ingest, store, dump)
    del dump
    if summary.added:
        await run_in_threadpool(holder.refresh)
    log.info("POST /v1/results: %d added, %d skipped", summary.added, summary.skipped)
    return IngestOut(**summary.to_dict())


def _require_json(content_type: str | None) -> None:
    """Refuse a body declared as anything but JSON (a form or multipart upload is not a
    results file); a body with no Content-Type is read as JSON, as ``fa2tune dump`` writes.

    Raises:
        HTTPException: 415 naming the type received.
    """
    if content_type is None:
        return
    media = content_type.split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise HTTPException(
            status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
            f"Content-Type {media or content_type!r}: send the results file as application/json",
        )


async def _read_limited(request: Request, limit: int, timeout_s: float) -> bytes:
    """The request body, read chunk by chunk as the server receives it.

    Raises:
        HTTPException: 413 when the declared Content-Length or the bytes received so far
            exceed ``limit`` (nothing more is read; the connection is closed); 408 when the
            body has not arrived within ``timeout_s`` (a slow client must not hold the one
            ingest slot); 422 for an empty body; 400 when the client disconnected (never
            delivered: logged as one line, not a traceback).
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPException(
            status.HTTP_413_CONTENT_TOO_LARGE, f"body over {limit} bytes", headers=_CLOSE
        )
    chunks: list[bytes] = []
    size = 0
    try:
        with anyio.fail_after(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise HTTPException(
                        status.HTTP_413_CONTENT_TOO_LARGE,
                        f"body over {limit} bytes",
                        headers=_CLOSE,
                    )
                chunks.append(chunk)
    except TimeoutError:
        log.info("POST /v1/results: body not received within %g s (%d bytes)", timeout_s, size)
        raise HTTPException(
            status.HTTP_408_REQUEST_TIMEOUT,
            f"body not received within {timeout_s:g} s ({size} bytes arrived); nothing was written",
            headers=_CLOSE,
        ) from None
    except ClientDisconnect:
        log.info("POST /v1/results: the client disconnected after %d bytes; nothing written", size)
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "client disconnected") from None
    if size == 0:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT, "empty body: expected a results file (JSON)"
        )
    return b"".join(chunks)


# A refused body's rest is not read: the connection cannot carry another request.
_CLOSE = {"Connection": "close"}
