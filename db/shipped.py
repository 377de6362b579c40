"""Results shipped inside the package (``db/data/*.json``), loaded at service start-up.

A fresh install thereby answers for the GPUs fa2tune was tuned on (the H200) with no GPU
present. Each file is recorded by content hash in ``ingested_files``, so later start-ups only
hash the files; a changed file (a new release's results) is ingested again, and ingest's
deduplication keeps that idempotent.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from sqlalchemy import select

from db.dump_format import parse_dump
from db.models import IngestedFile, utcnow
from db.session import session_scope
from db.store import Store
from db.transfer import ingest_into, lock_for_ingest

logger = logging.getLogger(__name__)


def shipped_files() -> list[Traversable]:
    """The packaged results files, sorted by name (empty when none are shipped)."""
    data = resources.files("db") / "data"
    if not data.is_dir():
        return []
    return sorted(
        (f for f in data.iterdir() if f.is_file() and f.name.endswith(".json")),
        key=lambda f: f.name,
    )


def load_shipped_results(store: Store, files: Sequence[Traversable | Path] | None = None) -> int:
    """Ingest every shipped results file not ingested before.

    Args:
        store: the target database.
        files: results files to load instead of the packaged ones (tests, other bundles).

    Returns:
        Measurements added (0 when every file was already ingested).

    Raises:
        db.dump_format.TransferError: a shipped file is invalid (nothing of it is written).
    """
    added = 0
    for file in shipped_files() if files is None else files:
        raw = file.read_bytes()
        digest = hashlib.sha256(raw).hexdigest()
        with session_scope(store.engine) as s:
            if s.get(IngestedFile, digest) is not None:
                logger.debug("shipped results %s already ingested", file.name)
                continue
        dump_file = parse_dump(raw)
        with session_scope(store.engine, write=True) as s:
            lock_for_ingest(s)
            # Re-check under the lock: another process may have loaded it meanwhile.
            if s.scalar(select(IngestedFile.sha256).where(IngestedFile.sha256 == digest)):
                continue
            summary = ingest_into(s, dump_file)
            s.add(
                IngestedFile(
                    sha256=digest,
                    name=file.name[:255],
                    measurements_added=summary.added,
                    ingested_at=utcnow(),
                )
            )
        logger.info(
            "loaded shipped results %s: %d measurements added, %d already present",
            file.name,
            summary.added,
            summary.skipped,
        )
        added += summary.added
    return added
