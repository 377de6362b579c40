"""``fa2tune --db URL tune --replay``: results and studies in that database, resumed by a
rerun; no scratch folder left behind; stale RUNNING trials of killed runs are failed."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import optuna
import pytest
import typer
from optuna.trial import TrialState
from typer.testing import CliRunner

from db.models import Build, Measurement
from db.session import session_scope
from db.store import Store
from tests.support.replay import problems_for, synthetic_table, tiny_space
from tuner import search
from tuner.campaign import CampaignOptions
from tuner.replay import SCRATCH_PREFIX, remove_stale_scratch, run_replay_campaign
from tuner.replay_table import save_replay_table

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")

PROBLEMS = problems_for([512, 1024])


@pytest.fixture
def table_path(tmp_path: Path) -> Path:
    path = tmp_path / "table.json"
    save_replay_table(synthetic_table(PROBLEMS, tiny_space), path)
    return path


def _gpu_measurements(url: str) -> list[tuple[int, str]]:
    with Store.from_url(url) as store, session_scope(store.engine) as s:
        rows = s.query(Measurement.problem_id, Build.config_name, Measurement.status).join(
            Build, Build.id == Measurement.build_id
        )
        return [(p, c) for p, c, st in rows if st in search.GPU_STATUSES]


def _replay(app: typer.Typer, db: str | None, table: Path, out: Path, trials: int) -> dict:  # type: ignore[type-arg]
    args = ["--db", db] if db is not None else []
    args += ["tune", "--replay", str(table), "--sampler", "random", "--trials", str(trials)]
    result = CliRunner().invoke(app, [*args, "--summary-json", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# ------------------------------------------------------------------------------ --db, resume


@pytest.mark.slow
def test_replay_writes_to_db_and_a_rerun_resumes(
    app: typer.Typer, tmp_path: Path, table_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    first = _replay(app, url, table_path, tmp_path / "1.json", trials=3)
    assert [p["trials"] for p in first["problems"]] == [3, 3]
    # The results and the studies are in --db, to be inspected afterwards.
    assert Counter(p for p, _ in _gpu_measurements(url)) == Counter({1: 3, 2: 3})
    storage = search.resolve_storage_url(url)
    before = {
        p.study_name: {
            t.number: t.state
            for t in optuna.load_study(study_name=p.study_name, storage=storage).trials
        }
        for p in PROBLEMS
    }
    # Rerun with a larger budget: the same studies go on, only what is left is measured.
    second = _replay(app, url, table_path, tmp_path / "2.json", trials=5)
    assert [p["trials"] for p in second["problems"]] == [5, 5]
    for p in PROBLEMS:
        trials = optuna.load_study(study_name=p.study_name, storage=storage).trials
        assert {t.number: t.state for t in trials if t.number in before[p.study_name]} == (
            before[p.study_name]
        )
        assert len(trials) > len(before[p.study_name])
    rows = _gpu_measurements(url)
    assert Counter(p for p, _ in rows) == Counter({1: 5, 2: 5})
    assert max(Counter(rows).values()) == 1  # no config measured twice
    # The same command once more: nothing is left, nothing is measured.
    third = _replay(app, url, table_path, tmp_path / "3.json", trials=5)
    assert [p["trials"] for p in third["problems"]] == [5, 5]
    assert len(_gpu_measurements(url)) == len(rows)


@pytest.mark.slow
def test_replay_without_db_uses_a_scratch_folder_and_cleans_stale_ones(
    app: typer.Typer, tmp_path: Path, table_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    killed = temp / f"{SCRATCH_PREFIX}{_dead_pid()}-abc123"  # left by a kill -9
    (killed / "sub").mkdir(parents=True)
    (killed / "studies.db").write_bytes(b"x")
    running = temp / f"{SCRATCH_PREFIX}{os.getppid()}-def456"  # a live process's
    running.mkdir()
    other = temp / "someone-else-123-x"
    other.mkdir()
    first = _replay(app, None, table_path, tmp_path / "1.json", trials=2)
    assert not killed.exists()
    assert sorted(p.name for p in temp.iterdir()) == sorted([running.name, other.name])
    # Without --db a rerun starts over (documented in --help).
    second = _replay(app, None, table_path, tmp_path / "2.json", trials=2)
    assert [p["measured"] for p in second["problems"]] == [p["measured"] for p in first["problems"]]


def test_remove_stale_scratch_keeps_live_and_foreign_folders(tmp_path: Path) -> None:
    dead = tmp_path / f"{SCRATCH_PREFIX}{_dead_pid()}-a"
    mine = tmp_path / f"{SCRATCH_PREFIX}{os.getpid()}-b"
    legacy = tmp_path / f"{SCRATCH_PREFIX}abcdefgh"
    for path in (dead, mine, legacy):
        path.mkdir()
    assert remove_stale_scratch(tmp_path) == [dead]
    assert mine.exists() and legacy.exists()


def test_replay_help_says_what_happens_without_db(app: typer.Typer) -> None:
    result = CliRunner().invoke(app, ["tune", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "scratch database deleted at exit" in text and "--db" in text


# ------------------------------------------------------------------------------ stale trials


def _add_running_trial(
    study: optuna.Study, *, owner: dict[str, object] | None, age_s: float, heartbeat: bool
) -> int:
    """A RUNNING trial as a killed campaign leaves it; returns its number."""
    frozen = optuna.trial.create_trial(state=TrialState.RUNNING)
    frozen.datetime_start = datetime.datetime.now() - datetime.timedelta(seconds=age_s)
    storage = study._storage
    trial_id = storage.create_new_trial(study._study_id, template_trial=frozen)
    number = storage.get_trial_number_from_id(trial_id)
    if owner is not None:
        storage.set_trial_user_attr(trial_id, search.ATTR_OWNER, {**owner, "trial": number})
    if heartbeat:
        storage.record_heartbeat(trial_id)  # type: ignore[attr-defined]
    return number


def _owner(pid: int) -> dict[str, object]:
    return {**search.trial_owner(0), "pid": pid, "start": "1"}


def _run(tmp_path: Path, trials: int, **options: int) -> object:
    return run_replay_campaign(
        synthetic_table(PROBLEMS, tiny_space),
        CampaignOptions(sampler="random", trials=trials, **options),  # type: ignore[arg-type]
        store=f"sqlite:///{tmp_path / 'results.db'}",
        problems=PROBLEMS,
    )


def test_campaign_storage_has_the_heartbeat_on(tmp_path: Path) -> None:
    storage = search.open_storage(f"sqlite:///{tmp_path / 's.db'}")
    assert storage.heartbeat_interval == search.DEFAULT_HEARTBEAT_S
    assert storage.get_heartbeat_stale_trial_callback() is not None


@pytest.mark.slow
def test_resume_fails_and_requeues_stale_running_trials(tmp_path: Path) -> None:
    """A killed run's RUNNING trials (one of a dead process with a fresh heartbeat, one
    without heartbeat nor owner, older than the grace period) end FAIL when the campaign is
    resumed, right away (a 60 s grace period, a replay far shorter), are re-queued, and the
    campaign completes its budget."""
    _run(tmp_path, trials=2)
    storage_url = search.resolve_storage_url(f"sqlite:///{tmp_path / 'results.db'}")
    storage = search.open_storage(storage_url)
    study = optuna.load_study(study_name=PROBLEMS[0].study_name, storage=storage)
    killed = _add_running_trial(study, owner=_owner(_dead_pid()), age_s=1, heartbeat=True)
    early = _add_running_trial(study, owner=None, age_s=3600, heartbeat=False)
    # A trial of a live process (this one) that just started: not stale.
    alive = _add_running_trial(study, owner=search.trial_owner(0), age_s=1, heartbeat=True)
    # The running trial of a live process would count against the budget and stall the
    # campaign; mark it finished once the stale check has looked at it.
    stale = search.stale_trials(study)
    assert sorted(t.number for t in stale) == [killed, early]
    alive_id = study.trials[alive]._trial_id
    study._storage.set_trial_state_values(alive_id, state=TrialState.FAIL)

    summary = _run(tmp_path, trials=4)
    assert [p.trials for p in summary.problems] == [4, 4]  # type: ignore[attr-defined]
    trials = optuna.load_study(study_name=PROBLEMS[0].study_name, storage=storage_url).trials
    by_number = {t.number: t for t in trials}
    assert by_number[killed].state == TrialState.FAIL
    assert by_number[early].state == TrialState.FAIL
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]
    retried = [t.system_attrs.get("failed_trial") for t in trials]
    assert killed in retried and early in retried  # re-queued by the retry callback


def test_no_stale_trial_without_evidence(tmp_path: Path) -> None:
    """A fresh trial without heartbeat, one of a live process, one of another host: kept."""
    storage = search.open_storage(f"sqlite:///{tmp_path / 's.db'}")
    study = optuna.create_study(storage=storage, study_name="s")
    _add_running_trial(study, owner=None, age_s=1, heartbeat=False)
    _add_running_trial(study, owner=search.trial_owner(0), age_s=1, heartbeat=True)
    _add_running_trial(
        study, owner={**_owner(_dead_pid()), "host": "elsewhere"}, age_s=1, heartbeat=True
    )
    assert search.stale_trials(study) == []
    assert search.fail_stale_trials(study) == []
