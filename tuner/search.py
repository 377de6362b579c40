"""The optuna side of tuning: search space, samplers, storage and one study per problem.

Search-space design
-------------------
A problem's candidates are the *valid* configs of its (D, dtype, causal) group
(:func:`codegen.space.enumerate_space`). They are exposed to optuna as five structured
categorical parameters, ``br``, ``bc``, ``rows_per_warp``, ``stages`` and ``layout``
(``pad0``, ``pad8``, ``pad16`` or ``swz``), each with the values that occur among the valid
configs; ``warps`` is ``br // rows_per_warp``.

* ``rows_per_warp`` rather than ``warps``: the space keeps 16 or 32 query rows per warp, so
  only half of the (br, warps) pairs are valid, against three quarters of the (br,
  rows_per_warp) pairs (fewer wasted proposals), and rows per warp is what drives the
  accumulator registers and so spills, which TPE can then learn directly.
* Structured parameters rather than one categorical over config names: TPE models each
  parameter (and, multivariate, their joint density), so "``br=128`` is good" generalises to
  configs never tried; over one categorical of names every config would be an unrelated
  category and TPE could not do better than random in a 30-trial budget.
* Fixed choice lists rather than conditional parameters: optuna refuses a categorical whose
  choices change between trials ("does not support dynamic value space"), so drawing ``bc``
  only among the values valid for the drawn ``br`` would need a differently *named* parameter
  per branch, which splits TPE's history into branches too thin to learn from.
* The price is that the Cartesian product of the choices holds invalid combinations. A
  proposal that is not a valid config is answered at once (:meth:`SearchSpace.suggest`
  returns ``None``): the trial is pruned with status ``INVALID`` and never reaches the build
  or the GPU. TPE ranks such pruned trials with the bad ("above") group, so it learns to
  avoid the invalid corners; the campaign does not count them against the trial budget.
* ``grid`` is optuna's :class:`~optuna.samplers.GridSampler` over the same product: the
  invalid points are pruned for free, so it is exhaustive over exactly the valid configs.

Several kernel families
------------------------
On a GPU where more than one family runs (the Hopper family beside the portable one on an
sm_90 GPU), one study covers the union: a categorical ``family`` parameter is drawn first,
then that family's own parameters (the portable family's five above, the Hopper family's
``fa3_*`` ones), so each family's parameters have their own names and TPE (multivariate,
``group=True``) learns each family from its own trials. With one family the space has no
``family`` parameter and is exactly the one above. ``grid`` over several families enumerates
one categorical ``config`` of all valid config names instead: the product of both families'
choices would be millions of points.

The choice lists are stored in the study (user attribute ``fa2tune.choices``) when it is
created and reused on resume, so a later change of the space code cannot make optuna reject
the study's existing distributions; configs outside the stored choices are then unreachable
and a warning says so.

Storage
-------
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import optuna
from optuna.distributions import CategoricalChoiceType
from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.samplers import BaseSampler, GridSampler, RandomSampler, TPESampler
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, Trial, TrialState
from sqlalchemy import bindparam, event, inspect, text
from sqlalchemy.exc import IntegrityError, OperationalError

from core.config import Fa2Config
from core.fa3_config import Fa3Config
from core.family import AnyConfig
from core.problem import Problem
from core.records import MeasureStatus
from core.splitkv_config import SplitKvConfig

log = logging.getLogger(__name__)

PARAM_NAMES: Final[tuple[str, ...]] = ("br", "bc", "rows_per_warp", "stages", "layout")
FA3_PARAM_NAMES: Final[tuple[str, ...]] = (
    "fa3_block_m", "fa3_block_n", "fa3_stages", "fa3_pv", "fa3_overlap", "fa3_pingpong",
    "fa3_regs", "fa3_order",
)  # fmt: skip
#: Parameters added after studies were stored, with the value every config had before. A
#: resumed study whose stored choices lack one keeps searching the configs with that value
#: (see :meth:`SearchSpace.with_choices`) rather than losing the family.
ADDED_PARAM_DEFAULTS: Final[dict[str, CategoricalChoiceType]] = {"fa3_order": "per_head"}
SPLITKV_PARAM_NAMES: Final[tuple[str, ...]] = (
    "skv_rows", "skv_block_n", "skv_warps", "skv_stages", "skv_splits",
)  # fmt: skip
#: Each family's optuna parameter names, in the order families are searched.
FAMILY_PARAM_NAMES: Final[dict[str, tuple[str, ...]]] = {
    "fa2": PARAM_NAMES,
    "fa3": FA3_PARAM_NAMES,
    "splitkv": SPLITKV_PARAM_NAMES,
}
FAMILY_PARAM: Final = "family"
CONFIG_PARAM: Final = "config"  # the grid sampler's one parameter over several families
LAYOUTS: Final[tuple[str, ...]] = ("pad0", "pad8", "pad16", "swz")

# Trial user attributes (all JSON-serialisable), read by the campaign and by anyone browsing
# the study with optuna-dashboard.
ATTR_CONFIG: Final = "config"  # config name; published before measuring (the claim)
ATTR_STATUS: Final = "status"  # MeasureStatus value, or INVALID / DUPLICATE
ATTR_ROLE: Final = "role"  # how the outcome was obtained, see TrialRole
ATTR_TFLOPS: Final = "tflops"
ATTR_REASON: Final = "reason"
ATTR_SEED: Final = "seed_config"
ATTR_SPILL_BYTES: Final = "spill_bytes"  # of an untimed SPILLS outcome
ATTR_OWNER: Final = "owner"  # the process running the trial, see trial_owner()
STUDY_ATTR_CHOICES: Final = "fa2tune.choices"
STUDY_ATTR_SEEDED: Final = "fa2tune.seeded"

# Statuses that are not MeasureStatus values: outcomes of the search itself.
STATUS_INVALID: Final = "INVALID"  # the sampler's combination is not a valid config
STATUS_DUPLICATE: Final = "DUPLICATE"  # another trial is measuring the same config right now


class TrialRole:
    """Values of the ``role`` user attribute."""

    MEASURED: Final = "measured"  # built and measured (or rejected by its build) by this trial
    STORED: Final = "stored"  # the store already held a measurement; taken from there
    REUSED: Final = "reused"  # an earlier trial of the study had this config; value copied
    INVALID: Final = "invalid"
    DUPLICATE: Final = "duplicate"
    ABANDONED: Final = "abandoned"  # the budget was used up while this trial was sampled


#: Statuses produced by running a kernel on the GPU: these count against ``--trials``.
GPU_STATUSES: Final[frozenset[str]] = frozenset(
    {
        MeasureStatus.OK,
        MeasureStatus.WRONG_RESULT,
        MeasureStatus.RUNTIME_FAILED,
        MeasureStatus.TIMEOUT,
    }
)

#: Statuses decided before the GPU (by the build): recorded, never timed, free of budget.
BUILD_STATUSES: Final[frozenset[str]] = frozenset(
    {MeasureStatus.COMPILE_FAILED, MeasureStatus.SMEM_OVERFLOW, MeasureStatus.SPILLS}
)

DEFAULT_SEED: Final = 0
DEFAULT_HEARTBEAT_S: Final = 10
DEFAULT_GRACE_S: Final = 60
_CREATE_ATTEMPTS: Final = 5


def layout_of(config: Fa2Config) -> str:
    """The ``layout`` parameter value of ``config`` (``swz`` or ``pad<N>``)."""
    return "swz" if config.swizzle else f"pad{config.pad}"


def params_of(config: AnyConfig) -> dict[str, CategoricalChoiceType]:
    """The optuna parameters that select ``config`` among its family's configs of its
    (D, dtype, causal) group (without the ``family`` parameter: see
    :meth:`SearchSpace.params_for`)."""
    if isinstance(config, Fa3Config):
        return {
            "fa3_block_m": config.block_m,
            "fa3_block_n": config.block_n,
            "fa3_stages": config.stages,
            "fa3_pv": "rs" if config.pv_regs else "ss",
            "fa3_overlap": config.overlap,
            "fa3_pingpong": config.pingpong,
            "fa3_regs": config.consumer_regs,
            "fa3_order": "longest_first" if config.longest_first else "per_head",
        }
    if isinstance(config, SplitKvConfig):
        return {f"skv_{k}": v for k, v in config.params().items()}
    return {
        "br": config.br,
        "bc": config.bc,
        "rows_per_warp": config.rows_per_warp,
        "stages": config.stages,
        "layout": layout_of(config),
    }


def _sorted_choices(
    name: str, values: set[CategoricalChoiceType]
) -> tuple[CategoricalChoiceType, ...]:
    if name == "layout":
        return tuple(v for v in LAYOUTS if v in values)
    return tuple(sorted(values, key=lambda v: (str(type(v)), v)))


@dataclass(frozen=True)
class SearchSpace:
    """The valid configs of one (D, dtype, causal) group as structured optuna parameters.

    Attributes:
        configs: the valid configs, in the order given.
        choices: per parameter, the sorted values occurring among ``configs`` (or the choices
            stored in an existing study, see :meth:`with_choices`); with several families
            also ``family``.
    """

    configs: tuple[AnyConfig, ...]
    choices: Mapping[str, tuple[CategoricalChoiceType, ...]]
    _by_params: Mapping[tuple[object, ...], AnyConfig] = field(repr=False, compare=False)

    @classmethod
    def from_configs(cls, configs: Iterable[AnyConfig]) -> SearchSpace:
        """Build the space of ``configs``, which must share D, dtype and causal.

        Raises:
            ValueError: when ``configs`` is empty or mixes groups.
        """
        unique = tuple(dict.fromkeys(configs))
        if not unique:
            raise ValueError("empty search space: no valid config for this problem")
        groups = {(c.d, c.dtype, c.causal) for c in unique}
        if len(groups) != 1:
            raise ValueError(f"a search space covers one (d, dtype, causal) group, got {groups}")
        families = [f for f in FAMILY_PARAM_NAMES if any(c.family == f for c in unique)]
        choices: dict[str, tuple[CategoricalChoiceType, ...]] = {}
        if len(families) > 1:
            choices[FAMILY_PARAM] = tuple(families)
        for family in families:
            members = [c for c in unique if c.family == family]
            for name in FAMILY_PARAM_NAMES[family]:
                choices[name] = _sorted_choices(name, {params_of(c)[name] for c in members})
        return cls(configs=unique, choices=choices, _by_params=_index(unique))

    @property
    def families(self) -> tuple[str, ...]:
        """The families with configs in this space, in search order."""
        return tuple(f for f in FAMILY_PARAM_NAMES if any(c.family == f for c in self.configs))

    @property
    def param_names(self) -> tuple[str, ...]:
        """Every parameter of the space (``family`` first when there are several)."""
        return tuple(self.choices)

    def params_for(self, config: AnyConfig) -> dict[str, CategoricalChoiceType]:
        """The parameters that select ``config`` in this space (what to enqueue)."""
        family = {FAMILY_PARAM: config.family} if FAMILY_PARAM in self.choices else {}
        return {**family, **params_of(config)}

    def enqueue_params(self, config: AnyConfig, study: optuna.Study) -> dict[str, Any]:
        """The parameters to enqueue ``config`` with on ``study`` (by name under a grid over
        several families, whose only parameter is ``config``)."""
        if FAMILY_PARAM in self.choices and isinstance(study.sampler, GridSampler):
            return {CONFIG_PARAM: config.name}
        return self.params_for(config)

    def with_choices(self, choices: Mapping[str, Sequence[CategoricalChoiceType]]) -> SearchSpace:
        """The same configs under previously stored choice lists (for resuming a study).

        Configs whose parameters fall outside ``choices`` are dropped, with a warning. A
        parameter of :data:`ADDED_PARAM_DEFAULTS` missing from ``choices`` (a study stored
        before it existed) is fixed at its default.
        """
        fixed = {
            name: tuple(choices[name]) if name in choices else (ADDED_PARAM_DEFAULTS[name],)
            for name in self.param_names
            if name in choices or name in ADDED_PARAM_DEFAULTS
        }
        kept = tuple(
            c
            for c in self.configs
            if all(n in fixed and v in fixed[n] for n, v in self.params_for(c).items())
        )
        if len(kept) < len(self.configs):
            log.warning(
                "%d valid configs fall outside the choices stored in the study and cannot be "
                "proposed (the space changed since the study was created)",
                len(self.configs) - len(kept),
            )
        return SearchSpace(configs=kept, choices=fixed, _by_params=_index(kept))

    def __len__(self) -> int:
        return len(self.configs)

    def __contains__(self, config: object) -> bool:
        return (
            isinstance(config, Fa2Config | Fa3Config | SplitKvConfig)
            and self.lookup(self.params_for(config)) == config
        )

    @property
    def product_size(self) -> int:
        """Number of combinations of the choices, valid or not (summed over families)."""
        total = 0
        for family in self.families:
            size = 1
            for name in FAMILY_PARAM_NAMES[family]:
                size *= len(self.choices.get(name, ()))
            total += size
        return total

    def lookup(self, params: Mapping[str, object]) -> AnyConfig | None:
        """The valid config with these parameters, or ``None`` for an invalid combination."""
        family = params.get(FAMILY_PARAM, self.families[0] if self.families else "fa2")
        names = FAMILY_PARAM_NAMES.get(str(family))
        if names is None or any(n not in params for n in names):
            return None
        return self._by_params.get((family, *(params[n] for n in names)))

    def suggest(self, trial: Trial) -> AnyConfig | None:
        """Draw the parameters on ``trial``; ``None`` when they make no valid config.

        With several families: the family, then its parameters; under the grid sampler, the
        one ``config`` parameter (see the module docstring).
        """
        if FAMILY_PARAM in self.choices and isinstance(trial.study.sampler, GridSampler):
            name = trial.suggest_categorical(CONFIG_PARAM, [c.name for c in self.configs])
            return next((c for c in self.configs if c.name == name), None)
        family = (
            trial.suggest_categorical(FAMILY_PARAM, self.choices[FAMILY_PARAM])
            if FAMILY_PARAM in self.choices
            else self.families[0]
        )
        params: dict[str, object] = {FAMILY_PARAM: family}
        for name in FAMILY_PARAM_NAMES[str(family)]:
            params[name] = trial.suggest_categorical(name, self.choices[name])
        return self.lookup(params)

    def grid(self) -> dict[str, list[CategoricalChoiceType]]:
        """The search space for :class:`~optuna.samplers.GridSampler`."""
        if FAMILY_PARAM in self.choices:
            return {CONFIG_PARAM: [c.name for c in self.configs]}
        return {name: list(values) for name, values in self.choices.items()}


def _index(configs: Iterable[AnyConfig]) -> dict[tuple[object, ...], AnyConfig]:
    return {
        (c.family, *(params_of(c)[n] for n in FAMILY_PARAM_NAMES[c.family])): c for c in configs
    }


# --------------------------------------------------------------------------------------------
# Samplers


SamplerFactory = Callable[[SearchSpace, int | None], BaseSampler]
_SAMPLERS: dict[str, SamplerFactory] = {}


def register_sampler(name: str) -> Callable[[SamplerFactory], SamplerFactory]:
    """Register a sampler factory ``(space, seed) -> BaseSampler`` under ``name``."""

    def deco(factory: SamplerFactory) -> SamplerFactory:
        _SAMPLERS[name] = factory
        return factory

    return deco


def sampler_names() -> tuple[str, ...]:
    """Names accepted by :func:`make_sampler`, default first."""
    return tuple(_SAMPLERS)


def make_sampler(name: str, space: SearchSpace, seed: int | None = None) -> BaseSampler:
    """A fresh sampler for one study.

    Args:
        name: a registered sampler name (``tpe``, ``random``, ``grid``).
        space: the study's search space (the grid sampler enumerates it).
        seed: random seed; ``None`` for a nondeterministic one.

    Raises:
        ValueError: for an unknown name.
    """
    try:
        factory = _SAMPLERS[name]
    except KeyError:
        raise ValueError(
            f"unknown sampler {name!r}; choose one of {', '.join(sampler_names())}"
        ) from None
    return factory(space, seed)


@register_sampler("tpe")
def _tpe(space: SearchSpace, seed: int | None) -> BaseSampler:
    # multivariate: tile shape, warps and stages interact (rows per warp, smem per stage), and
    # the joint density captures that where independent TPE cannot. constant_liar: in the
    # distributed mode a RUNNING trial counts as bad, so a second process is steered away
    # from the config the first is measuring. Few startup trials: the seed configs already
    # give TPE a spread of good starting points, and budgets are ~30 trials.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        return TPESampler(
            seed=seed,
            multivariate=True,
            constant_liar=True,
            n_startup_trials=min(8, max(2, len(space) // 4)),
            # Several families are a conditional space (each family's own parameters).
            group=len(space.families) > 1,
        )


@register_sampler("random")
def _random(space: SearchSpace, seed: int | None) -> BaseSampler:
    return RandomSampler(seed=seed)


@register_sampler("grid")
def _grid(space: SearchSpace, seed: int | None) -> BaseSampler:
    # The grid over the product of the choices; invalid points are pruned without a build.
    return GridSampler(space.grid(), seed=seed)


# --------------------------------------------------------------------------------------------
# Storage and studies


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


def open_study(
    problem: Problem, storage: optuna.storages.BaseStorage, sampler: BaseSampler
) -> optuna.Study:
    """Create or load the study of ``problem`` (named :attr:`Problem.study_name`)."""
    return optuna.create_study(
        study_name=problem.study_name,
        storage=storage,
        sampler=sampler,
        direction="minimize",
        load_if_exists=True,
    )


def bind_space(study: optuna.Study, space: SearchSpace) -> SearchSpace:
    """Store the space's choices in a new study, or adopt those stored in an existing one."""
    stored = study.user_attrs.get(STUDY_ATTR_CHOICES)
    if stored is None:
        study.set_user_attr(STUDY_ATTR_CHOICES, {k: list(v) for k, v in space.choices.items()})
        return space
    if all(tuple(stored.get(n, ())) == tuple(space.choices[n]) for n in space.param_names):
        return space
    return space.with_choices(stored)


