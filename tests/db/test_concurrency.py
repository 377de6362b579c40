"""Several processes writing one database at once (one tuner worker per GPU, several service
workers loading shipped results) lose nothing and duplicate nothing."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from multiprocessing.synchronize import Barrier
from pathlib import Path

import pytest
from sqlalchemy import func, select

from core.problem import Problem as ProblemSpec
from db.models import Build, Gpu, IngestedFile, Measurement, Problem
from db.shipped import load_shipped_results
from db.store import Store
from db.transfer import dump
from tests.support.factories import H200, make_config, make_report, ok_result

WRITERS = 2
MEASUREMENTS_EACH = 80
CONFIGS = [make_config(br=br, bc=bc) for br in (64, 128) for bc in (32, 64, 128)]

BACKENDS = ["sqlite_url", pytest.param("postgres_url", marks=pytest.mark.postgres)]


def _writer(url: str, worker: int, barrier: Barrier) -> None:
    """One worker: open (and migrate) the store, then race the others through every write."""
    barrier.wait(timeout=60)  # start together: migration and get-or-create race too
    with Store.from_url(url) as store:
        gpu_id = store.upsert_gpu(H200)
        problem = ProblemSpec(gpu=H200.name, d=128, n=4096)
        pid = store.problem_id(problem, gpu_id)
        build_ids = [store.record_build(make_report(cfg)) for cfg in CONFIGS]
        for i in range(MEASUREMENTS_EACH):
            result = ok_result(1.0 + worker + i / 1000, problem)
            trial = worker * 10_000 + i
            store.record_measurement(pid, build_ids[i % len(build_ids)], result, H200, trial)


def _loader(url: str, path: str, barrier: Barrier) -> None:
    """One service worker starting up: load the shipped results."""
    barrier.wait(timeout=60)
    with Store.from_url(url) as store:
        load_shipped_results(store, files=[Path(path)])


def _run(target: Callable[..., None], args: list[tuple[object, ...]]) -> None:
    """Run ``target(*a, barrier)`` for each ``a`` in its own process; all must succeed."""
    ctx = multiprocessing.get_context("spawn")  # no engine or lock state copied by fork
    barrier = ctx.Barrier(len(args))
    procs = [ctx.Process(target=target, args=(*a, barrier)) for a in args]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    assert [p.exitcode for p in procs] == [0] * len(args)


def _count(store: Store, model: type) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(model)).scalar_one())


@pytest.mark.parametrize("backend", BACKENDS)
def test_concurrent_writers_lose_no_rows(backend: str, request: pytest.FixtureRequest) -> None:
    url = str(request.getfixturevalue(backend))
    _run(_writer, [(url, w) for w in range(WRITERS)])

    with Store.from_url(url) as store:
        assert _count(store, Measurement) == WRITERS * MEASUREMENTS_EACH
        with store.engine.connect() as conn:
            trials = set(conn.execute(select(Measurement.trial_number)).scalars())
        assert trials == {w * 10_000 + i for w in range(WRITERS) for i in range(MEASUREMENTS_EACH)}
        # The racing get-or-creates produced one row per identity.
        counts = (_count(store, Gpu), _count(store, Problem), _count(store, Build))
        assert counts == (1, 1, len(CONFIGS))
        best = store.best("H200", 128, 4096)
        assert best is not None and best.median_ms == 1.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_concurrent_shipped_loads_ingest_once(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = str(request.getfixturevalue(backend))
    shipped = tmp_path / "h200_results.json"
    with Store.from_url(f"sqlite:///{tmp_path / 'tuned.db'}") as source:
        problem = ProblemSpec(gpu=H200.name, d=128, n=4096)
        pid = source.problem_id(problem, source.upsert_gpu(H200))
        for i, cfg in enumerate(CONFIGS):
            bid = source.record_build(make_report(cfg))
            source.record_measurement(pid, bid, ok_result(1.0 + i / 10, problem), H200)
        dump(source, shipped)

    _run(_loader, [(url, str(shipped))] * WRITERS)

    with Store.from_url(url) as store:
        assert _count(store, Measurement) == len(CONFIGS)
        assert _count(store, IngestedFile) == 1
