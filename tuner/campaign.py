"""The engine of ``fa2tune tune``: search every problem's study, building ahead of the GPU.

One campaign is a list of :class:`~tuner.problem.Problem`\\ s and one
:class:`CampaignOptions` value (sampler, budget, spill limit, seed ...). Each problem gets an
optuna study (:mod:`tuner.search`) whose trials are answered by
:class:`tuner.problem_run.ProblemRun`: an invalid proposal is pruned, a config another trial
or an earlier run already evaluated is reused, anything else is built, verified and timed by
``measure_fn`` and recorded in the store; only an OK measurement has a value, so a failure can
never become the best. This module runs the problems in order, shares the time budget
between them and keeps the builds ahead of the GPU; it returns a
:class:`~tuner.summary.CampaignSummary`.

Budget
    ``trials`` counts, per problem, the distinct configs the study has *run on the GPU*
    (statuses OK, WRONG_RESULT, RUNTIME_FAILED, TIMEOUT), whichever process or run measured
    them. Invalid proposals, reuses, duplicates and build rejections (COMPILE_FAILED,
    SMEM_OVERFLOW, untimed SPILLS) are recorded but free. ``time_budget_s`` covers the whole
    campaign: each problem gets the remaining time divided by the problems left, so time a
    problem does not use flows to the next; time still left at the end goes back, split the
    same way, to the problems whose share ran out before their ``trials``. With neither, every
    valid config is evaluated (what ``grid`` is for). A problem also ends when all its valid
    configs are evaluated.

Building ahead
    Builds do not depend on N, so one build per config serves every problem of its
    (D, dtype, causal) group. Before the first trial, all valid configs of the campaign's
    groups are queued, in problem order and seeds first, on a
    :class:`~tuner.build_ahead.BuildAhead`, which compiles them in batches on a background
    thread while the GPU measures; a proposed config still queued is compiled at once.

Sharing a study
    Several processes (one per GPU) may run the same campaign on one database; a config is
    still measured once per problem (the tie-break is in :mod:`tuner.problem_run`).

Resume
    Studies live in the database, so re-running the same command continues them: the
    samplers see all earlier trials, the budget counts them, and the store's measured pairs
    are never measured again. A ``kill -9`` loses at most the trials in flight; their
    RUNNING rows are failed and re-queued (see :func:`search.fail_stale_trials`) when the
    resumed campaign opens their study: at once for a dead process of this machine, else
    once their heartbeat (or, without one, their start) is older than the grace period.

This module never measures on its own (``measure_fn`` does), never reads the environment and
never writes SQL (the :class:`~db.store.Store` does).
"""

from __future__ import annotations

import logging
import random
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import zip_longest
from typing import Final

import optuna

from codegen.families import Family, families_for, family_of
from core.build_report import BuildReport
from core.family import AnyConfig, cache_twins
from core.problem import Problem
from core.records import GpuInfo
from db.store import Store
from tuner import search
from tuner.build_ahead import BuildAhead, BuildFn
from tuner.problem_run import CampaignContext, MeasureFn, ProblemRun, SearchSkip
from tuner.summary import (
    CampaignObserver,
    CampaignSummary,
    NullObserver,
    ProblemSummary,
    TimeSplit,
)
from tuner.warm_start import WarmStart, with_warm_start

log = logging.getLogger(__name__)

#: The valid configs of a problem's group (``codegen.families.fa2.space.enumerate_space``).
SpaceFn = Callable[[Problem], Sequence[AnyConfig]]
#: The configs every new study starts with (``codegen.families.fa2.space.seed_configs``).
SeedFn = Callable[[Problem], Sequence[AnyConfig]]

#: Seconds of unused budget below which no cut-short problem is continued.
_MIN_EXTRA_S: Final = 1.0
#: Spill bytes per thread up to which a build is still timed. Small spills are not failures:
#: on the H200 the causal D=128 128x64 4-warp configs spill 4-108 B (ptxas, sm_90) and still
#: beat every spill-free config of those problems, the best of them by 12-15 %
#: (docs/performance.md). Larger spills are skipped to save GPU time; a campaign can raise or
#: lower the limit.
DEFAULT_MAX_SPILL_BYTES: Final = 128