def enqueue_seeds(study: optuna.Study, space: SearchSpace, seeds: Iterable[AnyConfig]) -> int:
    """Queue the seed configs as the study's first trials, once per study.

    A study attribute marks the study as seeded, so a resumed campaign never queues them
    again; ``skip_if_exists`` also covers a seed that was already tried. Two processes seeding
    a new study at the same instant may both queue a seed: the campaign's claim check then
    turns the second into a reuse of the first's outcome, not a second measurement.

    Returns:
        How many trials were queued.
    """
    if study.user_attrs.get(STUDY_ATTR_SEEDED):
        return 0
    queued = 0
    for config in seeds:
        if config not in space:
            log.debug("seed %s is not in the search space; skipped", config.name)
            continue
        before = len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
        study.enqueue_trial(
            space.enqueue_params(config, study), user_attrs={ATTR_SEED: True}, skip_if_exists=True
        )
        after = len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
        queued += after - before
    study.set_user_attr(STUDY_ATTR_SEEDED, True)
    return queued


def trial_config(trial: FrozenTrial) -> str | None:
    """The config name a trial claimed, if any."""
    value = trial.user_attrs.get(ATTR_CONFIG)
    return value if isinstance(value, str) else None


def trial_status(trial: FrozenTrial) -> str | None:
    """The status a trial recorded, if any."""
    value = trial.user_attrs.get(ATTR_STATUS)
    return value if isinstance(value, str) else None
