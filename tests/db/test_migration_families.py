"""Migration 0002 (kernel families) on a real 0001 database: the shipped H200 results.

``tests/db/data/migrations/shipped_0001.sqlite.gz`` was written by fa2tune before kernel families
existed (schema 0001, the shipped ``db/data/h200_results.json`` ingested), and
``best_0001.json`` holds what ``/v1/best`` answered from it then, for every shipped problem at
its own N and at an untuned N (nearest-N answers). After the upgrade every row is still there,
every build's parameters moved into ``params`` unchanged, and ``/v1/best`` answers the same.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from fastapi.testclient import TestClient
from sqlalchemy import MetaData, create_engine, insert, select, text

from db.session import VERSION_TABLE, alembic_config, init_db, make_engine
from db.store import Store
from service.main import create_app

DATA = Path(__file__).parent / "data" / "migrations"
FA2_COLUMNS = ("br", "bc", "warps", "stages", "pad", "swizzle")
TABLES = ("gpus", "builds", "problems", "measurements", "ingested_files")
#: Migration 0004's columns as SQLite holds them on a row of plain attention.
PLAIN_COLUMNS = {
    "window_left": -1, "window_right": -1, "chunk": 0, "softcap_on": 0, "softcap": 0.0,
    "sinks": 0,
}  # fmt: skip


@pytest.fixture
def db_0001(tmp_path: Path) -> Path:
    path = tmp_path / "shipped_0001.sqlite"
    path.write_bytes(gzip.decompress((DATA / "shipped_0001.sqlite.gz").read_bytes()))
    return path


def _rows(path: Path, table: str) -> list[dict[str, Any]]:
    with sqlite3.connect(path) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute(f"SELECT * FROM {table} ORDER BY 1")]


def _old_params(row: dict[str, Any]) -> dict[str, Any]:
    return {c: bool(row[c]) if c == "swizzle" else row[c] for c in FA2_COLUMNS}


def _answers(store: Store) -> Iterator[tuple[dict[str, Any], int, dict[str, Any]]]:
    expected = json.loads((DATA / "best_0001.json").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # starlette's httpx notice
        client = TestClient(create_app(store))
    with client:
        for case in expected:
            response = client.get("/v1/best", params=case["query"])
            yield case, response.status_code, response.json()


def _assert_same_answers(store: Store) -> None:
    answered = 0
    for case, status, body in _answers(store):
        assert status == case["status"], case["query"]
        before = case["body"]
        # Everything answered before is answered the same; the config gained its family.
        assert {k: body[k] for k in before} == before | {"config": body["config"]}, case["query"]
        assert {k: body["config"][k] for k in before["config"]} == before["config"]
        assert body["config"]["family"] == "fa2"
        assert body["config"]["params"] == {c: before["config"][c] for c in FA2_COLUMNS}
        answered += 1
    assert answered == 96  # 48 shipped problems, each at its N and at an untuned N


def test_upgrade_keeps_every_row_and_moves_parameters_into_params(db_0001: Path) -> None:
    before = {t: _rows(db_0001, t) for t in TABLES}
    assert len(before["measurements"]) == 1517 and len(before["builds"]) == 2344
    engine = make_engine(f"sqlite:///{db_0001}")
    init_db(engine)  # 0001 -> head
    engine.dispose()
    after = {t: _rows(db_0001, t) for t in TABLES}
    for table in ("measurements", "ingested_files"):
        assert after[table] == before[table], table
    # 0005 adds gpus.l2_bytes, 0 (not read) on every row that was there.
    assert [{k: v for k, v in g.items() if k != "l2_bytes"} for g in after["gpus"]] == before[
        "gpus"
    ]
    assert {g["l2_bytes"] for g in after["gpus"]} == {0}
    # 0003 adds problems.seqlens, "" (dense) on every row that was there; 0004 the variant
    # columns, plain on every row; 0006 kv_page, -1 (not a KV-cache problem) on every row;
    # 0007 kv_lengths, "full" on every row (and the rows keep their ids, so measurements still
    # point).
    added = {"seqlens": "", **PLAIN_COLUMNS, "kv_page": -1, "kv_lengths": "full"}
    assert [{k: v for k, v in p.items() if k not in added} for p in after["problems"]] == before[
        "problems"
    ]
    assert all({k: p[k] for k in added} == added for p in after["problems"])
    assert len(after["builds"]) == len(before["builds"])
    for old, new in zip(before["builds"], after["builds"], strict=True):
        assert json.loads(new["params"]) == _old_params(old)
        assert new["family"] == "fa2"
        untouched = {k: v for k, v in old.items() if k not in FA2_COLUMNS}
        assert {k: new[k] for k in untouched} == untouched
        assert not set(FA2_COLUMNS) & set(new)


def test_upgrade_rekeys_gpu_names_under_the_shared_rule(db_0001: Path) -> None:
    with sqlite3.connect(db_0001) as conn:
        conn.execute(
            "INSERT INTO gpus (name, name_key, compute_capability, sm_count, driver_version,"
            " cuda_version, memory_bytes, smem_optin_bytes, created_at, updated_at) VALUES"
            " ('NVIDIA-A100_SXM4', 'nvidia-a100_sxm4', '8.0', 108, '580', '13.0', 0, 0,"
            " '2026-11-30 00:00:00', '2026-11-30 00:00:00')"
        )
    engine = make_engine(f"sqlite:///{db_0001}")
    init_db(engine)
    engine.dispose()
    keys = {r["name"]: r["name_key"] for r in _rows(db_0001, "gpus")}
    assert keys == {"NVIDIA H200": "h200", "NVIDIA-A100_SXM4": "a100 sxm4"}


def test_upgraded_shipped_results_answer_as_before(db_0001: Path) -> None:
    with Store.from_url(f"sqlite:///{db_0001}") as store:  # migrates on open
        _assert_same_answers(store)


def test_a_dump_of_the_upgraded_file_ingests_and_answers_as_before(
    db_0001: Path, sqlite_url: str, tmp_path: Path
) -> None:
    """The upgraded 0001 file, dumped in today's format and ingested by today's code into a
    fresh database, answers the recorded queries as the 0001 file did."""
    from db.transfer import dump, ingest_file

    with Store.from_url(f"sqlite:///{db_0001}") as old:
        dump(old, tmp_path / "results.json")
    with Store.from_url(sqlite_url) as store:
        ingest_file(store, tmp_path / "results.json")
        _assert_same_answers(store)


def test_downgrade_restores_the_columns(db_0001: Path) -> None:
    before = _rows(db_0001, "builds")
    config = alembic_config(f"sqlite:///{db_0001}")
    command.upgrade(config, "head")
    command.downgrade(config, "0001")
    assert _rows(db_0001, "builds") == before
    assert len(_rows(db_0001, "measurements")) == 1517


def test_downgrade_refuses_builds_of_other_families(db_0001: Path) -> None:
    config = alembic_config(f"sqlite:///{db_0001}")
    command.upgrade(config, "head")
    with sqlite3.connect(db_0001) as conn:
        conn.execute("UPDATE builds SET family = 'fa3' WHERE id = 1")
    with pytest.raises(RuntimeError, match="1 build"):
        command.downgrade(config, "0001")
    assert len(_rows(db_0001, "measurements")) == 1517  # refused before touching anything


@pytest.mark.postgres
def test_upgrade_on_postgresql(db_0001: Path, postgres_url: str) -> None:
    """The same upgrade on PostgreSQL (real ALTERs there), from the shipped rows."""
    config = alembic_config(postgres_url)
    command.upgrade(config, "0001")
    source = create_engine(f"sqlite:///{db_0001}")
    target = make_engine(postgres_url)
    old, new = MetaData(), MetaData()
    old.reflect(source)
    new.reflect(target)
    with source.connect() as src, target.begin() as dst:
        for table in TABLES:
            rows = [dict(r._mapping) for r in src.execute(select(old.tables[table]))]
            if rows:
                dst.execute(insert(new.tables[table]), rows)
        for table in ("gpus", "builds", "problems", "measurements"):  # ids were given
            dst.execute(
                text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                     f"(SELECT max(id) FROM {table}))")
            )  # fmt: skip
    source.dispose()
    init_db(target)
    with target.connect() as conn:
        params = conn.execute(text("SELECT params FROM builds ORDER BY id")).scalars().all()
        version = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar_one()
    target.dispose()
    assert version == ScriptDirectory.from_config(config).get_current_head()
    assert params == [_old_params(r) for r in _rows(db_0001, "builds")]
    with Store.from_url(postgres_url) as store:
        _assert_same_answers(store)
