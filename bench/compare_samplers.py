"""How many trials does each sampler need to get within 2% of the exhaustive best?

Replays the search (:mod:`tuner.replay`) against a table exported from an exhaustive
``grid`` campaign, per problem, sampler and seed, exactly as ``fa2tune tune`` runs it (same
space, seed configs, budget semantics and dedupe), and prints, per problem and sampler, the
median over seeds of the number of GPU trials (distinct configs run on the GPU, what
``--trials`` counts) until the first config within the tolerance of the table's best::

    fa2tune tune --sampler grid ...                         # on the GPU, exhaustive
    python bench/compare_samplers.py t.json --from-db sqlite:///.../fa2tune.db --gpu H200
    python bench/compare_samplers.py t.json --seeds 5 --max-trials 60   # again, from t.json

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

log = logging.getLogger("compare_samplers")


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


def run_one(
    table_path: str,
    study: str,
    sampler: str,
    seed: int,
    max_trials: int,
    tolerance: float,
    use_seeds: bool,
) -> RunResult:
    """Search one problem of the table from scratch and measure trials-to-target."""
    import shutil

    import optuna

    from codegen.space import seed_configs
    from db.store import Store
    from tuner import search
    from tuner.campaign import run_campaign
    from tuner.replay import ReplayMeasure, load_replay_table

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    table = load_replay_table(table_path)
    problem = table.problems[study]
    best = table.best(study)
    if best is None:
        return RunResult(study, sampler, seed, None, 0, None)
    target = best[1] * (1 + tolerance)
    replay = ReplayMeasure(table)
    gpu = table.gpu
    assert gpu is not None
    scratch = _scratch_dir()
    try:
        store = Store.from_url(f"sqlite:///{scratch}/results.db")
        storage_url = f"sqlite:///{scratch}/studies.db"
        run_campaign(
            [problem],
            store=store,
            storage_url=storage_url,
            gpu=gpu,
            space_fn=replay.space,
            seeds_fn=(lambda p: seed_configs(p.d, p.dtype, p.causal))
            if use_seeds
            else (lambda p: []),
            build_fn=replay.build,
            measure_fn=replay,
            sampler=sampler,
            trials=max_trials,
            seed=seed,
        )
        store.close()
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

    from tuner.replay import ReplayTable, export_replay_table, load_replay_table, save_replay_table

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
    studies = [s for s in sorted(table.problems) if args.problems in s]
    if not studies:
        parser.error("no problem in the table matches (a table with problem records is needed)")
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
        results = list(pool.map(run_one, *zip(*jobs, strict=True)))

    out = Table(
        title=(
            f"GPU trials to reach {args.tolerance:.0%} of the exhaustive best "
            f"(median over {args.seeds} seeds; runs that reached it)"
        )
    )
    out.add_column("problem")
    out.add_column("space", justify="right")
    for sampler in samplers:
        out.add_column(sampler, justify="right")
    for study in studies:
        row = [study, str(len(table.studies[study]))]
        for sampler in samplers:
            runs = [r for r in results if r.study == study and r.sampler == sampler]
            row.append(_cell(runs, args.max_trials))
        out.add_row(*row)
    totals = ["all problems", ""]
    for sampler in samplers:
        runs = [r for r in results if r.sampler == sampler]
        totals.append(_cell(runs, args.max_trials))
    out.add_row(*totals, end_section=True)
    Console().print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
