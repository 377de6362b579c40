"""Issue 27: result pages and headers are read and rendered in worker processes, off the
server's interpreter, and answer exactly as when rendered in the server's threads; database
faults in a worker are the same JSON 503s; a dead worker falls back to threads.

Each test starts one worker process (a few seconds of CPU); the other service tests render in
threads (tests/conftest.py sets FA2TUNE_SERVICE_RENDER_PROCESSES=0).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import anyio
import pytest
from fastapi.testclient import TestClient

from core.settings import Settings
from db.store import Store
from service.main import create_app
from service.render import Renderer
from tests.support.render_jobs import dies_in_a_worker, pid_job

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _without_timestamp(header: str) -> str:
    return "\n".join(line for line in header.splitlines() if "generated" not in line)


def test_worker_process_renders_what_threads_render(store: Store, settings: Settings) -> None:
    in_workers = create_app(
        store, settings=settings.model_copy(update={"service_render_processes": 1})
    )
    in_threads = create_app(
        store, settings=settings.model_copy(update={"service_render_processes": 0})
    )
    with TestClient(in_workers) as workers, TestClient(in_threads) as threads:
        renderer: Renderer = in_workers.state.slow.renderer
        assert renderer.in_processes and not in_threads.state.slow.renderer.in_processes
        pid = anyio.run(renderer.run, pid_job).body
        assert int(pid) != os.getpid()
        for params in ({"limit": 7, "offset": 3}, {"gpu": "H200", "d": 128}, {"limit": 1000}):
            a, b = (
                workers.get("/v1/results", params=params),
                threads.get("/v1/results", params=params),
            )
            assert a.status_code == b.status_code == 200
            assert a.content == b.content, params
        for params in ({"gpu": "H200"}, {"gpu": "A100-SXM4-80GB", "d": "64,72", "dtype": "fp16"}):
            a = workers.get("/v1/export/header", params=params)
            b = threads.get("/v1/export/header", params=params)
            assert a.status_code == b.status_code == 200
            assert _without_timestamp(a.text) == _without_timestamp(b.text)
            assert a.headers["content-disposition"] == b.headers["content-disposition"]
        a = workers.get("/v1/export/header", params={"gpu": "B200"})
        b = threads.get("/v1/export/header", params={"gpu": "B200"})
        assert a.status_code == b.status_code == 404 and a.json() == b.json()


def test_database_faults_in_a_worker_are_json_503s_and_recover(
    tmp_path: Path, store: Store, settings: Settings
) -> None:
    path = Path(str(store.engine.url.database))
    backup = tmp_path / "backup.db"
    shutil.copyfile(path, backup)
    app = create_app(store, settings=settings.model_copy(update={"service_render_processes": 1}))
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.get("/v1/results", params={"limit": 1}).status_code == 200
        path.unlink()  # deleted under the server
        r = client.get("/v1/results", params={"limit": 2})
        assert r.status_code == 503, r.text
        assert r.json() == {"detail": "database unavailable; try again later"}
        assert r.headers["retry-after"] == "5"
        assert not path.exists()  # the worker did not create an empty database there
        shutil.copyfile(backup, path)  # back: read at once
        assert client.get("/v1/results", params={"limit": 3}).status_code == 200
        path.write_bytes(b"not a database" * 100)  # truncated and overwritten in place
        r = client.get("/v1/export/header", params={"gpu": "H200", "d": "128"})
        assert (
            r.status_code == 503 and r.json()["detail"] == "database unavailable; try again later"
        )
        shutil.copyfile(backup, path)
        assert (
            client.get("/v1/export/header", params={"gpu": "H200", "d": "128"}).status_code == 200
        )


def test_a_dead_worker_falls_back_to_threads(store: Store) -> None:
    renderer = Renderer(store, processes=1)
    try:
        result = anyio.run(renderer.run, dies_in_a_worker)
        assert result.body == b"rendered in a thread"
        assert not renderer.in_processes
    finally:
        renderer.close()


def test_in_memory_databases_render_in_threads() -> None:
    with Store.from_url("sqlite://") as memory:
        assert not Renderer(memory, processes=2).in_processes


def test_workers_that_cannot_start_leave_the_jobs_to_threads(store: Store) -> None:
    renderer = Renderer(store, processes=1)
    renderer._url = "nosuch://database"  # the worker's initializer fails on it
    try:
        renderer.start()
        anyio.run(renderer.ready)
        assert not renderer.in_processes
        assert anyio.run(renderer.run, pid_job).body == str(os.getpid()).encode()
    finally:
        renderer.close()
