"""Store: identities of GPUs/builds/problems, best and nearest-N queries, listings."""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC

import pytest
from sqlalchemy import event, func, select, text

from core.build_report import BuildStatus
from core.gpu_name import normalize_gpu_name
from core.problem import Problem as ProblemSpec
from core.records import GpuInfo, MeasureStatus
from db.models import Build, Gpu, Measurement, Problem
from db.store import Store
from tests.support.factories import (
    H200,
    failed_result,
    make_config,
    make_report,
    ok_result,
    seed_measurement,
)

H100 = GpuInfo(
    name="NVIDIA H100 80GB HBM3",
    compute_capability="9.0",
    sm_count=132,
    driver_version="550.54.15",
    cuda_version="12.4",
)


def _count(store: Store, model: type) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(model)).scalar_one())


def _record(
    store: Store,
    problem: ProblemSpec,
    median_ms: float | None,
    *,
    status: MeasureStatus = MeasureStatus.OK,
    gpu: GpuInfo = H200,
    **config: object,
) -> int:
    """Record one measurement of a config (given by its fields) for ``problem``."""
    cfg = make_config(d=problem.d, dtype=problem.dtype, causal=problem.causal, **config)  # type: ignore[arg-type]
    gpu_id = store.upsert_gpu(gpu)
    pid = store.problem_id(problem, gpu_id)
    bid = store.record_build(make_report(cfg))
    result = (
        ok_result(median_ms, problem)
        if status == MeasureStatus.OK and median_ms is not None
        else failed_result(status, median_ms)
    )
    return store.record_measurement(pid, bid, result, gpu)


# ------------------------------------------------------------------------------ identities


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H200", "h200"),
        ("nvidia h200", "h200"),
        ("H200", "h200"),
        ("  NVIDIA   H200 ", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100 80gb hbm3"),
        ("Tesla NVIDIA X", "tesla nvidia x"),  # only a leading NVIDIA is dropped
    ],
)
def test_normalize_gpu_name(name: str, key: str) -> None:
    assert normalize_gpu_name(name) == key


def test_upsert_gpu_is_one_row_per_name_and_compute_capability(store: Store) -> None:
    first = store.upsert_gpu(H200)
    again = store.upsert_gpu(dataclasses.replace(H200, driver_version="570.10", name="nvidia h200"))
    other_cc = store.upsert_gpu(dataclasses.replace(H200, compute_capability="9.1"))
    other = store.upsert_gpu(H100)

    assert first == again
    assert len({first, other_cc, other}) == 3
    assert _count(store, Gpu) == 3
    with store.engine.connect() as conn:
        driver = conn.execute(select(Gpu.driver_version).where(Gpu.id == first)).scalar_one()
    assert driver == "570.10"  # latest seen is kept on the GPU row


def test_record_build_is_idempotent_on_identity(store: Store) -> None:
    cfg = make_config()
    report = make_report(cfg)
    first = store.record_build(report)
    assert store.record_build(report) == first
    assert _count(store, Build) == 1

    # A rebuild of the same source corrects the report in place.
    fixed = dataclasses.replace(report, status=BuildStatus.SPILLS, spill_stores=16)
    assert store.record_build(fixed) == first
    with store.engine.connect() as conn:
        row = conn.execute(select(Build).where(Build.id == first)).one()
    assert (row.status, row.spill_stores, row.config_name) == ("SPILLS", 16, cfg.name)
    assert row.flags == ["-O3", "-arch=sm_90", "-cubin"]

    assert store.record_build(make_report(cfg, source_hash="other")) != first
    assert store.record_build(make_report(cfg, arch="sm_100")) != first
    assert _count(store, Build) == 3


def test_problem_id_get_or_create(store: Store) -> None:
    gpu_id = store.upsert_gpu(H200)
    square = ProblemSpec(gpu="H200", d=128, n=4096)
    pid = store.problem_id(square, gpu_id)
    # nk/kv_heads left None mean n/heads: the same problem.
    explicit = ProblemSpec(gpu="H200", d=128, n=4096, nk=4096, kv_heads=16)
    assert store.problem_id(explicit, gpu_id) == pid
    assert store.problem_id(square, gpu_id) == pid
    assert store.problem_id(dataclasses.replace(square, n=8192), gpu_id) != pid
    assert store.problem_id(dataclasses.replace(square, causal=True), gpu_id) != pid
    assert store.problem_id(square, store.upsert_gpu(H100)) != pid
    assert _count(store, Problem) == 4


