"""The sampler registry: a fresh optuna sampler per study, by name (``tpe``, ``random``,
``grid``); :func:`register_sampler` adds more."""

from __future__ import annotations

import warnings
from collections.abc import Callable

from optuna.exceptions import ExperimentalWarning
from optuna.samplers import BaseSampler, GridSampler, RandomSampler, TPESampler

from tuner.space import SearchSpace

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