@dataclass(frozen=True)
class CampaignOptions:
    """How a campaign searches: every setting of :func:`run_campaign` that is a plain value.

    The defaults here are the only ones: ``fa2tune tune``, the replay entry point
    (:func:`tuner.replay.run_replay_campaign`), the benchmarks and the tests build one value
    and override what they need.

    Attributes:
        sampler: ``tpe``, ``random`` or ``grid`` (see :func:`search.make_sampler`).
        trials: GPU-run configs per problem; None for no limit.
        time_budget_s: wall-clock budget of the whole campaign; None for no limit.
        max_spill_bytes: time builds whose ptxas spill stores and loads are at most this many
            bytes per thread; a build over it is recorded as SPILLS and not timed. None times
            every build, 0 none that spills.
        seed: sampler seed (mixed with the study name and ``worker_index``); None for a
            nondeterministic search.
        worker_index: distinguishes processes sharing the studies (e.g. the device index).
        arch: nvcc architecture of the default space and builds (when :func:`run_campaign`
            is given no ``space_fn`` or ``build_fn``).
        build_batch: configs per background ``build_fn`` call.
        claim_wait_s: how long a trial waits for earlier trials to publish their configs.
        wasted_limit: proposals in a row that evaluate nothing new before an unevaluated
            config is queued.
        heartbeat_interval: seconds between trial heartbeats.
        grace_period: seconds after which a silent RUNNING trial is failed and re-queued.
        families: kernel families the default space searches (None: every family that runs
            on the GPU and serves the problem).
        warm_start: earlier results whose fastest configs each new study measures first,
            before the seeds (:mod:`tuner.warm_start`).

    Raises:
        ValueError: for an unknown sampler.
    """

    sampler: str = "tpe"
    trials: int | None = None
    time_budget_s: float | None = None
    max_spill_bytes: int | None = DEFAULT_MAX_SPILL_BYTES
    seed: int | None = search.DEFAULT_SEED
    worker_index: int = 0
    arch: str = "sm_90"
    build_batch: int = 16
    claim_wait_s: float = 10.0
    wasted_limit: int = 25
    heartbeat_interval: int = search.DEFAULT_HEARTBEAT_S
    grace_period: int = search.DEFAULT_GRACE_S
    families: tuple[str, ...] | None = None
    warm_start: WarmStart | None = None

    def __post_init__(self) -> None:
        if self.families is not None:
            from codegen.families import family

            for name in self.families:
                family(name)  # raises UnknownFamilyError (a ValueError) naming the known ones
            if not self.families:
                raise ValueError("families: give at least one family, or None for all")
        if self.sampler not in search.sampler_names():
            raise ValueError(
                f"unknown sampler {self.sampler!r}; "
                f"choose one of {', '.join(search.sampler_names())}"
            )


class _QuietSkips(logging.Filter):
    """Drops optuna's warnings (with traceback) about trials this campaign failed on purpose.

    A duplicate or over-budget trial is failed by raising :class:`SearchSkip`, which optuna
    reports as a failure with a traceback; those are expected, and logged here at DEBUG.
    """

    def __init__(self) -> None:
        super().__init__()
        self.run: ProblemRun | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], SearchSkip):
            log.debug("trial skipped: %s", record.exc_info[1])
            return False
        run = self.run
        if run is None or not run.skipped:
            return True
        message = record.getMessage()
        return not any(message.startswith(f"Trial {n} failed") for n in run.skipped)


_OPTUNA_OPTIMIZE_LOGGER: Final = "optuna.study._optimize"


def _group(problem: Problem) -> tuple[int, str, bool]:
    return (problem.d, problem.dtype, problem.causal)


