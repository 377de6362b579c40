"""KV-cache length patterns in the store: identity (a shape's ``mixed`` problem and its
``full`` one are two rows), lookups (a pattern answers only its own lookups), results files
(``kv_lengths`` written only when ``mixed``; bad patterns refused with nothing written),
migration 0007 (on a database made by 0006, with rows, on both backends) and ``fa2tune best
--kv-lengths``."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import func, inspect, select, text
from typer.testing import CliRunner

from core.lookup import Candidate, pick
from core.problem import Problem
from core.shape import Shape
from core.splitkv_config import SplitKvConfig
from db import queries
from db.dump_format import TransferError, load_dump, parse_dump
from db.models import Measurement
from db.models import Problem as ProblemRow
from db.session import alembic_config, make_engine, session_scope
from db.store import Store
from db.transfer import dump, export, ingest, ingest_file, to_json
from fa2tune.cli import app
from tests.support.factories import H200, record_ok
from tests.support.raw_rows import insert_build_and_measurement

#: A decode step over 8192 keys, GQA 32:8 (the cache kernels' shape).
DECODE = Shape(1, 8192, 8, 32, 8)
ROOT = Path(__file__).resolve().parents[2]
#: Shipped files of cache problems, all written before length patterns.
SHIPPED_CACHE = [ROOT / "db" / "data" / f"h200_results_kvcache{s}.json" for s in ("", "_fa3")]


def _problem(lengths: str = "full", page: int | None = 16, nk: int = 8192) -> Problem:
    return Problem(gpu=H200.name, d=128, n=1, nk=nk, batch=8, heads=32, kv_heads=8,
                   kv_page=page, kv_lengths=lengths)  # fmt: skip


def _config(page: int | None = 16, splits: int = 16) -> SplitKvConfig:
    base = SplitKvConfig(128, "fp16", False, splits=splits)
    return base if page is None else dataclasses.replace(base, kvcache=True, page=page)


def _seed_both(store: Store) -> tuple[int, int]:
    """A paged (P=16) decode problem tuned on full lengths (8 splits win) and on a length
    mix (32 splits win), each with the other's config slower."""
    full = record_ok(store, _problem("full"), _config(splits=8), 0.05)
    record_ok(store, _problem("full"), _config(splits=32), 0.07)
    mixed = record_ok(store, _problem("mixed"), _config(splits=32), 0.02)
    record_ok(store, _problem("mixed"), _config(splits=8), 0.04)
    return full, mixed


# ------------------------------------------------------------------------ identity, lookups


def test_a_pattern_is_part_of_the_identity(store: Store) -> None:
    gpu = store.upsert_gpu(H200)
    ids = {
        (page, lengths): store.problem_id(_problem(lengths, page), gpu)
        for page in (0, 16)
        for lengths in ("full", "mixed")
    }
    assert len(set(ids.values())) == 4
    assert store.problem_id(_problem("mixed", 16), gpu) == ids[(16, "mixed")]
    with session_scope(store.engine) as s:
        stored = {(r.kv_page, r.kv_lengths) for r in s.scalars(select(ProblemRow))}
        spec = queries.problem_spec(s.get_one(ProblemRow, ids[(0, "mixed")]), H200.name)
    assert stored == set(ids)
    assert spec == _problem("mixed", 0)  # read back as the campaign's problem, pattern kept


def test_a_mixed_problem_needs_a_cache_layout() -> None:
    with pytest.raises(ValueError, match="needs kv_page"):
        _problem("mixed", page=None)
    with pytest.raises(ValueError, match="kv_lengths must be one of"):
        _problem("half")


