"""``/v1/best``: the fastest correct config for a shape, from the in-memory index."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response, status

from service.deps import IndexDep
from service.index import NotTunedError
from service.params import CausalQuery, DtypeQuery, GpuQuery, HeadDimQuery, SeqLenQuery
from service.schemas import BestOut, ErrorOut, ValidationErrorOut

router = APIRouter(prefix="/v1", tags=["best"])


@router.get(
    "/best",
    response_model=BestOut,
    summary="Best config for a shape",
    responses={
        status.HTTP_404_NOT_FOUND: {
            "model": ErrorOut,
            "description": "the GPU, head dim or dtype/mask has no results; or, with "
            "`exact=true`, N itself was not tuned",
        },
        status.HTTP_422_UNPROCESSABLE_CONTENT: {"model": ValidationErrorOut},
    },
)
async def best(
    index: IndexDep,
    gpu: GpuQuery,
    d: HeadDimQuery,
    n: SeqLenQuery,
    dtype: DtypeQuery = "fp16",
    causal: CausalQuery = False,
    exact: Annotated[
        bool,
        Query(description="only a result measured at N itself: no nearest-N fallback (404)"),
    ] = False,
) -> Response:
    """The fastest correct config measured for (GPU, D, N, dtype, causal).

    When N itself was not tuned, the answer is the winner at the nearest tuned N on a log
    scale (``exact`` is false and ``from_n`` says which N); the timing and throughput are
    those measured at ``from_n``. The response includes the full config, the measurement and
    its provenance (driver, CUDA, nvcc, arch, source hash, time). With ``exact=true`` (the
    CLI's ``--exact``) an untuned N is a 404 that lists the tuned Ns.
    """
    try:
        entry = index.lookup(gpu, d, n, dtype, causal, exact=exact)
    except NotTunedError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from None
    # Pre-rendered body (see service.index): no per-request model validation/serialisation.
    return Response(content=entry.body(n), media_type="application/json")
