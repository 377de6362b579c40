"""KV-cache problems in the store: identity, reads, the lookup rule (a cache layout answers
only its own calls), results files and migration 0006 (on a database made by 0005, with rows,
on both backends)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import text

from core.lookup import Candidate, pick
from core.problem import Problem
from core.shape import Shape
from core.splitkv_config import SplitKvConfig
from db.dump_format import parse_dump
from db.session import alembic_config, make_engine
from db.store import Store
from db.transfer import dump, export, ingest_file
from tests.support.factories import H200, make_report, ok_result, record_ok
from tests.support.raw_rows import insert_build_and_measurement

#: A decode step over 8192 keys, GQA 32:8 (the cache kernels' shape).
DECODE = Shape(1, 8192, 8, 32, 8)


def _problem(kv_page: int | None = None, nk: int = 8192) -> Problem:
    return Problem(gpu=H200.name, d=128, n=1, nk=nk, batch=8, heads=32, kv_heads=8,
                   kv_page=kv_page)  # fmt: skip


def _config(kv_page: int | None = None, splits: int = 16) -> SplitKvConfig:
    base = SplitKvConfig(128, "fp16", False, splits=splits)
    if kv_page is None:
        return base
    return dataclasses.replace(base, kvcache=True, page=kv_page)


def test_each_layout_is_its_own_row_and_reads_back(store: Store) -> None:
    gpu = store.upsert_gpu(H200)
    ids = {page: store.problem_id(_problem(page), gpu) for page in (None, 0, 16, 64)}
    assert len(set(ids.values())) == 4
    assert store.problem_id(_problem(16), gpu) == ids[16]
    record_ok(store, _problem(16), _config(16), 0.05)
    found = store.best_match(H200.name, 128, "fp16", False, DECODE, kv_page=16)
    assert found is not None and found.result.kv_page == 16
    assert found.result.config.name.endswith("_kvc_pg16") and found.result.exact
    assert found.result.to_dict()["kv_page"] == 16


def test_layouts_never_answer_each_other_or_dense_calls(store: Store) -> None:
    record_ok(store, _problem(16), _config(16), 0.05)
    record_ok(store, _problem(0, nk=4096), _config(0, splits=32), 0.04)
    # A dense call sees no cache problem, whichever lookup asks.
    assert store.best_for_shape(H200.name, 128, "fp16", False, DECODE) is None
    assert store.best(H200.name, 128, 1, nk=8192) is None
    assert store.shape_winners() == []
    assert store.results().total == 2  # the listing shows them, with their layout
    assert {r.kv_page for r in store.results().items} == {0, 16}
    # Each layout answers only its own calls: 16 never answers 32, nor 0 (nearest shape) 16.
    assert store.best_for_shape(H200.name, 128, "fp16", False, DECODE, kv_page=32) is None
    contiguous = store.best_for_shape(H200.name, 128, "fp16", False, DECODE, kv_page=0)
    assert contiguous is not None and contiguous.kv_page == 0 and not contiguous.exact
    assert contiguous.nk == 4096 and contiguous.config.name.endswith("_k32_kvc")
    # A dense result never answers a cache lookup.
    record_ok(store, _problem(None), _config(None, splits=8), 0.03)
    dense = store.best_for_shape(H200.name, 128, "fp16", False, DECODE)
    assert dense is not None and dense.kv_page is None and "_kvc" not in dense.config.name
    paged = store.best_for_shape(H200.name, 128, "fp16", False, DECODE, kv_page=16)
    assert paged is not None and paged.config.name.endswith("_kvc_pg16")
    assert store.best_for_shape(H200.name, 128, "fp16", False, DECODE, kv_page=64) is None


def test_a_measurement_must_fit_the_layout(store: Store) -> None:
    gpu = store.upsert_gpu(H200)
    paged = store.problem_id(_problem(16), gpu)
    dense = store.problem_id(_problem(None), gpu)
    for pid, config in ((paged, _config(None)), (paged, _config(32)), (dense, _config(0))):
        build = store.record_build(make_report(config))  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="KV-cache layout"):
            store.record_measurement(pid, build, ok_result(1.0), H200)


def test_pick_keeps_layouts_apart() -> None:
    def cand(pid: int, page: int | None) -> Candidate:
        return Candidate(pid, "h200", False, 1, 8192, 8, 32, 8, "", (-1.0, 1.0, pid),
                         kv_page=page)  # fmt: skip

    cands = [cand(1, None), cand(2, 0), cand(3, 16)]
    sm = {"h200": 132}
    for page, index in ((None, 0), (0, 1), (16, 2)):
        found = pick(cands, "H200", False, DECODE, sm, kv_page=page)
        assert found is not None and found.index == index
    assert pick(cands, "H200", False, DECODE, sm, kv_page=1) is None
    # The phase rule holds for cache problems as for dense ones: prefill never answers decode.
    long = Candidate(4, "h200", False, 4096, 8192, 8, 32, 8, "", (-9.0, 1.0, 4), kv_page=64)
    assert pick([long], "H200", False, DECODE, sm, kv_page=64) is None


def test_results_files_carry_the_layout_only_when_set(
    store: Store, tmp_path: Path, target: Store
) -> None:
    record_ok(store, _problem(None), _config(None), 0.03)
    record_ok(store, _problem(16), _config(16), 0.05)
    record_ok(store, _problem(0), _config(0), 0.04)
    data = json.loads(export(store).model_dump_json())
    assert sorted(str(p.get("kv_page")) for p in data["problems"]) == ["0", "16", "None"]
    assert all("kv_page" in m["problem"] for m in data["measurements"]
               if m["build"]["config_name"].find("_kvc") > 0)  # fmt: skip
    path = tmp_path / "dump.json"
    dump(store, path)
    ingest_file(target, path)
    again = tmp_path / "again.json"
    dump(target, again)
    assert json.loads(again.read_text())["problems"] == json.loads(path.read_text())["problems"]
    hit = target.best_for_shape(H200.name, 128, "fp16", False, DECODE, kv_page=16)
    assert hit is not None and hit.kv_page == 16 and hit.median_ms == 0.05
    assert ingest_file(target, path).added == 0  # the same rows, found by their keys


def test_a_results_file_refuses_bad_layouts_and_unfit_builds(store: Store) -> None:
    record_ok(store, _problem(16), _config(16), 0.05)
    data = json.loads(export(store).model_dump_json())
    parse_dump(data)  # as written: valid
    for bad_page in (3, -1, 8192, True):
        bad = json.loads(json.dumps(data))
        bad["problems"][0]["kv_page"] = bad_page
        bad["measurements"][0]["problem"]["kv_page"] = bad_page
        with pytest.raises(ValueError, match="kv_page"):
            parse_dump(bad)
    unfit = json.loads(json.dumps(data))
    for p in (unfit["problems"][0], unfit["measurements"][0]["problem"]):
        p.pop("kv_page")
    with pytest.raises(ValueError, match="KV-cache layout"):
        parse_dump(unfit)  # a dense problem measured by a _kvc_pg16 build


def test_migration_0006_on_a_0005_database_with_rows(file_url: str) -> None:
    config = alembic_config(file_url)
    command.upgrade(config, "0005")
    engine = make_engine(file_url)
    try:
        # The rows 0005's schema holds, written by today's store before the column exists:
        # a dense problem, measured.
        with engine.begin() as conn:
            columns = conn.execute(text("SELECT * FROM problems")).keys()
            assert "kv_page" not in columns
        store = Store(engine)
        gpu = store.upsert_gpu(H200)
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO problems (gpu_id, d, n, nk, batch, heads, kv_heads, dtype, causal, "
                "seqlens, window_left, window_right, chunk, softcap_on, softcap, sinks, "
                "created_at) VALUES (:g, 128, 1, 8192, 8, 32, 8, 'fp16', false, '', -1, -1, 0, "
                "false, 0, false, '2026-12-01 00:00:00')"
            ), {"g": gpu})  # fmt: skip
            pid = conn.execute(text("SELECT id FROM problems")).scalar_one()
        insert_build_and_measurement(engine, pid, _config(None), 0.03)
        command.upgrade(config, "head")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT kv_page FROM problems")).scalar_one() == -1
            assert conn.execute(text("SELECT id FROM problems")).scalar_one() == pid
            assert conn.execute(text("SELECT problem_id FROM measurements")).scalar_one() == pid
        dense = store.best_for_shape(H200.name, 128, "fp16", False, DECODE)
        assert dense is not None and dense.median_ms == 0.03 and dense.kv_page is None
        # The new identity: the paged problem of the same shape is a row of its own.
        paged = record_ok(store, _problem(16), _config(16), 0.05)
        assert paged != pid
        again = store.best_for_shape(H200.name, 128, "fp16", False, DECODE)
        assert again is not None and again.median_ms == 0.03
        # Down again: refused while a cache problem is stored, then it keeps the rest.
        with pytest.raises(RuntimeError, match="KV-cache problems"):
            command.downgrade(config, "0005")
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM measurements WHERE problem_id = :p"), {"p": paged})
            conn.execute(text("DELETE FROM problems WHERE kv_page != -1"))
        command.downgrade(config, "0005")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT COUNT(*) FROM measurements")).scalar_one() == 1
            columns = conn.execute(text("SELECT * FROM problems")).keys()
            assert "kv_page" not in columns
        command.upgrade(config, "head")
    finally:
        engine.dispose()
