"""Engines, sessions and schema migrations.

SQLite is the default store and is written by several processes at once (one tuner worker per
GPU plus the service), so every SQLite connection gets WAL mode, a busy timeout and foreign
keys. pysqlite's own transaction handling is switched off and ``BEGIN`` is emitted by us: that
gives real SAVEPOINTs, transactional DDL, and lets a writer ask for ``BEGIN IMMEDIATE`` so it
takes the write lock up front instead of failing with "database is locked" when it upgrades a
read snapshot that another writer has moved past.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import URL, Connection, Engine, create_engine, event, inspect, make_url, text
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.orm import Session
from sqlalchemy.pool import ConnectionPoolEntry, StaticPool

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

logger = logging.getLogger(__name__)


class DatabaseOpenError(Exception):
    """The database named by a URL cannot be opened (before any connection is tried)."""


class DatabaseURLError(DatabaseOpenError):
    """The URL cannot be parsed, names an unknown database, or needs a Python driver that is
    not installed. The message is one line meant for the person who typed the URL."""


_SUPPORTED = "use sqlite:///PATH or postgresql://USER@HOST/DB"
# What to install for a driver module SQLAlchemy failed to import, where the distribution's
# name is not the module's. psycopg is fa2tune's own PostgreSQL driver, so its extra is named.
_DRIVER_PACKAGES = {
    "psycopg": "'fa2tune[postgres]'",
    "psycopg2": "psycopg2-binary",
    "MySQLdb": "mysqlclient",
    "mysql": "mysql-connector-python",
    "cx_Oracle": "cx-Oracle",
    "pysqlcipher3": "sqlcipher3-binary",
    "sqlcipher3": "sqlcipher3-binary",
}


MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 60_000
_WAL_RETRY_S = 0.05
_BEGIN_OPTION = "fa2tune_sqlite_begin"
# Not alembic's default "alembic_version": optuna's RDB storage stamps its own schema there,
# and the tuner keeps its studies in the results database.
VERSION_TABLE = "fa2tune_alembic_version"
# pg_advisory_xact_lock keys: arbitrary constants, unique to fa2tune.
PG_MIGRATE_LOCK = 0x0FA27E_0001
PG_INGEST_LOCK = 0x0FA27E_0002


def _is_memory_sqlite(url: URL) -> bool:
    database = url.database or ""
    return (
        database in ("", ":memory:")
        or "mode=memory" in database
        or (url.query.get("mode") == "memory")
    )


def sqlite_file(url: URL) -> Path | None:
    """The database file of a plain SQLite URL, or None for memory and ``file:`` URIs."""
    if _is_memory_sqlite(url):
        return None
    database = url.database or ""
    if database.startswith("file:") or url.query.get("uri") == "true":
        return None
    return Path(database).expanduser()


def setup_sqlite_connection(dbapi_connection: Any, *, foreign_keys: bool = True) -> None:
    """Prepare a new pysqlite connection for several writing processes.

    pysqlite's own transaction handling is switched off (the caller's "begin" hook emits
    ``BEGIN``), then: a busy timeout, WAL mode, ``synchronous = NORMAL`` and, unless
    ``foreign_keys`` is False, foreign key enforcement.
    """
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        _enable_wal(cursor)
        cursor.execute("PRAGMA synchronous = NORMAL")
        if foreign_keys:
            cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


def _enable_wal(cursor: Any) -> None:
    """Switch the file to WAL mode (persistent: later connections find it set and skip this).

    Two processes opening a fresh file at once both try the switch, and SQLite answers the
    loser "database is locked" at once instead of waiting on the busy timeout; so retry.
    """
    (mode,) = cursor.execute("PRAGMA journal_mode").fetchone()
    if str(mode).lower() == "wal":
        return
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            if time.monotonic() >= deadline:
                raise
            time.sleep(_WAL_RETRY_S)


def _install_sqlite_events(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: ConnectionPoolEntry) -> None:
        setup_sqlite_connection(dbapi_connection)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get(_BEGIN_OPTION, "")
        conn.exec_driver_sql(f"BEGIN {mode}".strip())


def _unparsable(exc: Exception) -> DatabaseURLError:
    if isinstance(exc, ValueError) and "int()" in str(exc):
        # SQLAlchemy's parser accepts any port text and then calls int() on it.
        why = f"the port {str(exc).rpartition(':')[2].strip()} is not a number"
    else:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        why = lines[0] if lines else type(exc).__name__
    return DatabaseURLError(f"not a database URL ({why}; {_SUPPORTED})")


def normalize_url(url: str | URL) -> URL:
    """``url`` parsed, with psycopg 3's driver for a driverless ``postgresql://``.

    Raises:
        DatabaseURLError: ``url`` is not a URL SQLAlchemy can parse.
    """
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:  # ValueError: a port that is not a number
        raise _unparsable(exc) from exc
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def make_engine(url: str | URL, **kwargs: Any) -> Engine:
    """Create an engine for ``url``.

    SQLite file URLs get their parent directory created, WAL mode, a busy timeout and
    foreign keys; in-memory SQLite uses one shared connection (so every session sees the same
    database, from any thread). ``postgresql://`` without a driver is taken to mean psycopg 3
    (the driver fa2tune depends on); other URLs are passed to SQLAlchemy as given.

    Args:
        url: SQLAlchemy database URL.
        **kwargs: extra :func:`sqlalchemy.create_engine` arguments.

    Returns:
        The engine.

    Raises:
        DatabaseURLError: ``url`` cannot be parsed, names a database SQLAlchemy does not know,
            needs a driver that is not installed or an asyncio driver.
        DatabaseOpenError: the directory of a SQLite file cannot be created.
    """
    parsed = normalize_url(url)
    # Errors name the scheme as typed (postgresql://, not the psycopg driver filled in).
    scheme = url.drivername if isinstance(url, URL) else url.partition("://")[0]
    if parsed.get_backend_name() == "sqlite":
        if _is_memory_sqlite(parsed):
            kwargs.setdefault("poolclass", StaticPool)
            kwargs.setdefault("connect_args", {"check_same_thread": False})
        else:
            path = sqlite_file(parsed)
            if path is not None:
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    why = exc.strerror or str(exc)
                    if isinstance(exc, FileExistsError):  # exist_ok=True: a file is in the way
                        why = f"{exc.filename} is not a directory"
                    raise DatabaseOpenError(
                        f"cannot create the database's directory {path.parent}: {why}"
                    ) from exc
        engine = _create_engine(parsed, scheme, **kwargs)
        _install_sqlite_events(engine)
        return engine
    if parsed.get_backend_name() == "postgresql":
        kwargs.setdefault("pool_pre_ping", True)
    return _create_engine(parsed, scheme, **kwargs)


def _create_engine(url: URL, scheme: str, **kwargs: Any) -> Engine:
    """:func:`sqlalchemy.create_engine`, with one-line errors for a URL it cannot serve.

    SQLAlchemy imports the dialect and its driver here, before any connection, so an unknown
    scheme or a missing driver surfaces now, as a plugin error or a bare ImportError.
    """
    try:
        dialect = url.get_dialect()  # the dialect class only; its driver is imported below
    except NoSuchModuleError as exc:
        raise DatabaseURLError(f"unknown database URL scheme {scheme!r} ({_SUPPORTED})") from exc
    if dialect.is_async:
        # Everything in fa2tune is synchronous; an asyncio driver would fail on first use.
        raise DatabaseURLError(
            f"{scheme}:// names an asyncio driver, which fa2tune cannot use ({_SUPPORTED})"
        )
    try:
        return create_engine(url, **kwargs)
    except NoSuchModuleError as exc:  # a plugin named in the URL's query
        raise DatabaseURLError(f"{exc} (in the database URL)") from exc
    except ArgumentError as exc:  # e.g. sqlite://x: parsed, but not a form the dialect takes
        raise _unparsable(exc) from exc
    except ImportError as exc:
        module = (exc.name or "").partition(".")[0]
        if isinstance(exc, ModuleNotFoundError) and module:
            package = _DRIVER_PACKAGES.get(module, module)
            message = (
                f"the {scheme}:// URL scheme needs the Python module {module}, which is not "
                f"installed (pip install {package})"
            )
        else:  # installed but broken, e.g. psycopg without its libpq
            text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
            message = f"the driver of the {scheme}:// URL scheme cannot be imported: {text}"
        if url.get_backend_name() not in ("sqlite", "postgresql"):
            message += "; fa2tune works with SQLite and PostgreSQL"
        raise DatabaseURLError(message) from exc


def _writer(engine: Engine) -> Engine:
    """``engine`` with SQLite's ``BEGIN IMMEDIATE`` (a no-op option on other databases)."""
    if engine.dialect.name == "sqlite":
        return engine.execution_options(**{_BEGIN_OPTION: "IMMEDIATE"})
    return engine


