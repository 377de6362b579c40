"""First-use tuning (``fa2tune.torch.autotune``) without torch or a GPU.

The decision layer (:func:`fa2tune.ops.selection.select`) is asked as the op asks it; the
tuning job is a fake callable that writes a measurement to the temporary SQLite database the
way a campaign would, so the rules (modes, one job per untuned shape and process, the served
choice changing once the job has written its result, the listener that makes the op choose
again) are checked on any machine. The real campaign is tests/fa2tune/test_gpu_torch_op.py's.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from codegen.families.fa2.space import fa2_default_config
from core import settings as settings_module
from core.problem import Problem
from core.settings import Settings, override_settings
from core.shape import Shape
from db.store import Store
from fa2tune.cli import app
from fa2tune.ops import autotune, choice, selection
from fa2tune.ops.autotune import AutoTuner, TuneJob, campaign_command, check_budget, check_mode
from fa2tune.ops.selection import Call, job_tag, select
from tests.support.factories import H200, make_config, ok_result, seed_measurement
from tuner import campaign_run
from tuner.campaign_plan import make_problems

GPU = H200.name
UNTUNED = Shape(1000, 1000, 2, 16, 16)
TUNED = Shape(4096, 4096, 2, 16, 16)
WINNER = make_config(br=64, bc=64)


def _call(shape: Shape, device: int = 0) -> Call:
    return Call(
        device=device, gpu=GPU, sm_count=H200.sm_count, compute_capability="9.0", shape=shape,
        dtype="fp16", causal=False, d=128,
    )  # fmt: skip


def _write_result(db_url: str, problem: Problem, config: object = WINNER) -> None:
    with Store.from_url(db_url) as store:
        seed_measurement(store, problem=problem, config=config, result=ok_result(1e-6, problem))  # type: ignore[arg-type]


@pytest.fixture
def db_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A temporary database (with one tuned shape) as the settings' database."""
    # Only what the test seeds: the shipped H200 results would compete (and take seconds).
    monkeypatch.setattr("db.shipped.load_shipped_results", lambda store: None)
    url = f"sqlite:///{tmp_path / 'fa2tune.db'}"
    _write_result(url, _call(TUNED).problem())
    saved = dict(settings_module._overrides)
    override_settings(db_url=url, cache_dir=tmp_path / "build", service_url=None)
    choice.reset_store()
    autotune.reset()
    selection.reset_service_state()
    yield url
    choice.reset_store()
    autotune.reset()
    settings_module._overrides.clear()
    settings_module._overrides.update(saved)


class FakeTuner:
    """Records jobs; optionally writes a winning result, as a campaign would."""

    def __init__(self, write: bool = True, fail: bool = False) -> None:
        self.jobs: list[TuneJob] = []
        self.write = write
        self.fail = fail
        self.release = threading.Event()
        self.release.set()

    def __call__(self, job: TuneJob) -> None:
        self.jobs.append(job)
        self.release.wait(10)
        if self.fail:
            raise RuntimeError("no GPU worker")
        if self.write:
            _write_result(job.db_url, job.problem)


def test_modes_and_budgets_are_checked() -> None:
    assert check_mode("on_first_call") == "on_first_call"
    for bad in ("on", "OFF", ""):
        with pytest.raises(ValueError, match="off, cached, on_first_call"):
            check_mode(bad)
        with pytest.raises(ValueError, match="autotune mode"):
            autotune.autotune(bad)
    assert check_budget(20) == 20.0
    for budget in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="budget_s"):
            AutoTuner("on_first_call", budget)


def test_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FA2TUNE_AUTOTUNE", "FA2TUNE_AUTOTUNE_BUDGET_S", "FA2TUNE_SERVICE_URL"):
        monkeypatch.delenv(name, raising=False)
    defaults = Settings()
    assert (defaults.autotune, defaults.autotune_budget_s, defaults.service_url) == (
        "cached", 30.0, None,
    )  # fmt: skip
    monkeypatch.setenv("FA2TUNE_AUTOTUNE", "on_first_call")
    monkeypatch.setenv("FA2TUNE_AUTOTUNE_BUDGET_S", "20")
    monkeypatch.setenv("FA2TUNE_SERVICE_URL", "http://tuner:8000")
    monkeypatch.setenv("FA2TUNE_SERVICE_TIMEOUT_S", "0.25")
    s = Settings()
    assert (s.autotune, s.autotune_budget_s) == ("on_first_call", 20.0)
    assert (s.service_url, s.service_timeout_s) == ("http://tuner:8000", 0.25)
    for name, value in (("FA2TUNE_AUTOTUNE", "always"), ("FA2TUNE_AUTOTUNE_BUDGET_S", "0")):
        monkeypatch.setenv(name, value)
        with pytest.raises(ValidationError):
            Settings()
        monkeypatch.delenv(name)