def test_each_pattern_answers_only_its_own_lookups(store: Store) -> None:
    _seed_both(store)
    full = store.best_for_shape(H200.name, 128, "fp16", False, DECODE, kv_page=16)
    assert full is not None and full.kv_lengths == "full" and full.exact
    assert full.config.name == _config(splits=8).name and full.median_ms == 0.05
    mixed = store.best_for_shape(H200.name, 128, "fp16", False, DECODE, kv_page=16,
                                 kv_lengths="mixed")  # fmt: skip
    assert mixed is not None and mixed.kv_lengths == "mixed" and mixed.exact
    assert mixed.config.name == _config(splits=32).name and mixed.median_ms == 0.02
    # The throughput is the mixed problem's own: each sequence's keys, not the capacity.
    assert mixed.tflops == pytest.approx(_problem("mixed").tflops(0.02))
    assert mixed.tflops is not None and mixed.tflops < _problem("full").tflops(0.02)
    assert mixed.to_dict()["kv_lengths"] == "mixed" and "kv_lengths" not in full.to_dict()
    # best_match answers alike; a dense call sees neither.
    found = store.best_match(H200.name, 128, "fp16", False, DECODE, kv_page=16,
                             kv_lengths="mixed")  # fmt: skip
    assert found is not None and found.result.problem_id == mixed.problem_id
    assert store.best_for_shape(H200.name, 128, "fp16", False, DECODE) is None


def test_a_pattern_never_answers_the_other(store: Store) -> None:
    record_ok(store, _problem("mixed"), _config(splits=32), 0.02)
    assert store.best_for_shape(H200.name, 128, "fp16", False, DECODE, kv_page=16) is None
    near = store.best_for_shape(H200.name, 128, "fp16", False, Shape(1, 4096, 8, 32, 8),
                                kv_page=16, kv_lengths="mixed")  # fmt: skip
    assert near is not None and not near.exact and near.kv_lengths == "mixed"
    record_ok(store, _problem("full", nk=2048), _config(splits=4), 0.01)
    # The nearest of the asked pattern, never a nearer or faster one of the other.
    again = store.best_for_shape(H200.name, 128, "fp16", False, DECODE, kv_page=16,
                                 kv_lengths="mixed")  # fmt: skip
    assert again is not None and again.nk == 8192 and again.kv_lengths == "mixed"
    other = store.best_for_shape(H200.name, 128, "fp16", False, DECODE, kv_page=16)
    assert other is not None and other.nk == 2048 and other.kv_lengths == "full"
    # Nor another layout's problem of the pattern.
    assert store.best_for_shape(H200.name, 128, "fp16", False, DECODE, kv_page=0,
                                kv_lengths="mixed") is None  # fmt: skip


@pytest.mark.parametrize(("page", "lengths", "why"), [
    (None, "mixed", "needs kv_page"),
    (16, "half", "kv_lengths must be one of"),
    (None, "", "kv_lengths must be one of"),
])  # fmt: skip
def test_lookups_refuse_a_pattern_no_problem_has(
    store: Store, page: int | None, lengths: str, why: str
) -> None:
    with pytest.raises(ValueError, match=why):
        store.best_for_shape(H200.name, 128, "fp16", False, DECODE, kv_page=page,
                             kv_lengths=lengths)  # fmt: skip
    with pytest.raises(ValueError, match=why):
        store.best_match(H200.name, 128, "fp16", False, DECODE, kv_page=page,
                         kv_lengths=lengths)  # fmt: skip
    with pytest.raises(ValueError, match=why):
        queries.candidate_set(store.engine, H200.name, 128, "fp16", False, kv_page=page,
                              kv_lengths=lengths)  # fmt: skip


def test_a_candidate_set_is_of_one_pattern_and_matches_with_it(store: Store) -> None:
    _full, mixed = _seed_both(store)
    group = store.candidate_set(H200.name, 128, "fp16", False, kv_page=16, kv_lengths="mixed")
    assert group.kv_lengths == "mixed"
    assert {c.problem_id for c in group.candidates} == {mixed}
    assert {c.kv_lengths for c in group.candidates} == {"mixed"}
    # match() without a pattern is the set's (fa2tune.ops.choice calls it so).
    found = group.match(H200.name, False, DECODE, kv_page=16)
    assert found is not None and found.result.kv_lengths == "mixed"
    assert group.match(H200.name, False, DECODE, kv_page=16, kv_lengths="full") is None
    plain = store.candidate_set(H200.name, 128, "fp16", False, kv_page=16)
    assert plain.kv_lengths == "full" and {c.kv_lengths for c in plain.candidates} == {"full"}