@contextmanager
def session_scope(engine: Engine, *, write: bool = False) -> Iterator[Session]:
    """A session that commits when the block succeeds and rolls back when it raises.

    Args:
        engine: the engine to bind.
        write: the block writes; on SQLite the transaction then starts with
            ``BEGIN IMMEDIATE`` so concurrent writers queue on the busy timeout instead of
            failing half-way.

    Yields:
        The session; objects stay usable after commit (``expire_on_commit=False``).
    """
    session = Session(bind=_writer(engine) if write else engine, expire_on_commit=False)
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def alembic_config(url: str | None = None) -> Config:
    """An alembic configuration for the shipped migrations, independent of the cwd.

    Args:
        url: database URL for alembic commands that open their own connection; when omitted
            the migration environment falls back to the fa2tune settings.
    """
    from alembic.config import Config  # alembic is slow to import; most commands never need it

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        # ConfigParser interpolation treats % specially (URL-escaped passwords).
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


@contextmanager
def _quiet(name: str) -> Iterator[None]:
    """Raise logger ``name`` to WARNING for the block."""
    log = logging.getLogger(name)
    level = log.level
    log.setLevel(max(log.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        log.setLevel(level)


def _adopt_legacy_stamp(conn: Connection, script: ScriptDirectory) -> None:
    """Move our revision from ``alembic_version`` (used by early development databases)
    into :data:`VERSION_TABLE`, leaving optuna's revisions where they are."""
    from alembic.migration import MigrationContext

    tables = inspect(conn)
    if tables.has_table(VERSION_TABLE) or not tables.has_table("alembic_version"):
        return
    known = {rev.revision for rev in script.walk_revisions()}
    stamped = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    ours = [rev for rev in stamped if rev in known]
    if not ours:
        return
    context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
    context.stamp(script, ours[0])  # one linear history: there is at most one of ours
    conn.execute(text("DELETE FROM alembic_version WHERE version_num = :rev"), {"rev": ours[0]})
    if len(stamped) == 1:
        conn.execute(text("DROP TABLE alembic_version"))
    logger.info("moved schema revision %s from alembic_version to %s", ours[0], VERSION_TABLE)


def init_db(engine: Engine) -> None:
    """Bring the schema to the latest migration (creating it on an empty database).

    Safe to call from several processes at once: on SQLite the migration runs under
    ``BEGIN IMMEDIATE``, on PostgreSQL under an advisory lock, so the second caller finds the
    schema already at head.
    """
    # The common case, a database already at head, needs no lock and logs nothing (alembic
    # chats at INFO level about plugins and contexts; the CLI runs at INFO).
    with _quiet("alembic"):
        from alembic import command
        from alembic.migration import MigrationContext
        from alembic.script import ScriptDirectory

        config = alembic_config()
        script = ScriptDirectory.from_config(config)
        head = script.get_current_head()
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            if context.get_current_revision() == head:
                return
    with _writer(engine).begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_MIGRATE_LOCK})
        _adopt_legacy_stamp(conn, script)
        config.attributes["connection"] = conn
        command.upgrade(config, "head")
    logger.info(
        "database schema migrated to %s: %s", head, engine.url.render_as_string(hide_password=True)
    )
