"""``/healthz``: liveness plus the index's size."""

from __future__ import annotations

from fastapi import APIRouter

from core.version import __version__
from service.deps import IndexDep
from service.schemas import HealthOut, IndexStatsOut

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthOut, summary="Liveness")
async def healthz(index: IndexDep) -> HealthOut:
    """Answers while the process serves requests; also reports the best-config index."""
    return HealthOut(
        version=__version__,
        index=IndexStatsOut(
            gpus=len(index.gpus), tuned_problems=index.tuned_problems, built_at=index.built_at
        ),
    )