def test_pick_keeps_patterns_apart() -> None:
    def cand(pid: int, lengths: str) -> Candidate:
        return Candidate(pid, "h200", False, 1, 8192, 8, 32, 8, "", (-1.0, 1.0, pid),
                         kv_page=16, kv_lengths=lengths)  # fmt: skip

    cands = [cand(1, "full"), cand(2, "mixed")]
    sm = {"h200": 132}
    for lengths, index in (("full", 0), ("mixed", 1)):
        found = pick(cands, "H200", False, DECODE, sm, kv_page=16, kv_lengths=lengths)
        assert found is not None and found.index == index
    assert pick(cands[1:], "H200", False, DECODE, sm, kv_page=16) is None


def test_cache_winners_and_listings_carry_the_pattern(store: Store) -> None:
    full, mixed = _seed_both(store)
    winners = {r.problem_id: r for r in store.cache_winners(H200.name)}
    assert set(winners) == {full, mixed}
    assert winners[full].kv_lengths == "full" and winners[mixed].kv_lengths == "mixed"
    assert winners[mixed].config.name == _config(splits=32).name
    rows = store.results().items
    assert [r.kv_lengths for r in rows] == ["full"] * 2 + ["mixed"] * 2  # a problem's together
    assert [r.median_ms for r in rows] == [0.05, 0.07, 0.02, 0.04]  # fastest first in each
    assert all(r.to_dict().get("kv_lengths") == ("mixed" if r.kv_lengths == "mixed" else None)
               for r in rows)  # fmt: skip


# ---------------------------------------------------------------------------- results files


@pytest.fixture
def source() -> Iterator[Store]:
    """A store of its own (in-memory SQLite) that results files are written from."""
    with Store.from_url("sqlite://") as s:
        yield s


def test_results_files_carry_the_pattern_only_when_mixed(
    source: Store, store: Store, tmp_path: Path
) -> None:
    _seed_both(source)
    data = json.loads(to_json(export(source)))
    assert [p.get("kv_lengths") for p in data["problems"]] == [None, "mixed"]  # full first
    assert sorted(str(m["problem"].get("kv_lengths")) for m in data["measurements"]) == [
        "None", "None", "mixed", "mixed"
    ]  # fmt: skip
    path = tmp_path / "dump.json"
    dump(source, path)
    summary = ingest_file(store, path)
    assert (summary.added, summary.problems_added) == (4, 2)
    again = tmp_path / "again.json"
    dump(store, again)
    assert json.loads(again.read_text())["problems"] == data["problems"]
    assert json.loads(again.read_text())["measurements"] == data["measurements"]
    hit = store.best_for_shape(H200.name, 128, "fp16", False, DECODE, kv_page=16,
                               kv_lengths="mixed")  # fmt: skip
    assert hit is not None and hit.median_ms == 0.02 and hit.kv_lengths == "mixed"
    assert ingest_file(store, path).added == 0  # the same rows, found by their keys


@pytest.mark.parametrize("shipped", SHIPPED_CACHE, ids=lambda p: p.name)
def test_a_shipped_cache_file_redumps_byte_for_byte(shipped: Path) -> None:
    original = load_dump(shipped)
    with Store.from_url("sqlite://") as store:
        ingest_file(store, shipped)
        again = export(store)
    assert all("kv_lengths" not in p for p in json.loads(shipped.read_text())["problems"])
    # generator and created_at say who wrote the file and when: the rest is the data.
    again = again.model_copy(
        update={"generator": original.generator, "created_at": original.created_at}
    )
    assert to_json(again) + "\n" == shipped.read_text()


def _mixed_file(store: Store) -> dict[str, Any]:
    record_ok(store, _problem("mixed"), _config(splits=32), 0.02)
    data: dict[str, Any] = json.loads(to_json(export(store)))
    parse_dump(data)  # as written: valid
    return data


