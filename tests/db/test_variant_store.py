"""Attention variants in the store: identity, reads, the lookup rule, results files and
migration 0004 (on a database made by 0003, with rows, on both backends)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import text

from core.fa2_config import Fa2Config
from core.lookup import Candidate, pick, variant_distance
from core.problem import Problem
from core.shape import Shape
from core.variant import PLAIN, Variant
from db.dump_format import parse_dump
from db.session import alembic_config, make_engine
from db.store import Store
from db.transfer import dump, export, ingest_file
from tests.support.factories import H200, make_config, make_report, ok_result

WINDOW = Variant(window_left=1024, window_right=0)
SHAPE = Shape(4096, 4096, 2, 16, 16)


def _problem(variant: Variant = PLAIN, **kw: object) -> Problem:
    return Problem(gpu=H200.name, d=128, n=4096, causal=True, variant=variant, **kw)  # type: ignore[arg-type]


def _config(variant: Variant = PLAIN, **kw: object) -> Fa2Config:
    return dataclasses.replace(make_config(causal=True, **kw), **variant.needs)  # type: ignore[arg-type]


def _record(store: Store, problem: Problem, config: Fa2Config, ms: float) -> int:
    gpu = store.upsert_gpu(H200)
    pid = store.problem_id(problem, gpu)
    build = store.record_build(make_report(config))
    store.record_measurement(pid, build, ok_result(ms, problem), H200)
    return pid


def test_a_variant_problem_is_its_own_row_and_reads_back(store: Store) -> None:
    gpu = store.upsert_gpu(H200)
    plain = store.problem_id(_problem(), gpu)
    windowed = store.problem_id(_problem(WINDOW), gpu)
    capped = store.problem_id(_problem(Variant(softcap=30.0)), gpu)
    assert len({plain, windowed, capped}) == 3
    assert store.problem_id(_problem(WINDOW), gpu) == windowed
    # The cap's value is not part of the identity: another cap is the same problem.
    assert store.problem_id(_problem(Variant(softcap=50.0)), gpu) == capped
    _record(store, _problem(WINDOW), _config(WINDOW), 1.0)
    found = store.best_match(H200.name, 128, "fp16", True, SHAPE, variant=WINDOW)
    assert found is not None and found.result.variant == WINDOW


def test_plain_lookups_never_see_variant_problems(store: Store) -> None:
    _record(store, _problem(WINDOW), _config(WINDOW), 0.5)
    assert store.best(H200.name, 128, 4096, "fp16", True) is None
    assert store.best_or_nearest(H200.name, 128, 4096, "fp16", True) is None
    assert store.best_for_shape(H200.name, 128, "fp16", True, SHAPE) is None
    assert store.shape_winners() == []
    _record(store, _problem(), _config(), 1.0)
    plain = store.best_for_shape(H200.name, 128, "fp16", True, SHAPE)
    assert plain is not None and plain.variant == PLAIN and not plain.config.has_variant
    assert plain.median_ms == 1.0  # the faster windowed result is not a plain answer
    assert [b.variant for b, _ in store.shape_winners()] == [PLAIN]


def test_variant_lookup_same_window_else_nearest_else_none(store: Store) -> None:
    far = Variant(window_left=128, window_right=0)
    near = Variant(window_left=2048, window_right=0)
    _record(store, _problem(far), _config(far), 1.0)
    _record(store, _problem(near), _config(near, br=64), 2.0)
    hit = store.best_for_shape(H200.name, 128, "fp16", True, SHAPE, variant=near)
    assert hit is not None and hit.exact and hit.variant == near
    assert hit.config.local and hit.config.name.endswith("_loc")
    # No 1024 window tuned: the nearest one answers (2048 is one doubling away, 128 three).
    nearest = store.best_for_shape(H200.name, 128, "fp16", True, SHAPE, variant=WINDOW)
    assert nearest is not None and not nearest.exact and nearest.variant == near
    assert store.best_for_shape(H200.name, 128, "fp16", True, SHAPE, variant=WINDOW,
                                exact=True) is None  # fmt: skip
    # Other switches: nothing of them is tuned.
    assert store.best_for_shape(H200.name, 128, "fp16", True, SHAPE,
                                variant=Variant(sinks=True)) is None  # fmt: skip
    both = Variant(1024, 0, softcap=30.0)
    assert store.best_for_shape(H200.name, 128, "fp16", True, SHAPE, variant=both) is None
    assert store.best_for_shape(H200.name, 128, "fp16", True, SHAPE) is None  # plain


def test_a_measurement_must_fit_the_variant_switches(store: Store) -> None:
    gpu = store.upsert_gpu(H200)
    pid = store.problem_id(_problem(WINDOW), gpu)
    plain_build = store.record_build(make_report(_config()))
    with pytest.raises(ValueError, match="attention variant"):
        store.record_measurement(pid, plain_build, ok_result(1.0), H200)
    plain_pid = store.problem_id(_problem(), gpu)
    local_build = store.record_build(make_report(_config(WINDOW)))
    with pytest.raises(ValueError, match="attention variant"):
        store.record_measurement(plain_pid, local_build, ok_result(1.0), H200)


def test_variant_distance_and_pick_rules() -> None:
    assert variant_distance(WINDOW, WINDOW) == (0, 0.0)
    assert variant_distance(WINDOW, Variant(2048, 0)) == (0, pytest.approx(1.0, abs=1e-3))
    assert variant_distance(WINDOW, Variant(-1, 0, chunk=1024))[0] == 2
    assert variant_distance(Variant(chunk=512), Variant(chunk=1024)) == (0, 1.0)

    def cand(pid: int, variant: Variant, ms: float) -> Candidate:
        return Candidate(pid, "h200", True, 4096, 4096, 2, 16, 16, "", (-1 / ms, ms, pid),
                         variant)  # fmt: skip

    cands = [cand(1, PLAIN, 1.0), cand(2, Variant(512, 0), 2.0), cand(3, Variant(4096, 0), 3.0)]
    sm = {"h200": 132}
    assert pick(cands, "H200", True, SHAPE, sm).index == 0  # type: ignore[union-attr]
    got = pick(cands, "H200", True, SHAPE, sm, variant=Variant(3000, 0))
    assert got is not None and got.index == 2 and not got.exact
    assert pick(cands, "H200", True, SHAPE, sm, variant=Variant(sinks=True)) is None


def test_results_files_carry_the_variant_only_when_not_plain(
    store: Store, tmp_path: Path, target: Store
) -> None:
    _record(store, _problem(), _config(), 1.0)
    _record(store, _problem(Variant(1024, 0, softcap=30.0, sinks=True)),
            _config(Variant(1024, 0, softcap=30.0, sinks=True)), 2.0)  # fmt: skip
    data = json.loads(export(store).model_dump_json())
    fields = ("window_left", "window_right", "chunk", "softcap", "sinks")
    written = sorted(sum(k in p for k in fields) for p in data["problems"])
    assert written == [0, 4]  # plain: none of the fields; the variant: all but the chunk (0)
    path = tmp_path / "dump.json"
    dump(store, path)
    ingest_file(target, path)
    again = tmp_path / "again.json"
    dump(target, again)
    assert json.loads(again.read_text())["problems"] == json.loads(path.read_text())["problems"]
    hit = target.best_for_shape(H200.name, 128, "fp16", True, SHAPE,
                                variant=Variant(1024, 0, softcap=10.0, sinks=True))  # fmt: skip
    assert hit is not None and hit.variant == Variant(1024, 0, softcap=30.0, sinks=True)


def test_a_results_file_refuses_bad_variants_and_unfit_builds(store: Store) -> None:
    _record(store, _problem(WINDOW), _config(WINDOW), 1.0)
    data = json.loads(export(store).model_dump_json())
    parse_dump(data)  # as written: valid
    bad = json.loads(json.dumps(data))
    bad["problems"][0]["window_left"] = -2
    with pytest.raises(ValueError, match="window_left"):
        parse_dump(bad)
    unfit = json.loads(json.dumps(data))
    for p in (unfit["problems"][0], unfit["measurements"][0]["problem"]):
        p.pop("window_left"), p.pop("window_right")
    # Its TFLOP/s counted the window's visible pairs: leave it out, so the fit is what fails.
    unfit["measurements"][0].pop("tflops")
    with pytest.raises(ValueError, match="attention variant"):
        parse_dump(unfit)  # a plain problem measured by a _loc build


_AT = "'2026-11-30 00:00:00'"


def _seed_0003(url: str) -> None:
    """One GPU, a plain build, a plain problem and its measurement, as 0003 stored them."""
    engine = make_engine(url)
    build = _config()
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO gpus (name, name_key, compute_capability, sm_count, "
                    "driver_version, cuda_version, memory_bytes, smem_optin_bytes, created_at, "
                    "updated_at) VALUES ('NVIDIA H200', 'h200', '9.0', 132, 'd', 'c', 0, 0, "
                    f"{_AT}, {_AT})"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO builds (config_key, config_name, family, d, dtype, causal, "
                    "params, arch, status, registers, spill_stores, spill_loads, stack_bytes, "
                    "static_smem, compile_seconds, source_hash, nvcc_version, flags, error, "
                    "created_at) VALUES (:key, :name, 'fa2', 128, 'fp16', true, :params, "
                    f"'sm_90', 'OK', 168, 0, 0, 0, 0, 1.0, 'h', 'v', '[]', NULL, {_AT})"
                ),
                {"key": build.key, "name": build.name, "params": json.dumps(build.params())},
            )
            conn.execute(
                text(
                    "INSERT INTO problems (gpu_id, d, n, nk, batch, heads, kv_heads, dtype, "
                    "causal, seqlens, created_at) SELECT id, 128, 4096, 4096, 2, 16, 16, "
                    f"'fp16', true, '', {_AT} FROM gpus"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO measurements (problem_id, build_id, status, median_ms, reps, "
                    "driver_version, cuda_version, created_at) SELECT p.id, b.id, 'OK', 1.5, 100, "
                    f"'d', 'c', {_AT} FROM problems p, builds b"
                )
            )
    finally:
        engine.dispose()


def test_migration_0004_on_a_0003_database_with_rows(file_url: str) -> None:
    config = alembic_config(file_url)
    command.upgrade(config, "0003")
    _seed_0003(file_url)
    command.upgrade(config, "head")
    engine = make_engine(file_url)
    try:
        with engine.connect() as conn:
            row = conn.execute(text(
                "SELECT window_left, window_right, chunk, softcap_on, softcap, sinks "
                "FROM problems"
            )).one()  # fmt: skip
            assert tuple(row) == (-1, -1, 0, False, 0.0, False)
            pid = conn.execute(text("SELECT id FROM problems")).scalar_one()
            assert conn.execute(text("SELECT problem_id FROM measurements")).scalar_one() == pid
        store = Store(engine)
        plain = store.best_for_shape(H200.name, 128, "fp16", True, SHAPE)
        assert plain is not None and plain.median_ms == 1.5 and plain.variant == PLAIN
        # The new identity: the windowed problem of the same shape is a row of its own.
        _record(store, _problem(WINDOW), _config(WINDOW), 1.0)
        again = store.best_for_shape(H200.name, 128, "fp16", True, SHAPE)
        assert again is not None and again.median_ms == 1.5
        # Down again: refused while a variant problem is stored, then it keeps the rest.
        with pytest.raises(RuntimeError, match="attention variants"):
            command.downgrade(config, "0003")
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM measurements WHERE problem_id != :p"), {"p": pid})
            conn.execute(text("DELETE FROM problems WHERE window_left != -1"))
        command.downgrade(config, "0003")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT COUNT(*) FROM measurements")).scalar_one() == 1
            columns = conn.execute(text("SELECT * FROM problems")).keys()
            assert "window_left" not in columns
        command.upgrade(config, "head")
    finally:
        engine.dispose()


def test_shipped_results_files_reexport_as_they_did() -> None:
    """No variant field appears in a plain file's re-export; the files written since seqlens
    joined the format (0003) come back byte for byte, the variants' file with its fields (the
    two older ones gain only ``"seqlens": null``, as they did before variants)."""
    shipped = sorted((Path(__file__).parents[2] / "db" / "data").glob("*.json"))
    assert any("variants" in p.name for p in shipped)
    for path in shipped:
        raw = path.read_text()
        out = parse_dump(raw).model_dump_json(indent=1) + "\n"
        fields = [f'"{k}"' for k in ("window_left", "chunk", "softcap", "sinks")]
        assert any(f in out for f in fields) == ("variants" in path.name), path.name
        if '"seqlens"' in raw:
            assert out == raw, path.name