def run_campaign(
    problems: Sequence[Problem],
    options: CampaignOptions,
    *,
    store: Store,
    storage_url: str,
    gpu: GpuInfo,
    measure_fn: MeasureFn,
    space_fn: SpaceFn | None = None,
    seeds_fn: SeedFn | None = None,
    build_fn: BuildFn | None = None,
    progress: CampaignObserver | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> CampaignSummary:
    """Tune every problem with its own study, compiling ahead of the GPU.

    Args:
        problems: what to tune, in order (problems of one (D, dtype, causal) group share
            builds, so keep them together).
        options: how to search (sampler, budget, spill limit, seed, ...).
        store: where builds and measurements are recorded.
        storage_url: optuna RDB storage URL (normally the store's database).
        gpu: the device measured on (provenance; its name must match ``Problem.gpu``; its
            ``smem_optin_bytes`` bounds the default space).
        measure_fn: verifies and times one build on one problem (``BenchWorker.measure``).
        space_fn: the valid configs of a problem; default the union of the families' spaces
            for ``options.arch`` and the GPU's shared memory.
        seeds_fn: the configs each new study starts with; default
            :func:`codegen.families.fa2.space.seed_configs`.
        build_fn: compiles a batch of configs; default :func:`codegen.build.build_configs`
            for ``options.arch`` with the settings' cache directory and jobs.
        progress: receives progress events; None logs only.
        clock: the time source of ``time_budget_s`` (deadlines and shares), in seconds; tests
            pass a fake one that advances with the measurements, not with the machine.

    Returns:
        The summary; ``interrupted`` is True when a ``KeyboardInterrupt`` stopped the
        campaign (the interrupt is not re-raised; the studies stay resumable).

    Raises:
        ValueError: for a problem with an empty space, or a space of another group.
    """
    space_fn, seeds_fn, build_fn = _defaults(
        options.arch, gpu, space_fn, seeds_fn, build_fn, options.families
    )
    if options.warm_start is not None:
        base_seeds, warm = seeds_fn, options.warm_start

        def seeds_fn(p: Problem) -> Sequence[AnyConfig]:
            return with_warm_start(warm, base_seeds(p), p)

    observer: CampaignObserver = progress if progress is not None else NullObserver()
    trials, time_budget_s = options.trials, options.time_budget_s
    started = time.monotonic()
    deadline = clock() + time_budget_s if time_budget_s is not None else None
    storage = search.open_storage(
        storage_url,
        heartbeat_interval=options.heartbeat_interval,
        grace_period=options.grace_period,
    )
    builds = BuildAhead(build_fn, batch_size=options.build_batch)
    ctx = CampaignContext(
        store=store,
        gpu=gpu,
        gpu_id=store.upsert_gpu(gpu),
        sampler=options.sampler,
        max_spill_bytes=options.max_spill_bytes,
        measure_fn=measure_fn,
        builds=builds,
        observer=observer,
        claim_wait_s=options.claim_wait_s,
        # A dead process's trial turns stale after grace_period; allow twice that.
        in_flight_wait_s=2.0 * options.grace_period + options.heartbeat_interval,
        wasted_limit=options.wasted_limit,
        rng=random.Random(options.seed),
        clock=clock,
    )
    # One space per distinct config list: problems of one (D, dtype, mask) share it unless a
    # family serves only some of them (split-KV: decode shapes).
    spaces: dict[tuple[AnyConfig, ...], search.SearchSpace] = {}
    space_of: dict[Problem, search.SearchSpace] = {}
    for problem in problems:
        group = _group(problem)
        configs = tuple(space_fn(problem))
        if not configs:
            variant = (
                "" if problem.variant.plain
                else f" and attention variant ({problem.variant.describe()}: no family's "
                "kernels have its switches yet)"
            )  # fmt: skip
            raise ValueError(
                f"no config to search for {problem.study_name}: no searched kernel family "
                f"has one for its head dim and shape{variant} (see --family)"
            )
        if configs not in spaces:
            spaces[configs] = search.SearchSpace.from_configs(configs)
            first = spaces[configs].configs[0]
            if (first.d, first.dtype, first.causal) != group:
                raise ValueError(
                    f"space_fn gave {first.name} for problem {problem.study_name}: "
                    "configs must match the problem's D, dtype and mask"
                )
            # Seeds first: they are every new study's first proposals.
            seeds = [c for c in seeds_fn(problem) if c in spaces[configs]]
            builds.submit([*seeds, *spaces[configs].configs])
        space_of[problem] = spaces[configs]

    observer.campaign_started(problems, trials, time_budget_s)
    summaries: list[ProblemSummary] = []
    runs: list[ProblemRun] = []
    interrupted = False
    quiet = _QuietSkips()
    logging.getLogger(_OPTUNA_OPTIMIZE_LOGGER).addFilter(quiet)
    try:
        for index, problem in enumerate(problems):
            problem_deadline = None
            if deadline is not None:
                now = clock()
                share = (deadline - now) / (len(problems) - index)
                problem_deadline = now + max(0.0, share)
            run = _open_problem(
                ctx, options, index, problem, storage, space_of[problem], seeds_fn,
                problem_deadline,
            )  # fmt: skip
            runs.append(run)
            observer.problem_started(index, problem, trials, problem_deadline)
            quiet.run = run
            run.drive()
            summaries.append(run.summary())
            observer.problem_finished(index, summaries[-1])
        # Time the even split gave to problems that finished early (budget reached, space
        # exhausted) goes back to the ones their share cut short, split evenly again.
        short = [run for run in runs if deadline is not None and not run.complete()]
        for k, run in enumerate(short):
            now = clock()
            left = deadline - now if deadline is not None else 0.0
            if left < _MIN_EXTRA_S:
                break
            run.deadline = now + left / (len(short) - k)
            log.info("%s: %.0f s of unused budget to continue", run.study.study_name, left)
            observer.problem_started(run.index, run.problem, trials, run.deadline)
            quiet.run = run
            run.drive()
            summaries[run.index] = run.summary()
            observer.problem_finished(run.index, summaries[run.index])
    except KeyboardInterrupt:
        log.warning("interrupted; re-run the same command to resume")
        interrupted = True
    finally:
        logging.getLogger(_OPTUNA_OPTIMIZE_LOGGER).removeFilter(quiet)
        builds.close()
        ctx.record_finished_builds()
        ctx.build_wait_s = sum(run.build_wait_s for run in runs)
        ctx.measure_s = sum(run.measure_s for run in runs)
    result = CampaignSummary(
        problems=summaries,
        times=TimeSplit(
            wall_s=time.monotonic() - started,
            build_s=builds.busy_s,
            build_wait_s=ctx.build_wait_s,
            measure_s=ctx.measure_s,
        ),
        sampler=options.sampler,
        interrupted=interrupted,
    )
    observer.campaign_finished(result)
    return result


def _defaults(
    arch: str,
    gpu: GpuInfo,
    space_fn: SpaceFn | None,
    seeds_fn: SeedFn | None,
    build_fn: BuildFn | None,
    only: tuple[str, ...] | None = None,
) -> tuple[SpaceFn, SeedFn, BuildFn]:
    """The production space, seeds and build for ``arch`` where none is given.

    The space is the union of every kernel family that runs on a GPU of ``arch``
    (:func:`codegen.families.families_for`), has the problem's head dim (``Family.head_dims``;
    the others are skipped with one log line per head dim) and serves the problem
    (``Family.serves``: the split-KV family only where the packed query rows are few): on an
    sm_90 GPU the Hopper family's configs beside the portable ones, searched by one study per
    problem. A packed variable-length problem searches the ``_vl`` twins of the families with
    varlen kernels (``Family.varlen``): fa2's everywhere, fa3's on sm_90. A problem of an
    attention variant searches its families' configs (space, seeds and default) with the
    variant's switches set (:func:`with_variant`); a family whose kernels lack a switch it
    needs (:func:`variant_switches_of`) is skipped for it, with one log line per family and
    set of switches. A KV-cache problem (``kv_page`` set) searches the cache twins
    (:func:`with_cache`: ``kvcache=True, page=P``, each kept only where its family's rules take
    it) of the families whose configs have a KV-cache switch (:func:`takes_cache`: split-KV),
    whatever their ``serves`` says: no other kernel reads a cache.
    """
    from codegen.targets import ARCH_SMEM_LIMIT, compute_capability_of

    limit = ARCH_SMEM_LIMIT.get(arch, 0)
    smem = min(gpu.smem_optin_bytes or limit, limit) if limit else gpu.smem_optin_bytes
    families = [
        f for f in families_for(compute_capability_of(arch)) if only is None or f.name in only
    ]
    if not families:
        raise ValueError(f"none of the families {', '.join(only or ())} runs on {arch}")
    noted: set[int] = set()
    noted_variants: set[tuple[str, tuple[str, ...]]] = set()

    def taking(d: int) -> list[Family]:
        """The families with head dim ``d``; the others are noted once per head dim."""
        lacking = [f for f in families if d not in f.head_dims]
        if lacking and d not in noted:
            noted.add(d)
            log.info(
                "D=%d: skipping %s (head dims %s)",
                d,
                ", ".join(f.name for f in lacking),
                "; ".join(f"{f.name}: {f.head_dims_text}" for f in lacking),
            )
        return [f for f in families if d in f.head_dims]

    def with_switches(p: Problem, fams: list[Family]) -> list[Family]:
        needed = tuple(name for name, on in p.variant.needs.items() if on)
        out = []
        for f in fams:
            lacking = tuple(n for n in needed if n not in variant_switches_of(f))
            if not lacking:
                out.append(f)
            elif (f.name, lacking) not in noted_variants:
                noted_variants.add((f.name, lacking))
                log.info(
                    "%s: skipping %s for %s (its kernels have no %s switch)",
                    p.study_name, f.name, p.variant.describe(), ", ".join(lacking),
                )  # fmt: skip
        return out

    def serving(p: Problem) -> list[Family]:
        # Packed variable-length batches: the families with varlen kernels (fa2 everywhere,
        # fa3 where it runs, as for dense problems); split-KV has none. KV-cache problems: the
        # families with cache kernels that serve the problem's phase (split-KV every shape,
        # fa3 chunked prefill: Family.serves_cache).
        if p.is_cache:
            fams = [f for f in taking(p.d) if takes_cache(f, p) and f.serves_cache(p.n)]
        else:
            fams = [f for f in taking(p.d) if f.serves(p) and (not p.is_varlen or f.varlen)]
        return fams if p.variant.plain else with_switches(p, fams)

    def default_space(p: Problem) -> Sequence[AnyConfig]:
        configs = [c for f in serving(p) for c in f.space(p.d, p.dtype, p.causal, smem, arch)]
        configs = with_cache(with_variant(configs, p), p, smem or ANY_SMEM)
        return _as_varlen(configs) if p.is_varlen else configs

    def default_seeds(p: Problem) -> Sequence[AnyConfig]:
        # Round-robin over the families, each family's default first, so that a short budget
        # still measures every family's best-known config before any family's second seed.
        per_family = [_default_first(f, p, smem or None) for f in serving(p)]
        seeds = [c for group in zip_longest(*per_family) for c in group if c is not None]
        # A full-length cache problem's capacity is about its length, so its seeds' capacity-
        # split twins would run what their length-split ones do: only a mix seeds both.
        seeds = with_cache(with_variant(seeds, p), p, smem or ANY_SMEM,
                           every_span=p.kv_lengths != "full")  # fmt: skip
        return _as_varlen(seeds) if p.is_varlen else seeds

    def default_build(configs: Sequence[AnyConfig]) -> Sequence[BuildReport]:
        from codegen.build import build_configs

        return build_configs(configs, arch=arch, smem_limit=smem or None)

    return (
        space_fn or default_space,
        seeds_fn or default_seeds,
        build_fn or default_build,
    )


def variant_switches_of(family: Family) -> tuple[str, ...]:
    """The attention-variant switches a family's kernels are built with (its registry
    entry's ``variant_switches``)."""
    return tuple(family.variant_switches)


def with_variant(configs: Sequence[AnyConfig], problem: Problem) -> list[AnyConfig]:
    """The configs built for ``problem``'s attention variant: each with the switches the
    variant needs (:attr:`core.variant.Variant.needs`), set and unset alike; as they are for
    a plain problem (whose needs are all off, which plain configs are already)."""
    if problem.variant.plain:
        return list(configs)
    needs = problem.variant.needs
    return [replace(c, **needs) for c in configs]  # type: ignore[arg-type]


#: A shared-memory limit no config reaches (a twin keeps its tile's shared memory, which the
#: space checked already).
ANY_SMEM: Final = 1 << 40


def takes_cache(family: Family, problem: Problem) -> bool:
    """Whether ``family``'s configs have a KV-cache switch (``kvcache``, declared by
    :func:`core.config_common.kvcache_switch`): its kernels can serve a cache problem."""
    try:
        config = family.default(problem.d, problem.dtype, problem.causal)
    except ValueError:  # a head dim the family has no default for
        return False
    params = getattr(getattr(config, "spec", None), "params", ())
    return any(p.name == "kvcache" and p.cache for p in params)


def with_cache(
    configs: Sequence[AnyConfig], problem: Problem, smem_limit: int, every_span: bool = True
) -> list[AnyConfig]:
    """The configs built for ``problem``'s KV-cache layout: each one's cache twins
    (:func:`core.family.cache_twins`: ``kvcache=True``, ``page`` the problem's page size,
    0 for a contiguous cache, in tile order, and with ``every_span`` split-KV's capacity-split
    twin), kept only where its family's rules take it (``Family.check``: for split-KV,
    :func:`codegen.families.splitkv.space.cache_reasons`); as they are for a dense problem."""
    if problem.kv_page is None:
        return list(configs)
    out: list[AnyConfig] = []
    for c in configs:
        twins = cache_twins(c, problem.kv_page)  # none: a type without cache kernels
        for twin in twins if every_span else twins[:1]:
            if family_of(twin).check(twin, smem_limit)[0]:
                out.append(twin)
    return list(dict.fromkeys(out))


def _as_varlen(configs: Sequence[AnyConfig]) -> list[AnyConfig]:
    """The packed-sequence twins (``_vl``) of the configs that have one
    (:meth:`Family.varlen_twin`: the families with varlen kernels; a longest-first fa3 config
    has none, its launch order is for dense grids)."""
    twins = (family_of(c).varlen_twin(c) for c in configs)
    return [t for t in twins if t is not None]


def _default_first(family: Family, p: Problem, smem_limit: int | None) -> list[AnyConfig]:
    """The family's seeds with its default first: the default fitted to the GPU's shared
    memory (:meth:`Family.default_within`), which is what an untuned call there runs."""
    seeds = list(family.seeds(p.d, p.dtype, p.causal))
    try:
        default = family.default(p.d, p.dtype, p.causal)
        fitted = family.default_within(p.d, p.dtype, p.causal, smem_limit)
    except ValueError:  # a head dim the family has no default for
        return seeds
    if fitted is not None and fitted != default:  # shrunk for this GPU: it leads the seeds
        return [fitted, *(c for c in seeds if c != fitted)]
    return [default, *(c for c in seeds if c != default)] if default in seeds else seeds


def _open_problem(
    ctx: CampaignContext,
    options: CampaignOptions,
    index: int,
    problem: Problem,
    storage: optuna.storages.BaseStorage,
    space: search.SearchSpace,
    seeds_fn: SeedFn,
    deadline: float | None,
) -> ProblemRun:
    seed = _seed_for(options.seed, problem.study_name, options.worker_index)
    sampler = search.make_sampler(ctx.sampler, space, seed)
    study = search.open_study(problem, storage, sampler)
    # Trials a killed run left RUNNING: failed and re-queued before anything counts them.
    search.fail_stale_trials(study)
    bound = search.bind_space(study, space)
    if bound is not space:
        # The study was created with other choices: the grid must enumerate those.
        study.sampler = search.make_sampler(ctx.sampler, bound, seed)
    search.enqueue_seeds(study, bound, seeds_fn(problem))
    problem_id = ctx.store.problem_id(problem, ctx.gpu_id)
    run = ProblemRun(ctx, index, problem, study, bound, problem_id, options.trials, deadline)
    run.queue_retimes()
    return run


def _seed_for(seed: int | None, study_name: str, salt: int) -> int | None:
    # Distinct, stable seeds per study and per process: two processes sharing a study with one
    # seed would draw the same random startup configs in lockstep and collide on every trial.
    if seed is None:
        return None
    return zlib.crc32(f"{seed}:{study_name}:{salt}".encode())