def test_record_measurement_keeps_provenance(store: Store) -> None:
    problem = ProblemSpec(gpu="H200", d=128, n=4096)
    seeded = seed_measurement(store, problem=problem, trial_number=7)
    with store.engine.connect() as conn:
        m = conn.execute(select(Measurement).where(Measurement.id == seeded.measurement_id)).one()
    assert m.status == "OK"
    assert m.trial_number == 7
    assert (m.driver_version, m.cuda_version) == (H200.driver_version, H200.cuda_version)
    assert (m.sm_clock_mhz, m.mem_clock_mhz) == (1980, 3201)
    assert m.median_ms == pytest.approx(1.0)


def test_record_measurement_rejects_inconsistent_input(store: Store) -> None:
    gpu_id = store.upsert_gpu(H200)
    pid = store.problem_id(ProblemSpec(gpu="H200", d=128, n=4096), gpu_id)
    wrong_d = store.record_build(make_report(make_config(d=64)))
    right = store.record_build(make_report(make_config(d=128)))

    with pytest.raises(ValueError, match="does not fit"):
        store.record_measurement(pid, wrong_d, ok_result(1.0), H200)
    with pytest.raises(ValueError, match="median_ms"):
        store.record_measurement(pid, right, failed_result(MeasureStatus.OK), H200)
    with pytest.raises(ValueError, match="no problem"):
        store.record_measurement(pid + 100, right, ok_result(1.0), H200)
    with pytest.raises(ValueError, match="no build"):
        store.record_measurement(pid, right + 100, ok_result(1.0), H200)
    assert _count(store, Measurement) == 0


# ------------------------------------------------------------------------------------ best


def test_best_counts_only_ok_and_fastest_wins(store: Store) -> None:
    problem = ProblemSpec(gpu="H200", d=128, n=4096)
    # Faster, but not OK: none of these may win.
    _record(store, problem, 0.2, status=MeasureStatus.WRONG_RESULT, br=64, bc=32)
    _record(store, problem, None, status=MeasureStatus.RUNTIME_FAILED, br=64, bc=64)
    _record(store, problem, None, status=MeasureStatus.TIMEOUT, br=64, bc=128)
    _record(store, problem, None, status=MeasureStatus.SPILLS, br=128, bc=128)
    _record(store, problem, 1.30, br=128, bc=64, warps=4)
    winner = _record(store, problem, 0.91, br=128, bc=32, warps=8, stages=2)
    _record(store, problem, 1.05, br=64, bc=64, warps=4, stages=2)
    # Same tile, other problems: must not leak in.
    _record(store, dataclasses.replace(problem, causal=True), 0.1, br=128, bc=32, warps=8)
    _record(store, dataclasses.replace(problem, dtype="bf16"), 0.1, br=128, bc=32, warps=8)
    _record(store, dataclasses.replace(problem, d=64), 0.1, br=128, bc=32, warps=8)
    _record(store, dataclasses.replace(problem, n=8192), 0.1, br=128, bc=32, warps=8)

    best = store.best("H200", 128, 4096)
    assert best is not None
    assert best.measurement_id == winner
    assert best.median_ms == pytest.approx(0.91)
    assert best.config == make_config(br=128, bc=32, warps=8, stages=2)
    assert best.config_name == best.config.name
    assert (best.d, best.n, best.nk, best.dtype, best.causal) == (128, 4096, 4096, "fp16", False)
    assert (best.batch, best.heads, best.kv_heads) == (2, 16, 16)
    assert best.exact is True and best.from_n == 4096
    assert best.gpu == "NVIDIA H200" and best.compute_capability == "9.0"
    assert (best.arch, best.registers, best.spill_stores) == ("sm_90", 168, 0)
    assert best.source_hash == f"src-{best.config.key}"
    assert best.nvcc_version.startswith("Cuda compilation tools")
    assert best.driver_version == H200.driver_version
    assert best.measured_at.tzinfo is not None and best.measured_at.utcoffset() == UTC.utcoffset(
        None
    )
    assert best.tflops == pytest.approx(problem.tflops(0.91))
    assert best.to_dict()["config"]["warps"] == 8

    causal = store.best("H200", 128, 4096, causal=True)
    assert causal is not None and causal.causal and causal.config.causal


def test_best_is_none_without_an_ok_measurement(store: Store) -> None:
    problem = ProblemSpec(gpu="H200", d=128, n=4096)
    _record(store, problem, 0.5, status=MeasureStatus.WRONG_RESULT)
    _record(store, problem, None, status=MeasureStatus.COMPILE_FAILED, br=64)
    assert store.best("H200", 128, 4096) is None
    assert store.best_or_nearest("H200", 128, 4096) is None
    assert store.best("H100", 128, 4096) is None