def _problems_of(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [data["problems"][0], data["measurements"][0]["problem"]]


def _count(store: Store, model: type[Any]) -> int:
    with session_scope(store.engine) as s:
        return int(s.scalar(select(func.count()).select_from(model)) or 0)


@pytest.mark.parametrize(("change", "why"), [
    ({"kv_lengths": "half"}, "kv_lengths must be one of"),
    ({"kv_lengths": "FULL"}, "kv_lengths must be one of"),
    ({"kv_lengths": 1}, "kv_lengths"),
    ({"kv_page": None}, "needs kv_page"),
])  # fmt: skip
def test_a_bad_pattern_is_a_clear_error_that_writes_nothing(
    source: Store, store: Store, change: dict[str, Any], why: str
) -> None:
    data = _mixed_file(source)
    for p in _problems_of(data):
        p.update(change)
    with pytest.raises(TransferError, match=why):
        ingest(store, data)
    assert (_count(store, ProblemRow), _count(store, Measurement)) == (0, 0)


def test_a_pattern_must_agree_with_the_figures_and_the_references(
    source: Store, store: Store
) -> None:
    data = _mixed_file(source)
    # The full problem's throughput for a mixed problem's median: the figures disagree.
    wrong = json.loads(json.dumps(data))
    wrong["measurements"][0]["tflops"] = _problem("full").tflops(0.02)
    with pytest.raises(TransferError, match="tflops"):
        ingest(store, wrong)
    # A measurement of the full problem that the file does not hold.
    dangling = json.loads(json.dumps(data))
    dangling["measurements"][0]["problem"].pop("kv_lengths")
    dangling["measurements"][0].pop("tflops")
    with pytest.raises(TransferError, match="problem not in problems"):
        ingest(store, dangling)
    assert _count(store, ProblemRow) == 0
    assert ingest(store, data).added == 1  # as written, it ingests


# -------------------------------------------------------------------------- migration 0007

_AT = "'2026-12-01 00:00:00'"


def _rows_of_0006(engine: Any, store: Store) -> tuple[int, int]:
    """A paged (P=16) decode problem and a dense one, each measured, written as 0006's schema
    holds them (no kv_lengths column yet). Returns their ids."""
    gpu = store.upsert_gpu(H200)
    ids = []
    with engine.begin() as conn:
        for page in (16, -1):
            conn.execute(text(
                "INSERT INTO problems (gpu_id, d, n, nk, batch, heads, kv_heads, dtype, causal, "
                "seqlens, window_left, window_right, chunk, softcap_on, softcap, sinks, "
                f"kv_page, created_at) VALUES (:g, 128, 1, 8192, 8, 32, 8, 'fp16', false, '', "
                f"-1, -1, 0, false, 0, false, :page, {_AT})"
            ), {"g": gpu, "page": page})  # fmt: skip
            ids.append(conn.execute(
                text("SELECT id FROM problems WHERE kv_page = :page"), {"page": page}
            ).scalar_one())  # fmt: skip
    for pid, config, ms in ((ids[0], _config(16), 0.05), (ids[1], _config(None), 0.03)):
        insert_build_and_measurement(engine, pid, config, ms)
    return ids[0], ids[1]


def _columns(engine: Any) -> set[str]:
    return {c["name"] for c in inspect(engine).get_columns("problems")}


def _table(engine: Any, query: str) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(query))]


def test_migration_0007_on_a_0006_database_with_rows(file_url: str) -> None:
    config = alembic_config(file_url)
    command.upgrade(config, "0006")
    engine = make_engine(file_url)
    try:
        assert "kv_lengths" not in _columns(engine)
        store = Store(engine)
        paged, dense = _rows_of_0006(engine, store)
        problems = "SELECT id, kv_page, n, nk, batch, created_at FROM problems ORDER BY id"
        measurements = "SELECT id, problem_id, build_id, median_ms FROM measurements ORDER BY id"
        before = (_table(engine, problems), _table(engine, measurements))
        command.upgrade(config, "0007")
        # Every row kept with its id (measurements still point at theirs), timed "full".
        assert (_table(engine, problems), _table(engine, measurements)) == before
        assert _table(engine, "SELECT DISTINCT kv_lengths FROM problems") == [("full",)]
        hit = store.best_for_shape(H200.name, 128, "fp16", False, DECODE, kv_page=16)
        assert hit is not None and hit.problem_id == paged and hit.median_ms == 0.05
        assert hit.kv_lengths == "full"
        flat = store.best_for_shape(H200.name, 128, "fp16", False, DECODE)
        assert flat is not None and flat.problem_id == dense
        # The new identity: the mixed problem of the same shape and layout is a row of its own.
        mixed = record_ok(store, _problem("mixed"), _config(16, splits=32), 0.02)
        assert mixed not in (paged, dense)
        again = store.best_for_shape(H200.name, 128, "fp16", False, DECODE, kv_page=16)
        assert again is not None and again.problem_id == paged
        # Down again: refused while a mixed problem is stored, then it keeps the rest.
        with pytest.raises(RuntimeError, match="mixed lengths"):
            command.downgrade(config, "0006")
        assert len(_table(engine, measurements)) == 3  # refused before touching anything
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM measurements WHERE problem_id = :p"), {"p": mixed})
            conn.execute(text("DELETE FROM problems WHERE kv_lengths != 'full'"))
        command.downgrade(config, "0006")
        assert "kv_lengths" not in _columns(engine)
        assert (_table(engine, problems), _table(engine, measurements)) == before
        command.upgrade(config, "head")
        assert (_table(engine, problems), _table(engine, measurements)) == before
    finally:
        engine.dispose()


