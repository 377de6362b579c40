"""``/healthz``: liveness, the served database file, and the index's size."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, status
from fastapi.responses import JSONResponse

from core.version import __version__
from service.dbfile import DatabaseFile
from service.deps import IndexDep
from service.schemas import ErrorOut, HealthOut, IndexStatsOut

router = APIRouter(tags=["health"])


@router.get(
    "/healthz",
    response_model=HealthOut,
    summary="Liveness",
    responses={
        status.HTTP_503_SERVICE_UNAVAILABLE: {
            "model": ErrorOut,
            "description": "the SQLite file served was deleted (writes are refused until a "
            "file is back at its path)",
        }
    },
)
async def healthz(request: Request, index: IndexDep) -> Any:
    """Answers while the process serves requests; also reports the best-config index. 503
    when the SQLite database file it serves is gone (service/dbfile.py)."""
    dbfile: DatabaseFile = request.app.state.dbfile
    state = dbfile.check()
    if not state.ok:
        return JSONResponse(
            status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
            content={"detail": state.problem},
            headers={"Retry-After": "5"},
        )
    return HealthOut(
        version=__version__,
        index=IndexStatsOut(
            gpus=len(index.gpus), tuned_problems=index.tuned_problems, built_at=index.built_at
        ),
    )
