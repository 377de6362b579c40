"""Optuna's storage of the studies: the RDB storage beside the results, heartbeats and stale
trials.

Studies live in optuna's RDB storage on the same database URL as the results. A heartbeat
marks a killed process's RUNNING trials as failed after ``grace_period`` seconds, and
:class:`~optuna.storages.RetryHeartbeatStaleTrialCallback` re-queues each such trial once
more, so a ``kill -9`` loses at most the trials that were in flight. The heartbeat only runs
under :meth:`optuna.study.Study.optimize`, which is why the campaign drives studies through it
rather than ask/tell.

Optuna's heartbeat alone leaves two kinds of stale trials RUNNING for good: one whose process
died before its first heartbeat (optuna creates the trial, and a multivariate sampler draws
its parameters, before the heartbeat thread starts; optuna never fails a trial without a
heartbeat), and one that nobody looks at again after its grace period (optuna checks a study
only while optimising it, so a resume that passes a problem within the grace period, as a
replay does, leaves it). :func:`fail_stale_trials` handles both: every trial records its
process (:func:`trial_owner`), so a campaign resumed on the same machine fails, and re-queues,
the trials of a dead process at once; a trial without heartbeat is failed once it is older
than the grace period; and the campaign runs the check when it opens each study.
"""

from __future__ import annotations

import copy
import datetime
import logging
import os
import re
import socket
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import optuna
from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import bindparam, event, inspect, text
from sqlalchemy.exc import IntegrityError, OperationalError

log = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_S: Final = 10
DEFAULT_GRACE_S: Final = 60
_CREATE_ATTEMPTS: Final = 5
ATTR_OWNER: Final = "owner"  # the trial user attribute naming its process, see trial_owner()

_OPTUNA_REVISION = re.compile(r"^v\d+\.\d+\.\d+\.[a-z]$")


def resolve_storage_url(db_url: str) -> str:
    """The optuna storage URL to use next to the results database at ``db_url``.

    Optuna's RDB storage stamps its schema revision in alembic's default ``alembic_version``
    table. The results schema keeps its own revision in ``fa2tune_alembic_version``, so the
    two share a database and this returns ``db_url`` (driver-normalised). It is a safety net
    for a database whose ``alembic_version`` holds someone else's revision, where optuna
    would refuse the "incompatible" schema: the studies then move aside, with a warning, for
    SQLite to a sibling file (``<name>.optuna.db``), for PostgreSQL to the schema
    ``<current schema>_optuna`` of the same database (created when missing).

    A driverless ``postgresql://`` URL is given psycopg 3's driver, as the results store does.

    Raises:
        RuntimeError: on a clash with another kind of database.
    """
    from db.session import make_engine, normalize_url  # the results store's rules

    url = normalize_url(db_url)
    same = url.render_as_string(hide_password=False)
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table("alembic_version"):
                return same
            rows = conn.execute(text("SELECT version_num FROM alembic_version")).scalars()
            revisions = [str(r) for r in rows]
            current = (
                conn.execute(text("SELECT current_schema()")).scalar()
                if url.get_backend_name() == "postgresql"
                else None
            )
            if all(_OPTUNA_REVISION.match(r) for r in revisions):
                return same
            if current is not None:
                schema = f"{current}_optuna"
                conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
                conn.commit()
    finally:
        engine.dispose()
    warning = (
        "the results database's alembic_version table belongs to its own migrations, so the "
        "optuna studies cannot share its schema; keeping them in %s"
    )
    if url.get_backend_name() == "postgresql":
        log.warning(warning, f"schema {schema}")
        moved = url.update_query_dict({"options": f"-csearch_path={schema}"})
        return moved.render_as_string(hide_password=False)
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        raise RuntimeError(
            "the results database's alembic_version table is not optuna's, so optuna's study "
            "storage cannot share it; give the results migrations their own version_table"
        )
    path = Path(url.database)
    sibling = path.with_name(f"{path.stem}.optuna{path.suffix or '.db'}")
    log.warning(warning, sibling)
    return url.set(database=str(sibling)).render_as_string(hide_password=False)


def open_storage(
    url: str,
    *,
    heartbeat_interval: int = DEFAULT_HEARTBEAT_S,
    grace_period: int = DEFAULT_GRACE_S,
    max_retry: int = 2,
) -> RDBStorage:
    """Optuna's RDB storage on ``url`` with heartbeats and a retry of stale trials.

    Args:
        url: SQLAlchemy URL, the same database the results go to.
        heartbeat_interval: seconds between heartbeats of a running trial.
        grace_period: seconds without a heartbeat after which a RUNNING trial is failed.
        max_retry: how many times a stale trial is re-queued (a config that kills its process
            every time must not be retried forever).
    """
    engine_kwargs: dict[str, object] = {}
    if url.startswith("sqlite"):
        # Several processes (one per GPU) write the same file: wait for the lock instead of
        # failing with "database is locked".
        engine_kwargs["connect_args"] = {"timeout": 60}
    for attempt in range(_CREATE_ATTEMPTS):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ExperimentalWarning)
                storage = RDBStorage(
                    url,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=heartbeat_interval,
                    grace_period=grace_period,
                    heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(
                        max_retry=max_retry
                    ),
                )
            break
        except (OperationalError, IntegrityError) as exc:
            # Processes started together on a new database race to create optuna's tables
            # ("table studies already exists"); the loser finds them there on a retry.
            if attempt == _CREATE_ATTEMPTS - 1:
                raise
            log.debug("creating optuna's tables raced another process (%s); retrying", exc)
            time.sleep(0.2 * (attempt + 1))
    if url.startswith("sqlite"):
        _tune_sqlite(storage)
    return storage


