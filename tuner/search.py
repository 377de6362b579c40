"""One study per problem: the trial attributes and statuses, opening and seeding studies.

The search is split by job: :mod:`tuner.space` (the search space over the families'
declared parameters), :mod:`tuner.samplers` (the sampler registry) and :mod:`tuner.storage`
(optuna's RDB storage, heartbeats, stale trials); this module holds what a campaign does with
a study and re-exports those modules' names, so ``tuner.search`` stays the one import of the
campaign and the tests.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Final

import optuna
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from core.family import AnyConfig
from core.problem import Problem
from core.records import MeasureStatus
from tuner.samplers import SamplerFactory, make_sampler, register_sampler, sampler_names
from tuner.space import (
    CONFIG_PARAM,
    FAMILY_PARAM,
    SearchSpace,
    added_param_defaults,
    family_param_names,
    params_of,
)
from tuner.storage import (
    ATTR_OWNER,
    DEFAULT_GRACE_S,
    DEFAULT_HEARTBEAT_S,
    fail_stale_trials,
    open_storage,
    owner_is_dead,
    resolve_storage_url,
    stale_trials,
    trial_owner,
)

log = logging.getLogger(__name__)

# Trial user attributes (all JSON-serialisable), read by the campaign and by anyone browsing
# the study with optuna-dashboard.
ATTR_CONFIG: Final = "config"  # config name; published before measuring (the claim)
ATTR_STATUS: Final = "status"  # MeasureStatus value, or INVALID / DUPLICATE
ATTR_ROLE: Final = "role"  # how the outcome was obtained, see TrialRole
ATTR_TFLOPS: Final = "tflops"
ATTR_REASON: Final = "reason"
ATTR_SEED: Final = "seed_config"
ATTR_SPILL_BYTES: Final = "spill_bytes"  # of an untimed SPILLS outcome
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


__all__ = [
    "ATTR_OWNER",
    "CONFIG_PARAM",
    "DEFAULT_GRACE_S",
    "DEFAULT_HEARTBEAT_S",
    "FAMILY_PARAM",
    "SamplerFactory",
    "SearchSpace",
    "added_param_defaults",
    "fail_stale_trials",
    "family_param_names",
    "make_sampler",
    "open_storage",
    "owner_is_dead",
    "params_of",
    "register_sampler",
    "resolve_storage_url",
    "sampler_names",
    "stale_trials",
    "trial_owner",
]