# ------------------------------------------------------------------------------ fa2tune best

runner = CliRunner()
SHAPE = ["--nq", "1", "--nk", "8192", "--batch", "8", "--heads", "32", "--kv-heads", "8"]


@pytest.fixture
def cli_url(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A SQLite file holding :func:`_seed_both`'s rows, the CLI isolated from shipped files."""
    monkeypatch.setattr("core.settings._overrides", {})
    monkeypatch.setattr("db.shipped.shipped_files", lambda: [])
    with Store.from_url(sqlite_url) as store:
        _seed_both(store)
    return sqlite_url


def _best(url: str, *extra: str) -> tuple[int, str]:
    args = ["--db", url, "best", "--gpu", "H200", "--d", "128", *SHAPE, *extra]
    result = runner.invoke(app, args)
    return result.exit_code, result.output


def test_best_kv_lengths_mixed_answers_from_mixed_results(cli_url: str) -> None:
    code, out = _best(cli_url, "--kv-page", "16", "--kv-lengths", "mixed", "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["config_name"] == _config(splits=32).name and data["median_ms"] == 0.02
    assert data["kv_lengths"] == "mixed" and data["asked_kv_lengths"] == "mixed"
    assert data["kv_page"] == 16 and data["exact"]
    code, out = _best(cli_url, "--kv-page", "16", "--kv-lengths", "mixed")
    assert code == 0 and "KV lengths" in out and "lengths mixed over" in out


def test_best_full_answers_only_full_and_none_asks_as_the_op(cli_url: str) -> None:
    code, out = _best(cli_url, "--kv-page", "16", "--json", "--kv-lengths", "full")
    assert code == 0, out
    data = json.loads(out)
    assert data["config_name"] == _config(splits=8).name and data["median_ms"] == 0.05
    assert "kv_lengths" not in data and data["asked_kv_lengths"] == "full"
    # No pattern: both tuned at the shape, so the mixed one answers (what the op runs).
    code, out = _best(cli_url, "--kv-page", "16", "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["config_name"] == _config(splits=32).name and data["kv_lengths"] == "mixed"
    assert "asked_kv_lengths" not in data
    code, out = _best(cli_url, "--kv-page", "16", "--kv-lengths", "full")
    assert code == 0 and "KV lengths" not in out


def test_best_nothing_for_a_pattern_not_tuned(cli_url: str) -> None:
    code, out = _best(cli_url, "--kv-page", "0", "--kv-lengths", "mixed")
    assert code == 1 and "lengths mixed over" in out and "contiguous KV cache" in out


@pytest.mark.parametrize(("extra", "why"), [
    (["--kv-lengths", "mixed"], "--kv-page"),
    (["--kv-lengths", "full"], "--kv-page"),
    (["--kv-lengths", "half", "--kv-page", "16"], "kv_lengths must be one of"),
])  # fmt: skip
def test_best_bad_kv_lengths_are_one_clear_line(cli_url: str, extra: list[str], why: str) -> None:
    code, out = _best(cli_url, *extra)
    assert code == 2 and "--kv-lengths" in out and why in out and "Traceback" not in out