def _tune_sqlite(storage: RDBStorage) -> None:
    """Make optuna's SQLite connections safe for several processes, and fast enough.

    * Transactions start with ``BEGIN IMMEDIATE``, emitted by us with pysqlite's own
      transaction handling off. pysqlite otherwise runs a SELECT outside any transaction
      and opens one only at the first write, so optuna's read-check-write of a WAITING trial
      (``SELECT ... FOR UPDATE`` is a no-op on SQLite) lets two processes both pop the same
      queued trial and later fail with "Cannot tell a COMPLETE trial". Taking the write lock
      up front serialises those sections; the busy timeout queues the other process.
    * WAL and ``synchronous=NORMAL``: a trial is a dozen small commits, and with the default
      ``FULL`` each waits for an fsync. In WAL mode NORMAL stays consistent after a crash and
      only risks the last commits on power loss (the results store makes the same trade).
    """

    from db.session import setup_sqlite_connection

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # As the results store's connections, less foreign keys (optuna's schema is optuna's).
        setup_sqlite_connection(dbapi_connection, foreign_keys=False)

    def on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    event.listen(storage.engine, "connect", on_connect)
    event.listen(storage.engine, "begin", on_begin)
    storage.engine.dispose()  # reconnect through the listeners


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux), else None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def trial_owner(number: int) -> dict[str, object]:
    """The ``owner`` user attribute of trial ``number`` run by this process.

    It names the host, PID namespace, PID and process start time (so that a recycled PID
    is not taken for the owner) and the trial's number (a trial re-queued by the retry
    callback inherits the user attributes of the failed one, whose owner is not its own).
    """
    pid = os.getpid()
    return {
        "host": socket.gethostname(),
        "pidns": _pid_namespace(),
        "pid": pid,
        "start": _process_start(pid),
        "trial": number,
    }


def owner_is_dead(trial: FrozenTrial) -> bool:
    """True when the process that ran ``trial`` is known to have ended: it ran on this host,
    in this PID namespace, and no process with its PID and start time exists. False when
    alive, or when it cannot be told (another host or container, no owner recorded)."""
    owner = trial.user_attrs.get(ATTR_OWNER)
    if not isinstance(owner, dict) or owner.get("trial") != trial.number:
        return False
    pid = owner.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    if owner.get("host") != socket.gethostname() or owner.get("pidns") != _pid_namespace():
        return False
    start = _process_start(pid)
    if start is not None:  # a process with that PID: the owner if it started then
        return owner.get("start") is not None and owner.get("start") != start
    if Path("/proc/self/stat").exists():
        return True  # Linux, and no such process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError: alive, another user's
        return False
    return False


def _with_heartbeat(storage: RDBStorage, trial_ids: Sequence[int]) -> set[int]:
    """The trials among ``trial_ids`` that have recorded a heartbeat."""
    if not trial_ids:
        return set()
    query = text("SELECT trial_id FROM trial_heartbeats WHERE trial_id IN :ids").bindparams(
        bindparam("ids", expanding=True)
    )
    with storage.engine.connect() as conn:
        return {int(row) for row in conn.execute(query, {"ids": list(trial_ids)}).scalars()}


def _rdb_of(study: optuna.Study) -> RDBStorage | None:
    """The RDB storage under ``study`` (optuna wraps it in a cache), if it is one."""
    storage = study._storage
    backend = getattr(storage, "_backend", storage)  # optuna.storages._CachedStorage
    return backend if isinstance(backend, RDBStorage) else None


def stale_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The RUNNING trials of ``study`` that no live process is running.

    Stale are: a trial whose heartbeat is older than the storage's grace period (optuna's
    rule), a trial of a dead process of this machine (:func:`owner_is_dead`), and a trial
    that never sent a heartbeat and started more than a grace period ago. Empty when the
    storage has no heartbeat (then no process's liveness is known).
    """
    storage = _rdb_of(study)
    if storage is None or storage.heartbeat_interval is None:
        return []
    grace = storage.grace_period or 2 * storage.heartbeat_interval
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    if not running:
        return []
    by_heartbeat = set(storage._get_stale_trial_ids(study._study_id))
    beating = _with_heartbeat(storage, [t._trial_id for t in running])
    old = datetime.datetime.now() - datetime.timedelta(seconds=grace)
    return [
        t
        for t in running
        if t._trial_id in by_heartbeat
        or owner_is_dead(t)
        or (
            t._trial_id not in beating
            and t.datetime_start is not None
            and t.datetime_start.replace(tzinfo=None) < old
        )
    ]


def fail_stale_trials(study: optuna.Study) -> list[int]:
    """Fail the stale RUNNING trials of ``study`` (:func:`stale_trials`) and hand each to
    the storage's stale-trial callback (:func:`open_storage`'s re-queues it).

    Optuna's :func:`optuna.storages.fail_stale_trials`, which covers only trials with an old
    heartbeat, runs before every trial of ``optimize``; this runs where the campaign opens a
    study and while it waits for in-flight trials.

    Returns:
        The numbers of the trials this call failed (another process may fail some first).
    """
    storage = study._storage
    failed: list[int] = []
    for trial in stale_trials(study):
        try:
            if storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL):
                failed.append(trial._trial_id)
        except UpdateFinishedTrialError:
            pass  # finished meanwhile, or failed by another process
    rdb = _rdb_of(study)
    callback = rdb.get_heartbeat_stale_trial_callback() if rdb is not None else None
    numbers = []
    for trial_id in failed:
        frozen = copy.deepcopy(storage.get_trial(trial_id))
        numbers.append(frozen.number)
        if callback is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ExperimentalWarning)
                callback(study, frozen)
    if numbers:
        log.info("%s: failed stale trials %s of dead processes", study.study_name, numbers)
    return numbers
