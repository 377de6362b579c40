"""tuner.search: the structured space, samplers, storage, seeding."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import optuna
import pytest
from optuna.samplers import GridSampler, RandomSampler, TPESampler
from optuna.trial import TrialState

from codegen.families.fa2.space import enumerate_space, seed_configs
from core.fa2_config import Fa2Config
from core.problem import Problem
from db.store import Store
from tuner import search

optuna.logging.set_verbosity(optuna.logging.WARNING)
pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")


@pytest.fixture(scope="module")
def space() -> search.SearchSpace:
    return search.SearchSpace.from_configs(enumerate_space(128, "fp16", False))


def test_space_choices_come_from_valid_configs(space: search.SearchSpace) -> None:
    assert tuple(space.choices) == ("br", "bc", "rows_per_warp", "stages", "layout")
    assert space.choices["layout"] == ("pad0", "pad8", "pad16", "swz")
    assert space.choices["rows_per_warp"] == (16, 32)
    assert len(space) == len(enumerate_space(128, "fp16", False))
    # The product holds invalid combinations, but far fewer than half.
    assert len(space) < space.product_size < 2 * len(space)


def test_lookup_round_trips_and_rejects_invalid(space: search.SearchSpace) -> None:
    for config in space.configs:
        assert space.lookup(search.params_of(config)) == config
        assert config in space
    # 256 rows with 16 rows per warp needs 16 warps: not in the space.
    bad = {"br": 256, "bc": 64, "rows_per_warp": 16, "stages": 1, "layout": "pad8"}
    assert space.lookup(bad) is None
    assert space.lookup({"br": 1}) is None
    other = Fa2Config(64, "fp16", False, 128, 64, 4, 1, pad=8)
    assert other not in space


def test_space_rejects_empty_and_mixed_groups() -> None:
    with pytest.raises(ValueError, match="empty"):
        search.SearchSpace.from_configs([])
    mixed = [
        Fa2Config(64, "fp16", False, 128, 64, 4, 1, pad=8),
        Fa2Config(128, "fp16", False, 128, 64, 4, 1, pad=8),
    ]
    with pytest.raises(ValueError, match="one"):
        search.SearchSpace.from_configs(mixed)


def test_with_choices_drops_unreachable_configs(space: search.SearchSpace) -> None:
    stored = {k: list(v) for k, v in space.choices.items()}
    stored["stages"] = [1, 2]
    narrowed = space.with_choices(stored)
    assert narrowed.choices["stages"] == (1, 2)
    assert {c.stages for c in narrowed.configs} == {1, 2}
    assert len(narrowed) < len(space)


def test_suggest_maps_trials_to_configs(space: search.SearchSpace) -> None:
    study = optuna.create_study(sampler=RandomSampler(seed=3))
    seen_invalid = seen_valid = 0
    for _ in range(60):
        trial = study.ask()
        config = space.suggest(trial)
        if config is None:
            seen_invalid += 1
        else:
            seen_valid += 1
            assert config in space
            assert search.params_of(config) == trial.params
        study.tell(trial, 1.0)
    assert seen_valid and seen_invalid


def test_sampler_registry(space: search.SearchSpace) -> None:
    assert search.sampler_names()[0] == "tpe"
    assert set(search.sampler_names()) >= {"tpe", "random", "grid"}
    assert isinstance(search.make_sampler("tpe", space, 1), TPESampler)
    assert isinstance(search.make_sampler("random", space, 1), RandomSampler)
    grid = search.make_sampler("grid", space, 1)
    assert isinstance(grid, GridSampler)
    with pytest.raises(ValueError, match="unknown sampler 'annealing'"):
        search.make_sampler("annealing", space)


def test_grid_is_exhaustive_over_valid_configs() -> None:
    configs = [c for c in enumerate_space(64, "fp16", False) if c.br == 64 and c.stages <= 2]
    space = search.SearchSpace.from_configs(configs)
    study = optuna.create_study(sampler=search.make_sampler("grid", space, 0))
    found: list[Fa2Config] = []

    def objective(trial: optuna.Trial) -> float:
        config = space.suggest(trial)
        if config is None:
            raise optuna.TrialPruned()
        found.append(config)
        return 1.0

    study.optimize(objective)  # the grid sampler stops the study when exhausted
    assert sorted(found) == sorted(space.configs)
    assert len(study.trials) == space.product_size


def _storage(tmp_path: Path, **kwargs: int) -> optuna.storages.RDBStorage:
    return search.open_storage(f"sqlite:///{tmp_path / 'studies.db'}", **kwargs)


def test_seeds_are_enqueued_once(tmp_path: Path) -> None:
    problem = Problem(gpu="Test GPU", d=64, n=1024)
    space = search.SearchSpace.from_configs(enumerate_space(64, "fp16", False))
    seeds = seed_configs(64, "fp16", False)
    assert seeds
    storage = _storage(tmp_path)
    study = search.open_study(problem, storage, search.make_sampler("tpe", space, 0))
    assert study.study_name == problem.study_name
    assert search.enqueue_seeds(study, space, seeds) == len(seeds)
    # Again (a resumed campaign), and again after the seeds ran: nothing new.
    assert search.enqueue_seeds(study, space, seeds) == 0
    for _ in seeds:
        trial = study.ask()
        assert space.suggest(trial) in seeds
        study.tell(trial, 1.0)
    again = search.open_study(problem, storage, search.make_sampler("tpe", space, 0))
    assert search.enqueue_seeds(again, space, seeds) == 0
    assert sum(bool(t.user_attrs.get(search.ATTR_SEED)) for t in again.trials) == len(seeds)
    assert not again.get_trials(states=(TrialState.WAITING,))


def test_seeds_outside_the_space_are_skipped(tmp_path: Path) -> None:
    problem = Problem(gpu="Test GPU", d=64, n=1024)
    configs = [c for c in enumerate_space(64, "fp16", False) if c.stages == 3]
    space = search.SearchSpace.from_configs(configs)
    study = search.open_study(problem, _storage(tmp_path), search.make_sampler("tpe", space))
    assert search.enqueue_seeds(study, space, seed_configs(64, "fp16", False)) == 0


def test_bind_space_keeps_the_studys_choices(tmp_path: Path) -> None:
    problem = Problem(gpu="Test GPU", d=64, n=1024)
    narrow = search.SearchSpace.from_configs(
        [c for c in enumerate_space(64, "fp16", False) if c.stages <= 2]
    )
    wide = search.SearchSpace.from_configs(enumerate_space(64, "fp16", False))
    storage = _storage(tmp_path)
    study = search.open_study(problem, storage, search.make_sampler("tpe", narrow))
    assert search.bind_space(study, narrow) is narrow
    # Later the space grew (stages 3 and 4): the study keeps its distributions.
    again = search.open_study(problem, storage, search.make_sampler("tpe", wide))
    bound = search.bind_space(again, wide)
    assert bound.choices == narrow.choices
    assert sorted(bound.configs) == sorted(narrow.configs)


def test_stale_running_trial_is_failed_and_requeued(tmp_path: Path) -> None:
    storage = _storage(tmp_path, heartbeat_interval=1, grace_period=1)
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask({"x": optuna.distributions.CategoricalDistribution([1, 2])})
    trial.set_user_attr(search.ATTR_CONFIG, "c")
    storage.record_heartbeat(trial._trial_id)  # what the heartbeat thread of a process does
    time.sleep(2.5)  # ...then the process is killed: no more heartbeats
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optuna.storages.fail_stale_trials(study)
    states = [t.state for t in study.trials]
    assert states == [TrialState.FAIL, TrialState.WAITING]
    retry = study.trials[1]
    assert retry.params == trial.params
    assert retry.user_attrs[search.ATTR_CONFIG] == "c"


def test_resolve_storage_url(tmp_path: Path) -> None:
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert search.resolve_storage_url(fresh) == fresh
    only_optuna = f"sqlite:///{tmp_path / 'optuna.db'}"
    search.open_storage(only_optuna)
    assert search.resolve_storage_url(only_optuna) == only_optuna
    # The results schema keeps its revision in its own table: studies share the database.
    results = f"sqlite:///{tmp_path / 'results.db'}"
    Store.from_url(results).close()
    assert search.resolve_storage_url(results) == results
    storage = search.open_storage(results)
    optuna.create_study(storage=storage, study_name="ok")
    storage.engine.dispose()
    Store.from_url(results).close()  # and the results schema is still at head


def test_resolve_storage_url_moves_studies_aside_on_a_clash(tmp_path: Path) -> None:
    import sqlite3

    clash = tmp_path / "clash.db"
    with sqlite3.connect(clash) as conn:  # someone else's alembic stamp in alembic_version
        conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        conn.execute("INSERT INTO alembic_version VALUES ('0001')")
    resolved = search.resolve_storage_url(f"sqlite:///{clash}")
    assert resolved == f"sqlite:///{tmp_path / 'clash.optuna.db'}"
    optuna.create_study(storage=search.open_storage(resolved), study_name="ok")


def test_trial_helpers() -> None:
    trial = optuna.trial.create_trial(
        state=TrialState.PRUNED,
        user_attrs={search.ATTR_CONFIG: "fa2_x", search.ATTR_STATUS: "SPILLS"},
    )
    assert search.trial_config(trial) == "fa2_x"
    assert search.trial_status(trial) == "SPILLS"
    bare = optuna.trial.create_trial(state=TrialState.FAIL)
    assert search.trial_config(bare) is None and search.trial_status(bare) is None
    assert "OK" in search.GPU_STATUSES and "SPILLS" in search.BUILD_STATUSES


@pytest.mark.postgres
def test_resolve_storage_url_on_postgres(postgres_url: str) -> None:
    from sqlalchemy import make_url, text

    from db.session import make_engine

    Store.from_url(postgres_url).close()
    resolved = search.resolve_storage_url(postgres_url)
    schema = make_url(postgres_url).query["options"].split("=", 1)[1]  # type: ignore[union-attr]
    try:
        assert resolved == postgres_url  # the results' revision is in its own table
        storage = search.open_storage(resolved)
        study = optuna.create_study(storage=storage, study_name="pg")
        study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
        storage.engine.dispose()
        Store.from_url(postgres_url).close()  # the results schema is untouched, at head
        assert search.resolve_storage_url(postgres_url) == resolved  # stable on a re-run
    finally:
        engine = make_engine(postgres_url)
        with engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}_optuna" CASCADE'))
        engine.dispose()