def test_first_tuner_follows_the_settings(db_url: str) -> None:
    override_settings(autotune="on_first_call", autotune_budget_s=12.0)
    tuner = autotune.current()
    assert (tuner.mode, tuner.budget_s) == ("on_first_call", 12.0)
    assert autotune.current() is tuner


def test_off_and_cached_never_schedule(db_url: str) -> None:
    """``cached`` serves stored results (here the nearest tuned shape); ``off`` ignores them
    and runs the family default; neither starts a job."""
    for mode, source in (("off", "default"), ("cached", "nearest")):
        fake = FakeTuner()
        autotune.autotune(mode, 5, tuner=fake)
        selected = select(_call(UNTUNED))
        assert selected.choice.source == source and not selected.tuning
        assert autotune.current().jobs == [] and fake.jobs == []
    autotune.autotune("off", 5, tuner=FakeTuner())
    tuned = select(_call(TUNED))  # even a shape tuned exactly gets the default
    assert tuned.choice.source == "default"


def test_on_first_call_schedules_once_per_untuned_shape(db_url: str, tmp_path: Path) -> None:
    fake = FakeTuner(write=False)
    fake.release.clear()  # jobs wait: every call below happens while one is in flight
    tuner = autotune.autotune("on_first_call", budget_s=7, tuner=fake)
    other = Shape(1, 8192, 2, 32, 8)
    threads = [
        threading.Thread(target=select, args=(_call(shape),))
        for shape in (UNTUNED, other) * 8
    ]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    tuned = select(_call(TUNED))  # measured at exactly this shape: nothing to tune
    assert tuned.choice.source == "exact" and not tuned.tuning
    assert select(_call(UNTUNED, device=1)).tuning  # another device is another job
    fake.release.set()
    assert tuner.wait(10)
    jobs = sorted(tuner.jobs, key=lambda j: (j.device, j.problem.n))
    assert [(j.device, j.problem.n, j.problem.n_keys) for j in jobs] == [
        (0, 1, 8192), (0, 1000, 1000), (1, 1000, 1000),
    ]  # fmt: skip
    assert len(fake.jobs) == 3
    job = jobs[1]
    assert (job.budget_s, job.db_url, job.cache_dir) == (7.0, db_url, tmp_path / "build")
    assert job.problem == _call(UNTUNED).problem()
    # Once per shape and process: a new setting does not start the same shape again.
    again = autotune.autotune("on_first_call", budget_s=7, tuner=fake)
    assert not select(_call(UNTUNED)).tuning
    assert again.wait(1) and len(fake.jobs) == 3


def test_served_choice_changes_after_the_job_writes(db_url: str) -> None:
    fake = FakeTuner()
    tuner = autotune.autotune("on_first_call", budget_s=5, tuner=fake)
    forgotten: list[object] = []
    autotune.add_listener(lambda job: forgotten.append(job_tag(job)))
    first = select(_call(UNTUNED))
    # Served at once by the nearest tuned shape while the job runs.
    assert first.tuning and first.choice.source == "nearest" and first.choice.config == WINNER
    assert "tuning it in the background" in first.describe(_call(UNTUNED))
    assert tuner.wait(10)
    assert forgotten == [_call(UNTUNED).tag]  # the op forgets exactly this shape's decision
    after = select(_call(UNTUNED))
    assert after.choice.source == "exact" and not after.tuning
    assert after.choice.measured == UNTUNED


