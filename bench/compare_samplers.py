"""How many trials does each sampler need to get within 2% of the exhaustive best?

Replays the search (:mod:`tuner.replay`) against a table exported from an exhaustive
``grid`` campaign, per problem, sampler and seed, exactly as ``fa2tune tune`` runs it (same
space, seed configs, budget semantics and dedupe), and prints, per problem and sampler, the
median over seeds of the number of GPU trials (distinct configs run on the GPU, what
``--trials`` counts) until the first config within the tolerance of the table's best::

    fa2tune tune --sampler grid ...                         # on the GPU, exhaustive
    python bench/compare_samplers.py t.json --from-db sqlite:///.../fa2tune.db --gpu H200
    python bench/compare_samplers.py t.json --seeds 5 --max-trials 60   # again, from t.json

The comparison is only meaningful over a problem whose table covers the whole valid space
(every config ``fa2tune tune`` would search has a recorded outcome: an OK time, or a status
such as SPILLS or COMPILE_FAILED). A problem tuned with TPE holds a few dozen configs of a few
hundred: replaying it would search that handful instead of the real space (and the best
recorded config is not the best of the space). Such problems are skipped, with a warning, and
listed under the table as skipped.

Each (problem, sampler, seed) run is independent and gets its own throw-away SQLite files
(in ``/dev/shm`` when there is one), so ``--jobs`` runs them in parallel processes.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from core.fa2_config import Fa2Config
    from core.problem import Problem
    from core.records import GpuInfo
    from tuner.replay_table import ReplayTable

log = logging.getLogger("compare_samplers")

_MISSING_SHOWN = 3  # missing configs named in a skip note


@dataclass(frozen=True)
class RunResult:
    """One search of one problem with one sampler and seed.

    Attributes:
        study: the problem's study name.
        sampler: sampler name.
        seed: sampler seed.
        to_target: GPU trials until the first config within tolerance (None: not reached).
        gpu_trials: GPU trials the run took in all.
        best_gap: final best over the table's best, minus one (0.0 = found the best).
    """

    study: str
    sampler: str
    seed: int
    to_target: int | None
    gpu_trials: int
    best_gap: float | None


def _scratch_dir() -> str:
    shm = Path("/dev/shm")
    return tempfile.mkdtemp(
        prefix="fa2tune-cmp-", dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    )


def valid_space(problem: Problem, gpu: GpuInfo, arch: str) -> list[Fa2Config]:
    """The mma.sync (fa2) configs ``fa2tune tune`` searches for ``problem`` on ``gpu``.

    The recorded exhaustive sweeps this script replays cover that family; on an sm_90 GPU
    the campaign's default space also holds the Hopper family's configs, which the sweeps
    predate. The shared-memory bound is the campaign's: the GPU's opt-in maximum, capped at
    the architecture's.
    """
    from codegen.families.fa2.space import enumerate_space
    from codegen.targets import ARCH_SMEM_LIMIT

    limit = ARCH_SMEM_LIMIT.get(arch, 0)
    smem = min(gpu.smem_optin_bytes or limit, limit) if limit else gpu.smem_optin_bytes
    return enumerate_space(problem.d, problem.dtype, problem.causal, smem, arch)


def skip_reason(table: ReplayTable, study: str, *, examples: int = 0) -> str | None:
    """Why ``study`` cannot be compared (None when it can): no problem or GPU record, a
    table that does not cover the valid space, or no OK config in it.

    Args:
        table: the replay table.
        study: the problem's study name.
        examples: name up to this many of the configs without a recorded outcome.
    """
    problem = table.problems.get(study)
    if problem is None:
        return "no problem record in the table (export it with --from-db)"
    if table.gpu is None:
        return "no GPU record in the table (export it with --from-db)"
    space = valid_space(problem, table.gpu, table.arch or "sm_90")
    missing = table.missing(study, space)
    if missing:
        reason = (
            f"not exhaustive: {len(missing)} of {len(space)} valid configs have no recorded outcome"
        )
        if examples > 0:
            names = ", ".join(c.name for c in missing[:examples])
            more = f" and {len(missing) - examples} more" if len(missing) > examples else ""
            reason += f" ({names}{more}); sweep it with --sampler grid first"
        return reason
    if table.best(study, among={c.name for c in space}) is None:
        return "no config of the valid space ran OK"
    return None


def run_one(
    table_path: str,
    study: str,
    sampler: str,
    seed: int,
    max_trials: int,
    tolerance: float,
    use_seeds: bool,
) -> RunResult:
    """Search one problem of the table from scratch and measure trials-to-target.

    The search runs over the problem's valid space (:func:`valid_space`), as ``fa2tune tune``
    would, answered from the table.

    Raises:
        ValueError: when the problem cannot be compared (see :func:`skip_reason`).
        RuntimeError: when the search itself fails; the message names the run.
    """
    import shutil

    import optuna

    from tuner import search
    from tuner.campaign import CampaignOptions
    from tuner.replay import ReplayMeasure, run_replay_campaign
    from tuner.replay_table import load_replay_table

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    table = load_replay_table(table_path)
    reason = skip_reason(table, study, examples=_MISSING_SHOWN)
    if reason is not None:
        raise ValueError(f"{study}: cannot compare samplers: {reason}")
    problem, gpu = table.problems[study], table.gpu
    assert gpu is not None  # skip_reason checked
    space = valid_space(problem, gpu, table.arch or "sm_90")
    best = table.best(study, among={c.name for c in space})
    assert best is not None  # skip_reason checked
    target = best[1] * (1 + tolerance)
    # Strict: a config without a recorded outcome is an error, never a silent SKIPPED.
    replay = ReplayMeasure(table, strict=True)
    scratch = _scratch_dir()
    try:
        # Our own scratch files (not the entry point's): the trials are read back below.
        storage_url = f"sqlite:///{scratch}/studies.db"
        try:
            run_replay_campaign(
                replay,
                CampaignOptions(sampler=sampler, trials=max_trials, seed=seed),
                store=f"sqlite:///{scratch}/results.db",
                storage_url=storage_url,
                problems=[problem],
                space_fn=lambda p: space,
                seeds_fn=None if use_seeds else (lambda p: []),  # None: FA2's seed configs
            )
        except Exception as exc:
            # Name the run, and never let a StopIteration escape into the pool's result
            # generator (where it turns into "generator raised StopIteration").
            raise RuntimeError(
                f"{study}, sampler {sampler}, seed {seed}: the search failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        trials = optuna.load_study(study_name=study, storage=storage_url).get_trials(deepcopy=False)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    seen: set[str] = set()
    to_target: int | None = None
    best_ms: float | None = None
    for t in sorted(trials, key=lambda t: t.number):
        config, status = search.trial_config(t), search.trial_status(t)
        if config is None or status not in search.GPU_STATUSES:
            continue
        seen.add(config)
        if status == "OK" and t.value is not None:
            best_ms = t.value if best_ms is None else min(best_ms, t.value)
            if to_target is None and t.value <= target:
                to_target = len(seen)
    gap = best_ms / best[1] - 1 if best_ms is not None else None
    return RunResult(study, sampler, seed, to_target, len(seen), gap)


def _cell(results: Sequence[RunResult], max_trials: int) -> str:
    reached = [r.to_target for r in results if r.to_target is not None]
    if not reached:
        return f">{max_trials} (0/{len(results)})"
    # Unreached runs count as max_trials + 1, so the median stays honest about them.
    padded = [r.to_target if r.to_target is not None else max_trials + 1 for r in results]
    median = statistics.median(padded)
    text = f"{median:g}" if median <= max_trials else f">{max_trials}"
    return f"{text} ({len(reached)}/{len(results)})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", help="replay table JSON from an exhaustive campaign")
    parser.add_argument("--samplers", default="tpe,random", help="comma-separated (tpe,random)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per problem and sampler")
    parser.add_argument("--max-trials", type=int, default=60, help="GPU trials per run")
    parser.add_argument("--tolerance", type=float, default=0.02, help="within this of the best")
    parser.add_argument("--problems", default="", help="only studies containing this text")
    parser.add_argument("--no-seed-configs", action="store_true", help="start without seeds")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes")
    parser.add_argument("--from-db", metavar="URL", help="first export TABLE from this database")
    parser.add_argument("--gpu", default="H200", help="the GPU to export (with --from-db)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    from rich.console import Console
    from rich.table import Table

    from tuner.replay_table import (
        ReplayTable,
        export_replay_table,
        load_replay_table,
        save_replay_table,
    )

    if args.from_db:
        from db.store import Store

        with Store.from_url(args.from_db) as store:
            try:
                exported = export_replay_table(store, args.gpu)
            except ValueError as exc:
                parser.error(str(exc))
        save_replay_table(ReplayTable.from_dict(exported), args.table)
    try:
        table = load_replay_table(args.table)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    matching = [s for s in sorted(table.studies) if args.problems in s]
    if not matching:
        parser.error(f"no problem in the table matches {args.problems!r}")
    if table.gpu is None:
        parser.error("the table has no GPU record (a table exported with --from-db is needed)")
    skipped: dict[str, str] = {}
    for study in matching:
        reason = skip_reason(table, study)
        if reason is not None:
            skipped[study] = reason
            log.warning(
                "skipping %s: %s", study, skip_reason(table, study, examples=_MISSING_SHOWN)
            )
    studies = [s for s in matching if s not in skipped]
    console = Console()
    if not console.is_terminal:  # piped to a file: rich would assume 80 columns and cut names
        console = Console(width=max(console.width, 160))
    if not studies:
        _print_skipped(console, skipped)
        console.print(
            f"nothing to compare: none of the {len(matching)} matching problems has a table "
            "covering its whole valid space"
        )
        return 1
    samplers = [s.strip() for s in args.samplers.split(",") if s.strip()]
    jobs = [
        (
            args.table,
            study,
            sampler,
            seed,
            args.max_trials,
            args.tolerance,
            not args.no_seed_configs,
        )
        for study in studies
        for sampler in samplers
        for seed in range(args.seeds)
    ]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        try:
            results = list(pool.map(run_one, *zip(*jobs, strict=True)))
        except BaseException:
            # A failed run (or ^C) stops the comparison now, not after every queued run.
            pool.shutdown(wait=True, cancel_futures=True)
            raise

    out = Table(
        title=(
            f"GPU trials to reach {args.tolerance:.0%} of the exhaustive best "
            f"(median over {args.seeds} seeds; runs that reached it)"
        )
    )
    # Study names say which problem a row is: never cut them, squeeze the numbers instead.
    out.add_column("problem", no_wrap=True, min_width=max(len(s) for s in studies))
    out.add_column("space", justify="right")
    for sampler in samplers:
        out.add_column(sampler, justify="right")
    for study in studies:
        space = valid_space(table.problems[study], table.gpu, table.arch or "sm_90")
        row = [study, str(len(space))]
        for sampler in samplers:
            runs = [r for r in results if r.study == study and r.sampler == sampler]
            row.append(_cell(runs, args.max_trials))
        out.add_row(*row)
    totals = ["all problems", ""]
    for sampler in samplers:
        runs = [r for r in results if r.sampler == sampler]
        totals.append(_cell(runs, args.max_trials))
    out.add_row(*totals, end_section=True)
    console.print(out)
    _print_skipped(console, skipped)
    return 0


def _print_skipped(console: Console, skipped: dict[str, str]) -> None:
    """List the skipped problems and why (the warnings logged when skipping name some of the
    missing configs)."""
    if not skipped:
        return
    plural = "s" if len(skipped) != 1 else ""
    console.print(f"Skipped {len(skipped)} problem{plural} (not compared):", highlight=False)
    for study, reason in skipped.items():
        console.print(f"  {study}: {reason}", highlight=False, markup=False, soft_wrap=True)


if __name__ == "__main__":
    sys.exit(main())
