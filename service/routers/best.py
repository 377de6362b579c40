"""``/v1/best`` and ``/v1/best/varlen``: the fastest correct config for a shape or a packed batch.

A dense shape is answered from the in-memory index; a packed batch of sequences from the
store (varlen problems are few and their lengths are part of the question, so they are not in
the index), by the one lookup both modes share (:mod:`db.queries`), in a worker thread.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response, status
from fastapi.exceptions import RequestValidationError

from core.shape_request import (
    SEQLENS_PATTERN,
    ShapeParamError,
    no_varlen_results,
    resolve_shape,
    resolve_varlen,
)
from service.deps import IndexDep, StoreDep
from service.index import NotTunedError
from service.params import (
    BatchQuery,
    CausalQuery,
    DtypeQuery,
    GpuQuery,
    HeadDimQuery,
    HeadsQuery,
    KvHeadsQuery,
    NkQuery,
    NqQuery,
    OptionalSeqLenQuery,
    PlainBool,
)
from service.schemas import BestOut, ErrorOut, ValidationErrorOut, VarlenBestOut

router = APIRouter(prefix="/v1", tags=["best"])


@router.get(
    "/best",
    response_model=BestOut,
    summary="Best config for a shape",
    responses={
        status.HTTP_404_NOT_FOUND: {
            "model": ErrorOut,
            "description": "the GPU, head dim or dtype/mask has no results; or, with "
            "`exact=true`, N (or the shape) itself was not tuned",
        },
        status.HTTP_422_UNPROCESSABLE_CONTENT: {"model": ValidationErrorOut},
    },
)
async def best(
    index: IndexDep,
    gpu: GpuQuery,
    d: HeadDimQuery,
    n: OptionalSeqLenQuery = None,
    dtype: DtypeQuery = "fp16",
    causal: CausalQuery = False,
    exact: Annotated[
        bool,
        Query(
            description="only a result measured at N (or the shape) itself: no nearest "
            "fallback (404)"
        ),
        PlainBool,
    ] = False,
    nq: NqQuery = None,
    nk: NkQuery = None,
    batch: BatchQuery = None,
    heads: HeadsQuery = None,
    kv_heads: KvHeadsQuery = None,
) -> Response:
    """The fastest correct config measured for (GPU, D, N, dtype, causal), or for a shape.

    Give ``n`` or ``nq`` (or both, equal): a request with neither is a 422 naming ``n``.
    (Both are optional parameters in this document because OpenAPI cannot state "one of
    two parameters".)

    With ``n`` alone: when N itself was not tuned, the answer is the winner at the nearest
    tuned N on a log scale (``exact`` is false and ``from_n`` says which N); the timing and
    throughput are those measured at ``from_n``.

    With any of ``nq``, ``nk``, ``batch``, ``heads``, ``kv_heads``: the answer is for that
    whole shape (``nq`` defaults to ``n``, ``nk`` to ``nq``, ``batch`` to 2 and ``heads`` to
    16, the campaign's, ``kv_heads`` to ``heads``), measured at it or else at the nearest
    tuned shape; ``shape`` echoes the asked shape, ``measured_problem`` says where the
    answer was measured and ``distance`` how far that is (the sum of |log ratio| of Nq, Nk,
    grid fill and GQA group; 0 when exact).

    The response includes the full config, the measurement and its provenance (driver,
    CUDA, nvcc, arch, source hash, time). With ``exact=true`` (the CLI's ``--exact``) an
    untuned N or shape is a 404.
    """
    try:
        shape = resolve_shape(n, nq=nq, nk=nk, batch=batch, heads=heads, kv_heads=kv_heads)
    except ShapeParamError as exc:
        kind = "missing" if exc.param == "n" and n is None else "value_error"
        raise _invalid(exc.param, str(exc), exc.value, kind) from None
    try:
        if shape is None:
            assert n is not None  # resolve_shape requires n or nq
            entry = index.lookup(gpu, d, n, dtype, causal, exact=exact)
            # Pre-rendered body (see service.index): no per-request model validation.
            return Response(content=entry.body(n), media_type="application/json")
        answer = index.lookup_shape(gpu, d, dtype, causal, shape, exact=exact)
    except NotTunedError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from None
    return Response(content=answer.body(), media_type="application/json")


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
            # Published only: core.shape_request checks it, with the same plain message as
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


def _invalid(
    param: str, message: str, value: object, kind: str = "value_error"
) -> RequestValidationError:
    return RequestValidationError(
        [{"type": kind, "loc": ("query", param), "msg": message, "input": value}]
    )