def test_untuned_gpu_is_served_by_the_default_while_tuning(db_url: str) -> None:
    fake = FakeTuner(write=False)
    autotune.autotune("on_first_call", budget_s=5, tuner=fake)
    call = Call(
        device=0, gpu="NVIDIA A100-SXM4-80GB", sm_count=108, compute_capability="8.0",
        shape=UNTUNED, dtype="fp16", causal=True, d=128,
    )  # fmt: skip
    selected = select(call)
    assert selected.tuning
    assert selected.choice.config == fa2_default_config(128, "fp16", True)
    assert autotune.current().wait(10)


def test_a_failed_job_is_recorded_and_the_next_runs(db_url: str) -> None:
    fake = FakeTuner(fail=True)
    tuner = autotune.autotune("on_first_call", budget_s=5, tuner=fake)
    seen: list[TuneJob] = []
    autotune.add_listener(seen.append)
    select(_call(UNTUNED))
    assert tuner.wait(10)
    assert "no GPU worker" in tuner.failed[(0, _call(UNTUNED).problem())]
    fake.fail = False
    select(_call(Shape(2000, 2000, 2, 16, 16)))
    assert tuner.wait(10)
    assert len(fake.jobs) == 2 and len(tuner.failed) == 1
    assert [job.problem.n for job in seen[-2:]] == [1000, 2000]


def test_campaign_command_is_fa2tune_tune(monkeypatch: pytest.MonkeyPatch) -> None:
    problem = Problem(gpu=GPU, d=128, n=1, nk=8192, batch=4, heads=32, kv_heads=8,
                      dtype="bf16", causal=True)  # fmt: skip
    job = TuneJob(problem, 1, 29.5, "sqlite:////tmp/x.db", Path("/tmp/cache"))
    argv = campaign_command(job, python="py")
    assert argv[:3] == ["py", "-m", "fa2tune.cli"]
    # The real CLI takes it: `tune` gets the one problem, the budget, device and target.
    seen: dict[str, Any] = {}

    class Stop(Exception):
        pass

    def fake_tune_gpu(targets: Any, options: Any, arch: Any, device: int, job_timeout: float,
                      target_ms: float) -> None:  # fmt: skip
        seen.update(targets=targets, options=options, device=device, target_ms=target_ms)
        raise Stop

    monkeypatch.setattr(campaign_run, "tune_gpu", fake_tune_gpu)
    saved = dict(settings_module._overrides)
    try:
        result = CliRunner().invoke(app, argv[3:])
        assert settings_module.get_settings().db_url == "sqlite:////tmp/x.db"
        assert settings_module.get_settings().cache_dir == Path("/tmp/cache")
    finally:
        settings_module._overrides.clear()
        settings_module._overrides.update(saved)
    assert isinstance(result.exception, Stop), result.output
    problems = make_problems(GPU, seen["targets"])
    assert problems == [problem]
    assert seen["options"].time_budget_s == 30.0 and seen["options"].trials is None
    assert (seen["device"], seen["target_ms"]) == (1, autotune.FIRST_USE_TARGET_MS)


def _job(tmp_path: Path, budget_s: float = 5) -> TuneJob:
    return TuneJob(_call(UNTUNED).problem(), 0, budget_s, f"sqlite:///{tmp_path}/x.db", tmp_path)


def test_campaign_process_outcomes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    def script(code: str) -> None:
        monkeypatch.setattr(autotune, "campaign_command", lambda job: [sys.executable, "-c", code])

    logs = lambda: sorted(Path(tempfile.gettempdir()).glob("fa2tune-autotune-*_d128_n1000_*"))  # noqa: E731
    before = set(logs())
    script("print('tuned')")
    autotune.run_campaign_process(_job(tmp_path))
    assert set(logs()) == before  # a successful campaign's log is removed
    script("import sys; print('no GPU worker on device 0'); sys.exit(3)")
    with pytest.raises(RuntimeError, match="exited with 3") as info:
        autotune.run_campaign_process(_job(tmp_path))
    assert "no GPU worker on device 0" in str(info.value)
    kept = set(logs()) - before
    assert len(kept) == 1 and str(next(iter(kept))) in str(info.value)
    monkeypatch.setattr(autotune, "GRACE_S", 0.5)
    script("import time; time.sleep(30)")
    with pytest.raises(RuntimeError, match="ran past"):
        autotune.run_campaign_process(_job(tmp_path, budget_s=0.5))
    for path in set(logs()) - before:
        path.unlink()
