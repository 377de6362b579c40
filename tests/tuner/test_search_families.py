"""One study over two kernel families: the search space, seeds and samplers (CPU only)."""

from __future__ import annotations

import optuna
import pytest

from codegen.families.fa2.space import enumerate_space
from codegen.families.fa3 import space as fa3_space
from core.fa3_config import Fa3Config
from tuner import search

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

#: The optuna names stored studies hold (they must not change).
FA2_NAMES = ("br", "bc", "rows_per_warp", "stages", "layout")
FA3_NAMES = (
    "fa3_block_m", "fa3_block_n", "fa3_stages", "fa3_pv", "fa3_overlap", "fa3_pingpong",
    "fa3_regs", "fa3_order",
)  # fmt: skip


@pytest.fixture(scope="module")
def space() -> search.SearchSpace:
    fa2 = enumerate_space(128, "fp16", True)
    fa3 = fa3_space.enumerate_space(128, "fp16", True)
    return search.SearchSpace.from_configs([*fa2, *fa3])


def test_two_families_get_a_family_parameter_and_their_own_names(
    space: search.SearchSpace,
) -> None:
    assert space.families == ("fa2", "fa3")
    assert space.choices[search.FAMILY_PARAM] == ("fa2", "fa3")
    assert set(space.param_names) == {
        search.FAMILY_PARAM, *FA2_NAMES, *FA3_NAMES
    }  # fmt: skip
    assert space.choices["fa3_block_m"] == (64, 128, 192)


def test_every_config_round_trips_through_its_parameters(space: search.SearchSpace) -> None:
    for config in space.configs:
        params = space.params_for(config)
        assert params[search.FAMILY_PARAM] == config.family
        assert space.lookup(params) == config and config in space


def test_invalid_fa3_combination_is_rejected(space: search.SearchSpace) -> None:
    bad = Fa3Config(128, "fp16", True, block_m=192, pingpong=True, consumer_regs=160)
    assert bad not in space
    assert space.lookup(space.params_for(bad)) is None


def test_one_family_keeps_the_old_parameters() -> None:
    only = search.SearchSpace.from_configs(fa3_space.enumerate_space(64, "bf16", False))
    assert search.FAMILY_PARAM not in only.choices
    assert only.param_names == FA3_NAMES
    config = only.configs[0]
    assert only.lookup(only.params_for(config)) == config


@pytest.mark.parametrize("sampler", ["tpe", "random", "grid"])
def test_samplers_propose_configs_of_both_families(space: search.SearchSpace, sampler: str) -> None:
    study = optuna.create_study(sampler=search.make_sampler(sampler, space, seed=3))
    search.enqueue_seeds(study, space, fa3_space.seed_configs(128, "fp16", True))
    seen: set[str] = set()
    for _ in range(60):
        trial = study.ask()
        config = space.suggest(trial)
        if config is None:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        seen.add(config.family)
        study.tell(trial, 1.0 if config.family == "fa3" else 2.0)
    assert seen == {"fa2", "fa3"}


def test_grid_over_two_families_enumerates_config_names(space: search.SearchSpace) -> None:
    grid = space.grid()
    assert list(grid) == [search.CONFIG_PARAM]
    assert sorted(grid[search.CONFIG_PARAM]) == sorted(c.name for c in space.configs)
