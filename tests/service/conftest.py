"""The service tests' shared fixtures: a seeded store, the app over it and a client of the app.

``seeded_file`` seeds one SQLite database per module (:func:`tests.support.service_data.seed`);
every test gets its own copy as ``store``, so a test that writes leaves the next one the
seeded data. A module that needs other rows overrides ``store`` and keeps ``app``/``client``.
``settings`` are the app's (a module or test may override them); ``fast_path`` is the app's
``fast_path`` flag; a module that sets ``BOTH_PATHS = True`` runs each test that uses the app
through the ASGI fast path and through the FastAPI route.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from core.problem import Problem
from core.settings import Settings, get_settings
from db import transfer
from db.store import Store
from service.main import create_app
from tests.support.factories import ok_result, seed_measurement
from tests.support.service_data import A100, Seeded, make_store, seed


@pytest.fixture(scope="module")
def seeded_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Seeded]:
    """Seed once per module; each test gets its own copy of the database file."""
    directory = tmp_path_factory.mktemp("seeded")
    with make_store(directory) as s:
        seeded = seed(s)
    return directory / "fa2tune.db", seeded


@pytest.fixture
def seeded(seeded_file: tuple[Path, Seeded]) -> Seeded:
    return seeded_file[1]


@pytest.fixture
def store(tmp_path: Path, seeded_file: tuple[Path, Seeded]) -> Iterator[Store]:
    shutil.copyfile(seeded_file[0], tmp_path / "fa2tune.db")
    s = make_store(tmp_path)
    yield s
    s.close()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``BOTH_PATHS``: the app's fixture ``fast_path`` both ways (where a test does not
    parametrize an argument of that name itself)."""
    own = {
        name.strip()
        for mark in metafunc.definition.iter_markers("parametrize")
        for name in (mark.args[0].split(",") if isinstance(mark.args[0], str) else mark.args[0])
    }
    if (
        getattr(metafunc.module, "BOTH_PATHS", False)
        and "fast_path" in metafunc.fixturenames
        and "fast_path" not in own
    ):
        metafunc.parametrize("fast_path", [True, False], ids=["fast-path", "route"])


@pytest.fixture
def fast_path() -> bool:
    """The app's default: ``/v1/best`` answered by the fast path."""
    return True


@pytest.fixture
def settings() -> Settings:
    """The app's settings: the defaults, but with a queue wait no test reaches, so a request
    that waits behind one a test holds is not refused because the machine is slow."""
    return get_settings().model_copy(update={"service_queue_wait_s": 60.0})


@pytest.fixture
def app(store: Store, fast_path: bool, settings: Settings) -> FastAPI:
    return create_app(store, fast_path=fast_path, settings=settings)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


@pytest.fixture
def dump_body(tmp_path: Path) -> bytes:
    """A results file from another database: one RTX 6000 Ada measurement chain."""
    other = Store.from_url(f"sqlite:///{tmp_path / 'other.db'}")
    gpu = A100.__class__(
        name="NVIDIA RTX 6000 Ada Generation",
        compute_capability="8.9",
        sm_count=142,
        driver_version="550.54.15",
        cuda_version="12.4",
    )
    for n in (1024, 4096):
        problem = Problem(gpu=gpu.name, d=64, n=n)
        seed_measurement(other, gpu=gpu, problem=problem, result=ok_result(0.5 * n / 1024, problem))
    body = transfer.to_json(transfer.export(other)).encode()
    other.close()
    return body
