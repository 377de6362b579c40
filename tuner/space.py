"""The search space: a group's valid configs as structured optuna parameters.

Search-space design
-------------------
A problem's candidates are the *valid* configs of its (D, dtype, causal) group
(:func:`codegen.families.fa2.space.enumerate_space`). They are exposed to optuna as five structured
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

Each family's parameters, their optuna names and encodings come from its config's
declarations (:mod:`core.config_common`) through its registry entry
(:attr:`codegen.families.Family.search_names`); nothing here knows a family by name.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import optuna
from optuna.distributions import CategoricalChoiceType
from optuna.samplers import GridSampler
from optuna.trial import Trial

from codegen.families import FAMILIES, family_of
from codegen.families import family as family_named
from core.family import AnyConfig

log = logging.getLogger(__name__)

FAMILY_PARAM: Final = "family"
CONFIG_PARAM: Final = "config"  # the grid sampler's one parameter over several families


def family_param_names() -> dict[str, tuple[str, ...]]:
    """Each registered family's optuna parameter names, in the order families are searched."""
    return {name: f.search_names for name, f in FAMILIES.items()}


def added_param_defaults() -> dict[str, CategoricalChoiceType]:
    """Parameters added after studies were stored, with the value every config had before. A
    resumed study whose stored choices lack one keeps searching the configs with that value
    (see :meth:`SearchSpace.with_choices`) rather than losing the family."""
    return {k: v for f in FAMILIES.values() for k, v in f.added_search_defaults.items()}


def params_of(config: AnyConfig) -> dict[str, CategoricalChoiceType]:
    """The optuna parameters that select ``config`` among its family's configs of its
    (D, dtype, causal) group (without the ``family`` parameter: see
    :meth:`SearchSpace.params_for`)."""
    return dict(family_of(config).search_params(config))


def _sorted_choices(
    family_name: str, name: str, values: set[CategoricalChoiceType]
) -> tuple[CategoricalChoiceType, ...]:
    order = family_named(family_name).choice_order(name)
    if order is not None:
        return tuple(v for v in order if v in values)
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
        names = family_param_names()
        families = [f for f in names if any(c.family == f for c in unique)]
        choices: dict[str, tuple[CategoricalChoiceType, ...]] = {}
        if len(families) > 1:
            choices[FAMILY_PARAM] = tuple(families)
        for family in families:
            members = [c for c in unique if c.family == family]
            for name in names[family]:
                choices[name] = _sorted_choices(family, name, {params_of(c)[name] for c in members})
        return cls(configs=unique, choices=choices, _by_params=_index(unique))

    @property
    def families(self) -> tuple[str, ...]:
        """The families with configs in this space, in search order."""
        return tuple(f for f in FAMILIES if any(c.family == f for c in self.configs))

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
        parameter of :func:`added_param_defaults` missing from ``choices`` (a study stored
        before it existed) is fixed at its default.
        """
        added = added_param_defaults()
        fixed = {
            name: tuple(choices[name]) if name in choices else (added[name],)
            for name in self.param_names
            if name in choices or name in added
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
            getattr(config, "family", None) in FAMILIES
            and self.lookup(self.params_for(config)) == config  # type: ignore[arg-type]
        )

    @property
    def product_size(self) -> int:
        """Number of combinations of the choices, valid or not (summed over families)."""
        total = 0
        for family in self.families:
            size = 1
            for name in family_named(family).search_names:
                size *= len(self.choices.get(name, ()))
            total += size
        return total

    def lookup(self, params: Mapping[str, object]) -> AnyConfig | None:
        """The valid config with these parameters, or ``None`` for an invalid combination."""
        default = self.families[0] if self.families else None
        family = params.get(FAMILY_PARAM, default)
        names = family_param_names().get(str(family))
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
        for name in FAMILIES[str(family)].search_names:
            params[name] = trial.suggest_categorical(name, self.choices[name])
        return self.lookup(params)

    def grid(self) -> dict[str, list[CategoricalChoiceType]]:
        """The search space for :class:`~optuna.samplers.GridSampler`."""
        if FAMILY_PARAM in self.choices:
            return {CONFIG_PARAM: [c.name for c in self.configs]}
        return {name: list(values) for name, values in self.choices.items()}


def _index(configs: Iterable[AnyConfig]) -> dict[tuple[object, ...], AnyConfig]:
    out: dict[tuple[object, ...], AnyConfig] = {}
    for c in configs:
        params = params_of(c)
        out[(c.family, *(params[n] for n in family_of(c).search_names))] = c
    return out
