"""A SQLite file deleted or replaced under a running server is seen (issue 27).

Deleted: ``/healthz`` turns 503 and ingests are refused (before, they were acknowledged into
the unlinked file and lost at the next start). A file back at the path is reopened.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.dbfile import DatabaseFile
from service.main import create_app
from tests.support.service_data import make_store, seed, set_token

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_deleted_file_is_unhealthy_and_refuses_writes_until_it_is_back(
    tmp_path: Path, dump_body: bytes
) -> None:
    store = make_store(tmp_path)
    seed(store)
    path = tmp_path / "fa2tune.db"
    backup = tmp_path / "backup.db"
    shutil.copyfile(path, backup)
    try:
        app = create_app(store)
        set_token(app, "t")
        with TestClient(app) as client:
            assert client.get("/healthz").status_code == 200
            path.unlink()
            r = client.get("/healthz")
            assert r.status_code == 503 and "missing" in r.json()["detail"], r.text
            assert r.headers["retry-after"].isdigit()
            r = client.post("/v1/results", content=dump_body, headers={"Authorization": "Bearer t"})
            assert r.status_code == 503 and "writes refused" in r.json()["detail"], r.text
            # Reads still answer from the index meanwhile.
            best = client.get("/v1/best", params={"gpu": "H200", "d": 128, "n": 4096})
            assert best.status_code == 200
            shutil.copyfile(backup, path)  # a file is back (another inode): reopened
            assert client.get("/healthz").status_code == 200
            assert client.get("/v1/gpus").status_code == 200
            r = client.post("/v1/results", content=dump_body, headers={"Authorization": "Bearer t"})
            assert r.status_code == 200, r.text
    finally:
        store.close()


def test_only_sqlite_files_are_watched(tmp_path: Path) -> None:
    from sqlalchemy import create_engine

    memory = DatabaseFile(create_engine("sqlite://"))
    assert memory.path is None and memory.check().ok
    file_engine = create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    with file_engine.connect():
        pass
    watched = DatabaseFile(file_engine)
    assert watched.path == (tmp_path / "x.db").resolve() and watched.check().ok
