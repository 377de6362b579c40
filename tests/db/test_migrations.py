"""Schema migrations and engine set-up."""

from __future__ import annotations

import gzip
import logging
from importlib import resources
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, inspect, text

from db.models import Base
from db.session import VERSION_TABLE, alembic_config, init_db, make_engine, session_scope
from db.store import Store
from tests.support.factories import seed_measurement

TABLES = {"gpus", "builds", "problems", "measurements", "ingested_files", VERSION_TABLE}
SHIPPED_0001 = Path(__file__).parent / "data" / "migrations" / "shipped_0001.sqlite.gz"
HEAD = ScriptDirectory.from_config(alembic_config()).get_current_head()


def _context(conn: Connection) -> MigrationContext:
    return MigrationContext.configure(
        conn, opts={"version_table": VERSION_TABLE, "compare_type": True}
    )


def _version(url: str) -> str | None:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return _context(conn).get_current_revision()
    finally:
        engine.dispose()


def test_init_db_creates_the_schema_matching_the_models(
    db_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # nothing may depend on the working directory
    engine = make_engine(db_url)
    try:
        assert not set(inspect(engine).get_table_names()) & TABLES
        init_db(engine)
        init_db(engine)  # at head: a no-op
        assert set(inspect(engine).get_table_names()) >= TABLES
        indexes = {ix["name"] for ix in inspect(engine).get_indexes("measurements")}
        assert "ix_measurements_best" in indexes
        with engine.connect() as conn:
            assert _context(conn).get_current_revision() == HEAD
            # The migration and the models describe the same schema.
            diff = compare_metadata(_context(conn), Base.metadata)
        assert diff == []
        # ... and the store works on it.
        seed_measurement(Store(engine))
        assert Store(engine).best("H200", 128, 4096) is not None
    finally:
        engine.dispose()


def test_downgrade_and_upgrade_with_the_alembic_api(sqlite_url: str) -> None:
    config = alembic_config(sqlite_url)
    command.upgrade(config, "head")
    assert _version(sqlite_url) == HEAD
    command.downgrade(config, "base")
    engine = make_engine(sqlite_url)
    assert set(inspect(engine).get_table_names()) == {VERSION_TABLE}
    engine.dispose()
    command.upgrade(config, "head")
    assert _version(sqlite_url) == HEAD


def test_shipped_alembic_ini_works_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'via-ini.db'}"
    monkeypatch.chdir(tmp_path)
    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    try:
        with resources.as_file(resources.files("db") / "alembic.ini") as ini:
            config = Config(str(ini))
            config.set_main_option("sqlalchemy.url", url)
            command.upgrade(config, "head")  # configures logging from the ini, like the CLI
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]
    assert _version(url) == HEAD


def test_migration_environment_falls_back_to_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'from-settings.db'}"
    monkeypatch.setattr("core.settings._overrides", {"db_url": url})
    command.upgrade(alembic_config(), "head")
    assert _version(url) == HEAD


def test_results_schema_leaves_alembic_version_to_optuna(sqlite_url: str) -> None:
    """Optuna stamps alembic_version; the results schema must not claim it."""
    store = Store.from_url(sqlite_url)
    try:
        assert not inspect(store.engine).has_table("alembic_version")
    finally:
        store.close()


def test_sqlite_file_engine_settings(tmp_path: Path) -> None:
    path = tmp_path / "does" / "not" / "exist" / "yet.db"
    engine = make_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one() >= 10_000
        assert path.parent.is_dir()
    finally:
        engine.dispose()


def test_sqlite_savepoints_and_rollback(sqlite_url: str) -> None:
    """pysqlite's own transaction handling is off, so SAVEPOINT and ROLLBACK really work."""
    engine = make_engine(sqlite_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (x INTEGER)"))
        with session_scope(engine, write=True) as s:
            s.execute(text("INSERT INTO t VALUES (1)"))
            nested = s.begin_nested()
            s.execute(text("INSERT INTO t VALUES (2)"))
            nested.rollback()
        with pytest.raises(RuntimeError), session_scope(engine) as s:
            s.execute(text("INSERT INTO t VALUES (3)"))
            raise RuntimeError("abort")
        with engine.connect() as conn:
            assert [r[0] for r in conn.execute(text("SELECT x FROM t"))] == [1]
    finally:
        engine.dispose()


def test_memory_database_is_shared_across_sessions_and_threads() -> None:
    import threading

    store = Store.from_url("sqlite://")
    seed_measurement(store)
    found: list[bool] = []
    thread = threading.Thread(
        target=lambda: found.append(store.best("H200", 128, 4096) is not None)
    )
    thread.start()
    thread.join()
    assert found == [True]


def test_plain_postgresql_url_means_psycopg() -> None:
    engine = make_engine("postgresql://user@localhost/db")
    assert engine.dialect.driver == "psycopg"
    engine.dispose()


def test_legacy_alembic_version_stamp_is_adopted(tmp_path: Path) -> None:
    """Early development databases stamped alembic_version; they must not be re-created."""
    path = tmp_path / "legacy.db"
    path.write_bytes(gzip.decompress(SHIPPED_0001.read_bytes()))  # a 0001 database with data
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f"ALTER TABLE {VERSION_TABLE} RENAME TO alembic_version"))
    init_db(engine)
    tables = set(inspect(engine).get_table_names())
    assert VERSION_TABLE in tables and "alembic_version" not in tables
    engine.dispose()
    assert _version(url) == HEAD  # adopted as 0001, then upgraded
    store = Store.from_url(url)
    assert store.best("H200", 128, 4096) is not None  # data kept
    store.close()


def test_optuna_alembic_version_is_left_alone(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)"))
        conn.execute(text("INSERT INTO alembic_version VALUES ('v3.2.0.a')"))
    init_db(engine)
    with engine.connect() as conn:
        optuna = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    assert optuna == ["v3.2.0.a"]
    assert _version(sqlite_url) == HEAD
    engine.dispose()
