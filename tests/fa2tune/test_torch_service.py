"""fa2tune.torch asking a running fa2tune service (``FA2TUNE_SERVICE_URL``), without torch.

The real FastAPI app runs under uvicorn on a thread, on a free local port, over a database
that holds one tuned shape; the local database (the settings') holds another. The decision
layer (:func:`fa2tune.ops.selection.select`) must take the service's answer when it has one,
ask the local database when the service has nothing for the call (404), and fall back to the
local choice with one warning when the service does not answer.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from core import settings as settings_module
from core.problem import Problem
from core.settings import override_settings
from core.shape import Shape
from db.store import Store
from fa2tune.ops import autotune, choice, selection
from fa2tune.ops.remote import ServiceUnavailable, ask_service, best_url, parse_best
from fa2tune.ops.selection import Call, select
from service.main import create_app
from tests.support.factories import H200, make_config, ok_result, seed_measurement

GPU = H200.name
ON_SERVICE = Shape(1000, 1000, 2, 16, 16)
LOCAL = Shape(4096, 4096, 2, 16, 16)
SERVICE_WINNER = make_config(br=128, bc=32)
LOCAL_WINNER = make_config(br=64, bc=64)


def _call(shape: Shape, d: int = 128) -> Call:
    return Call(
        device=0, gpu=GPU, sm_count=H200.sm_count, compute_capability="9.0", shape=shape,
        dtype="fp16", causal=False, d=d,
    )  # fmt: skip


def _seed(url: str, shape: Shape, config: object, d: int = 128) -> None:
    problem = Problem(
        gpu=GPU, d=d, n=shape.nq, nk=shape.nk, batch=shape.batch, heads=shape.heads,
        kv_heads=shape.kv_heads, dtype="fp16", causal=False,
    )  # fmt: skip
    with Store.from_url(url) as store:
        seed_measurement(store, problem=problem, config=config, result=ok_result(0.5, problem))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def service_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real service on a free port, over a database with one tuned shape (D=128)."""
    db = f"sqlite:///{tmp_path_factory.mktemp('service') / 'service.db'}"
    _seed(db, ON_SERVICE, SERVICE_WINNER)
    store = Store.from_url(db)
    app = create_app(store, load_shipped=False)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the service did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)
    sock.close()
    store.close()


@pytest.fixture
def local_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    # Only what the test seeds: the shipped H200 results would compete (and take seconds).
    monkeypatch.setattr("db.shipped.load_shipped_results", lambda store: None)
    url = f"sqlite:///{tmp_path / 'local.db'}"
    _seed(url, LOCAL, LOCAL_WINNER)
    saved = dict(settings_module._overrides)
    override_settings(db_url=url, cache_dir=tmp_path / "build", autotune="cached")
    choice.reset_store()
    autotune.reset()
    selection.reset_service_state()
    yield url
    choice.reset_store()
    autotune.reset()
    selection.reset_service_state()
    settings_module._overrides.clear()
    settings_module._overrides.update(saved)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_service_answer_is_used(service_url: str, local_db: str) -> None:
    override_settings(service_url=service_url)
    selected = select(_call(ON_SERVICE))
    assert selected.choice.config == SERVICE_WINNER
    assert (selected.choice.source, selected.choice.origin) == ("exact", "service")
    assert selected.choice.measured == ON_SERVICE
    assert "(exact, service)" in selected.describe(_call(ON_SERVICE))
    # A shape the service only has a nearest answer for, but that was tuned exactly here
    # (first-use tuning writes locally): the local result serves.
    here = select(_call(LOCAL))
    assert (here.choice.source, here.choice.origin) == ("exact", "local")
    assert here.choice.config == LOCAL_WINNER
    # Tuned nowhere exactly: the service's nearest beats the local nearest.
    near = select(_call(Shape(2000, 2000, 2, 16, 16)))
    assert (near.choice.source, near.choice.origin) == ("nearest", "service")
    assert near.choice.config == SERVICE_WINNER


def test_nothing_on_the_service_asks_the_local_database(service_url: str, local_db: str) -> None:
    override_settings(service_url=service_url)
    _seed(local_db, LOCAL, make_config(d=64, br=64, bc=64), d=64)
    # D=64: the service has no result (404), the local database has.
    selected = select(_call(LOCAL, d=64))
    assert (selected.choice.source, selected.choice.origin) == ("exact", "local")
    assert selected.choice.config == make_config(d=64, br=64, bc=64)


def test_unreachable_service_warns_once_and_serves_locally(
    local_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    override_settings(service_url=url, service_timeout_s=2.0)
    with caplog.at_level(logging.WARNING, logger="fa2tune.torch"):
        first = select(_call(LOCAL))
        start = time.monotonic()
        second = select(_call(ON_SERVICE))
        waited = time.monotonic() - start
    assert (first.choice.source, first.choice.origin) == ("exact", "local")
    assert first.choice.config == LOCAL_WINNER
    assert (second.choice.source, second.choice.origin) == ("nearest", "local")
    warnings = [r for r in caplog.records if "did not answer" in r.getMessage()]
    assert len(warnings) == 1 and url in warnings[0].getMessage()
    assert waited < 1.0  # a failed service is not asked again for a while


def test_slow_service_times_out(local_db: str) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepts connections, never answers
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(ServiceUnavailable):
            ask_service(url, GPU, 128, "fp16", False, LOCAL, timeout_s=0.3)
        assert time.monotonic() - start < 5
        override_settings(service_url=url, service_timeout_s=0.3)
        assert select(_call(LOCAL)).choice.origin == "local"
    finally:
        listener.close()


def test_request_and_body_parsing() -> None:
    url = best_url("http://h:8000/", "NVIDIA H200", 128, "fp16", True, Shape(1, 8192, 4, 32, 8))
    assert url.startswith("http://h:8000/v1/best?gpu=NVIDIA+H200&d=128&nq=1&nk=8192&batch=4")
    assert url.endswith("heads=32&kv_heads=8&dtype=fp16&causal=true")
    body = {
        "config": {"name": SERVICE_WINNER.name},
        "exact": False,
        "measured_problem": {"n": 512, "nk": 512, "batch": 2, "heads": 16, "kv_heads": 16},
    }
    parsed = parse_best(body, 128, "fp16", False)
    assert (parsed.config, parsed.source, parsed.measured) == (
        SERVICE_WINNER, "nearest", Shape(512, 512, 2, 16, 16),
    )  # fmt: skip
    for bad in ({}, {**body, "config": {"name": "nope"}}, {**body, "measured_problem": None}):
        with pytest.raises(ServiceUnavailable):
            parse_best(bad, 128, "fp16", False)
    with pytest.raises(ServiceUnavailable, match="answered"):
        parse_best(body, 64, "fp16", False)  # a config for another head dim
