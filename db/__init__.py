"""The results database: models, sessions and migrations, queries, dump/ingest, shipped data.

Everything other stages need is re-exported here; see :mod:`db.store` for the query API.
"""

from __future__ import annotations

from core.gpu_name import normalize_gpu_name
from db.dump_format import DumpFile, TransferError, parse_dump
from db.results import BestResult, GpuSummary, ResultPage, ResultRow
from db.session import init_db, make_engine, session_scope
from db.shipped import load_shipped_results
from db.store import Store
from db.transfer import IngestSummary, dump, ingest

__all__ = [
    "BestResult",
    "DumpFile",
    "GpuSummary",
    "IngestSummary",
    "ResultPage",
    "ResultRow",
    "Store",
    "TransferError",
    "dump",
    "ingest",
    "init_db",
    "load_shipped_results",
    "make_engine",
    "normalize_gpu_name",
    "parse_dump",
    "session_scope",
]
