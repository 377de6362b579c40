"""Two processes (two GPUs) run one campaign against one SQLite database and share its
studies: no config is measured twice for a problem, and no trial is lost."""

from __future__ import annotations

import multiprocessing as mp
from collections import Counter
from pathlib import Path

import optuna
import pytest

from db.models import Build, Measurement
from db.session import session_scope
from db.store import Store
from tests.support.replay import GPU, problems_for, synthetic_table
from tuner import search

pytestmark = [
    pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning"),
    pytest.mark.slow,  # replayed campaigns in several processes: seconds each
]

TRIALS = 10
NS = (512, 2048)


def _worker(tmp: str, device: int, barrier: object) -> None:
    from tests.support.replay import problems_for as pf
    from tests.support.replay import synthetic_table as st
    from tuner.campaign import CampaignOptions
    from tuner.replay import ReplayMeasure, run_replay_campaign

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    path = Path(tmp)
    problems = pf(NS)
    # Measuring takes time, as on a GPU, so the two processes really overlap.
    replay = ReplayMeasure(st(problems), latency_s=0.1)
    with Store.from_url(f"sqlite:///{path / 'results.db'}") as store:
        barrier.wait()  # type: ignore[attr-defined]
        run_replay_campaign(
            replay,
            # The same seed and salt on purpose (as in the compose stack, where each
            # container's GPU is device 0): samplers in lockstep must still not collide.
            CampaignOptions(sampler="tpe", trials=TRIALS, seed=0, worker_index=0),
            store=store,
            storage_url=f"sqlite:///{path / 'studies.db'}",
            problems=problems,
        )


def test_two_processes_share_the_studies(tmp_path: Path) -> None:
    Store.from_url(f"sqlite:///{tmp_path / 'results.db'}").close()  # schema once, up front
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_worker, args=(str(tmp_path), d, barrier)) for d in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
    assert [p.exitcode for p in procs] == [0, 0]

    url = f"sqlite:///{tmp_path / 'results.db'}"
    with Store.from_url(url) as store, session_scope(store.engine) as s:
        columns = (Measurement.problem_id, Build.config_name, Measurement.status)
        extra = (Measurement.extra, Measurement.trial_number)
        rows = s.query(*columns, *extra).join(Build, Build.id == Measurement.build_id).all()
    per_pair = Counter((p, c) for p, c, *_ in rows)
    assert max(per_pair.values()) == 1, per_pair.most_common(3)  # nothing measured twice
    gpu_runs = Counter(p for p, _, st, *_ in rows if st in search.GPU_STATUSES)
    assert sorted(gpu_runs.values()) == [TRIALS, TRIALS]  # budget exact, shared
    pids = {extra["search"]["pid"] for *_, extra, _ in rows}
    assert len(pids) == 2  # both processes measured

    table = synthetic_table(problems_for(NS))
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    for problem in problems_for(NS):
        study = optuna.load_study(study_name=problem.study_name, storage=storage)
        trials = study.get_trials(deepcopy=False)
        assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
        # No loss: every stored measurement of the problem is a finished trial's outcome.
        measured = {
            search.trial_config(t): t
            for t in trials
            if t.user_attrs.get(search.ATTR_ROLE) == search.TrialRole.MEASURED
        }
        stored = {c for p, c, *_ in rows if p == _problem_id(tmp_path, problem)}
        assert stored == set(measured)
        for name, t in measured.items():
            assert name is not None
            entry = table.studies[problem.study_name][name]
            assert search.trial_status(t) == entry.status or entry.status in (
                "SPILLS",
                "COMPILE_FAILED",
            )
            if t.state == optuna.trial.TrialState.COMPLETE:
                assert t.value == entry.median_ms
        seeds = [t for t in trials if t.user_attrs.get(search.ATTR_SEED)]
        # Both processes may have seeded a new study at the same instant; a seed queued twice
        # is then reused, never measured twice (checked above).
        assert seeds


def _problem_id(tmp_path: Path, problem: object) -> int:
    with Store.from_url(f"sqlite:///{tmp_path / 'results.db'}") as store:
        gpu_id = store.upsert_gpu(GPU)
        return store.problem_id(problem, gpu_id)  # type: ignore[arg-type]


def test_a_config_in_flight_elsewhere_is_not_measured_again(tmp_path: Path) -> None:
    """Another process is measuring config X (a lower-numbered RUNNING trial): a trial of
    ours that draws X yields (DUPLICATE), and the budget waits for X rather than overshoot."""
    import threading
    import time

    from tuner.campaign import CampaignOptions
    from tuner.replay import ReplayMeasure, run_replay_campaign

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    (problem,) = problems_for([1024])
    table = synthetic_table([problem])
    replay = ReplayMeasure(table)
    space = search.SearchSpace.from_configs(replay.space(problem))
    x = next(c for c in space.configs if table.studies[problem.study_name][c.name].status == "OK")
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    storage = search.open_storage(url)
    study = search.open_study(problem, storage, search.make_sampler("random", space))
    search.bind_space(study, space)
    # The other process: takes X and is busy measuring it.
    study.enqueue_trial(dict(search.params_of(x)))
    other = study.ask()
    assert space.suggest(other) == x
    other.set_user_attr(search.ATTR_CONFIG, x.name)
    # Make our first proposal X too.
    study.enqueue_trial(dict(search.params_of(x)))

    def finish_other() -> None:
        time.sleep(3.0)
        other.set_user_attr(search.ATTR_STATUS, "OK")
        other.set_user_attr(search.ATTR_ROLE, search.TrialRole.MEASURED)
        study.tell(other, table.studies[problem.study_name][x.name].median_ms)

    finisher = threading.Thread(target=finish_other)
    finisher.start()
    with Store.from_url(f"sqlite:///{tmp_path / 'results.db'}") as store:
        summary = run_replay_campaign(
            replay,
            CampaignOptions(sampler="random", trials=3),
            store=store,
            storage_url=url,
            problems=[problem],
            seeds_fn=lambda p: [],
        )
    finisher.join()
    assert (problem.study_name, x.name) not in replay.measure_counts
    assert summary.problems[0].trials == 3  # two of ours plus X
    assert summary.problems[0].duplicates >= 1
    trials = optuna.load_study(study_name=problem.study_name, storage=url).trials
    dup = [t for t in trials if search.trial_status(t) == search.STATUS_DUPLICATE]
    assert dup and all(t.state == optuna.trial.TrialState.FAIL for t in dup)
    assert all(search.trial_config(t) == x.name for t in dup)