@pytest.mark.parametrize("asked", ["H200", "h200", "nvidia h200", "NVIDIA H200", " NVIDIA  H200 "])
def test_best_matches_gpu_names_as_users_write_them(store: Store, asked: str) -> None:
    seed_measurement(store)
    best = store.best(asked, 128, 4096)
    assert best is not None and best.gpu == "NVIDIA H200"
    assert store.best("H100", 128, 4096) is None
    assert store.best("H20", 128, 4096) is None


def test_best_compares_batch_and_heads_by_throughput(store: Store) -> None:
    small = ProblemSpec(gpu="H200", d=128, n=4096, batch=1, heads=8)
    big = ProblemSpec(gpu="H200", d=128, n=4096, batch=4, heads=32)
    _record(store, small, 0.30, br=64)  # 16x less work in 0.30 ms: slower per FLOP
    _record(store, big, 2.0, br=128)

    overall = store.best("H200", 128, 4096)
    assert overall is not None and (overall.batch, overall.heads) == (4, 32)
    only_small = store.best("H200", 128, 4096, batch=1, heads=8)
    assert only_small is not None and only_small.config.br == 64
    assert store.best("H200", 128, 4096, batch=2) is None


def test_best_square_unless_nk_given(store: Store) -> None:
    _record(store, ProblemSpec(gpu="H200", d=128, n=4096, nk=512), 0.1, br=64)
    assert store.best("H200", 128, 4096) is None
    hit = store.best("H200", 128, 4096, nk=512)
    assert hit is not None and hit.nk == 512


def test_best_or_nearest_falls_back_to_nearest_tuned_n(store: Store) -> None:
    for n, br in ((1024, 64), (4096, 128)):
        _record(store, ProblemSpec(gpu="H200", d=128, n=n), 1.0, br=br)
    # Only failures at 16384 and on another D: not "tuned".
    _record(store, ProblemSpec(gpu="H200", d=128, n=16384), None, status=MeasureStatus.TIMEOUT)
    _record(store, ProblemSpec(gpu="H200", d=64, n=3000), 1.0)

    exact = store.best_or_nearest("H200", 128, 4096)
    assert exact is not None and exact.exact and exact.from_n == 4096

    cases = {3000: 4096, 1500: 1024, 2048: 4096, 100_000: 4096, 16384: 4096, 8: 1024}
    for asked, tuned in cases.items():
        near = store.best_or_nearest("nvidia h200", 128, asked)
        assert near is not None, asked
        assert (near.exact, near.from_n, near.n) == (False, tuned, tuned), asked
        assert near.config.br == (128 if tuned == 4096 else 64)
    assert store.best_or_nearest("H200", 96, 4096) is None
    assert store.best_or_nearest("H200", 128, 4096, causal=True) is None
    assert store.best_or_nearest("H100", 128, 4096) is None


def test_best_reads_through_the_index(store: Store) -> None:
    """Best-for-a-problem is a range scan of ix_measurements_best, not a scan and sort."""
    if store.engine.dialect.name != "sqlite":
        pytest.skip("query plans are asserted on SQLite only")
    problem = ProblemSpec(gpu="H200", d=128, n=4096)
    for i in range(20):
        _record(store, problem, 1.0 + i / 100, br=64 if i % 2 else 128, stages=1 + i // 2)
    statements: list[tuple[str, tuple[object, ...]]] = []

    def capture(
        conn: object, cursor: object, stmt: str, params: tuple[object, ...], *_: object
    ) -> None:
        if "FROM measurements" in stmt and "ORDER BY measurements.median_ms" in stmt:
            statements.append((stmt, params))

    event.listen(store.engine, "before_cursor_execute", capture)
    try:
        assert store.best("H200", 128, 4096) is not None
    finally:
        event.remove(store.engine, "before_cursor_execute", capture)
    assert len(statements) == 1
    stmt, params = statements[0]
    with store.engine.connect() as conn:
        plan = " | ".join(
            str(row[-1]) for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + stmt, params)
        )
    assert "ix_measurements_best" in plan
    assert "TEMP B-TREE" not in plan
    assert "SCAN measurements" not in plan


# ---------------------------------------------------------------------------------- reads


def test_measured_pairs_lists_config_keys_of_a_problem(store: Store) -> None:
    problem = ProblemSpec(gpu="H200", d=128, n=4096)
    _record(store, problem, 1.0, br=64)
    _record(store, problem, None, status=MeasureStatus.RUNTIME_FAILED, br=128)
    _record(store, problem, 1.1, br=64)  # measured twice: one key
    _record(store, dataclasses.replace(problem, n=8192), 1.0, br=128, bc=128)
    pid = store.problem_id(problem, store.upsert_gpu(H200))

    assert store.measured_pairs(pid) == {make_config(br=64).key, make_config(br=128).key}
    other = store.problem_id(ProblemSpec(gpu="H200", d=96, n=4096), store.upsert_gpu(H200))
    assert store.measured_pairs(other) == set()


