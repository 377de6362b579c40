"""``/v1/gpus``: the GPUs in the database and what is tuned for each."""

from __future__ import annotations

from fastapi import APIRouter

from core.gpu_name import normalize_gpu_name
from service.deps import IndexDep, StoreDep
from service.schemas import GpuListOut, GpuOut

router = APIRouter(prefix="/v1", tags=["gpus"])


@router.get("/gpus", response_model=GpuListOut, summary="GPUs with results")
def gpus(store: StoreDep, index: IndexDep) -> GpuListOut:
    """Every GPU in the database, its latest driver/CUDA, measurement counts, and the
    (D, dtype, causal) sets with their tuned Ns."""
    items = []
    for g in store.gpus():
        tuned = index.gpus.get(normalize_gpu_name(g.name))
        items.append(GpuOut.of(g, tuned.sets() if tuned is not None else []))
    return GpuListOut(items=items)