def test_results_are_paginated_and_filtered(store: Store) -> None:
    problem = ProblemSpec(gpu="H200", d=128, n=4096)
    for i in range(23):
        _record(store, problem, 2.0 - i / 100, stages=1 + i)
    _record(store, problem, None, status=MeasureStatus.TIMEOUT, stages=99)
    _record(store, ProblemSpec(gpu="H100", d=128, n=4096), 1.0, gpu=H100)
    _record(store, ProblemSpec(gpu="H200", d=64, n=1024), 1.0)

    page1 = store.results(gpu="h200", d=128, n=4096, limit=10)
    page2 = store.results(gpu="h200", d=128, n=4096, offset=10, limit=10)
    page3 = store.results(gpu="h200", d=128, n=4096, offset=20, limit=10)
    assert page1.total == page2.total == page3.total == 24
    assert [len(p.items) for p in (page1, page2, page3)] == [10, 10, 4]
    rows = page1.items + page2.items + page3.items
    assert len({r.measurement_id for r in rows}) == 24
    medians = [r.median_ms for r in rows if r.median_ms is not None]
    assert medians == sorted(medians)  # fastest first
    assert rows[-1].status == "TIMEOUT" and rows[-1].median_ms is None  # failures last
    assert rows[0].config_name == make_config(stages=23).name

    assert store.results().total == 26
    assert store.results(gpu="nvidia h100 80GB HBM3").total == 1
    assert store.results(gpu="H100").total == 0  # names match whole, not by prefix
    assert store.results(d=64).items[0].n == 1024
    assert store.results(status="TIMEOUT").total == 1
    assert store.results(gpu="H200", causal=True).total == 0
    assert page1.to_dict()["items"][0]["measured_at"].endswith("+00:00")
    with pytest.raises(ValueError):
        store.results(limit=0)
    with pytest.raises(ValueError):
        store.results(offset=-1)


def test_gpus_lists_counts(store: Store) -> None:
    problem = ProblemSpec(gpu="H200", d=128, n=4096)
    _record(store, problem, 1.0)
    _record(store, problem, None, status=MeasureStatus.TIMEOUT, br=64)
    store.upsert_gpu(H100)

    gpus = {g.name: g for g in store.gpus()}
    assert set(gpus) == {"NVIDIA H200", "NVIDIA H100 80GB HBM3"}
    assert (gpus["NVIDIA H200"].measurements, gpus["NVIDIA H200"].ok_measurements) == (2, 1)
    assert gpus["NVIDIA H200"].memory_bytes == H200.memory_bytes  # > 2**31: a BigInteger
    assert (gpus["NVIDIA H100 80GB HBM3"].measurements, gpus["NVIDIA H100 80GB HBM3"].sm_count) == (
        0,
        132,
    )


def test_non_finite_error_figures_are_stored(store: Store) -> None:
    problem = ProblemSpec(gpu="H200", d=128, n=4096)
    mid = _record(store, problem, 0.5, status=MeasureStatus.WRONG_RESULT)
    with store.engine.connect() as conn:
        err = conn.execute(select(Measurement.max_abs_err).where(Measurement.id == mid)).scalar()
    assert err is not None and math.isinf(err)


def test_foreign_keys_are_enforced(store: Store) -> None:
    from sqlalchemy.exc import IntegrityError

    with pytest.raises(IntegrityError), store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO problems (gpu_id, d, n, nk, batch, heads, kv_heads, dtype, causal,"
                " created_at) VALUES (999, 128, 1, 1, 1, 1, 1, 'fp16', false, '2024-01-01')"
            )
        )


def test_best_of_one_family(store: Store) -> None:
    from core.fa3_config import Fa3Config

    problem = ProblemSpec(gpu=H200.name, d=128, n=4096)
    fa3 = Fa3Config(128, "fp16", False)
    seed_measurement(store, problem=problem, result=ok_result(2.0, problem))  # fa2, slower
    seed_measurement(store, problem=problem, config=fa3, result=ok_result(1.0, problem))
    winner = store.best("H200", 128, 4096)
    assert winner is not None and winner.config == fa3
    fa2 = store.best("H200", 128, 4096, family="fa2")
    assert fa2 is not None and fa2.config.family == "fa2" and fa2.median_ms == 2.0
    assert store.best("H200", 128, 4096, family="fa9") is None
    assert winner.to_dict()["config"]["family"] == "fa3"
    rows = store.results("H200", 128).items
    assert sorted(r.family for r in rows) == ["fa2", "fa3"]
    assert all(r.config_name.startswith(r.family + "_") for r in rows)
