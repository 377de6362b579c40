"""bench/compare_samplers.py on a synthetic exhaustive table."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from test_replay_synthetic import (
    GPU,
    open_store,
    optuna_url,
    problems_for,
    save_replay_table,
    synthetic_table,
    tiny_space,
)

from tuner.campaign import run_campaign
from tuner.replay import ReplayMeasure

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "compare_samplers.py"


def _load() -> object:
    spec = importlib.util.spec_from_file_location("compare_samplers", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["compare_samplers"] = module  # so worker processes can unpickle run_one
    spec.loader.exec_module(module)
    return module


def test_compare_samplers_prints_trials_to_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cmp = _load()
    problems = problems_for([512])
    path = tmp_path / "table.json"
    save_replay_table(synthetic_table(problems, tiny_space), path)
    code = cmp.main(  # type: ignore[attr-defined]
        [str(path), "--seeds", "2", "--max-trials", "12", "--jobs", "2"]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert problems[0].study_name[:20] in out
    assert "tpe" in out and "random" in out and "/2)" in out


def test_run_one_counts_gpu_trials(tmp_path: Path) -> None:
    cmp = _load()
    problems = problems_for([512])
    table = synthetic_table(problems, tiny_space)
    path = tmp_path / "table.json"
    save_replay_table(table, path)
    gpu_configs = sum(
        e.status not in ("SPILLS", "COMPILE_FAILED")
        for e in table.studies[problems[0].study_name].values()
    )
    # A budget of every GPU config: the target is always reached, the best always found.
    result = cmp.run_one(  # type: ignore[attr-defined]
        str(path), problems[0].study_name, "random", 0, gpu_configs, 0.02, True
    )
    assert result.to_target is not None and 1 <= result.to_target <= gpu_configs
    assert result.gpu_trials == gpu_configs
    assert result.best_gap == 0.0


def test_export_from_db_then_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cmp = _load()
    problems = problems_for([1024])
    replay = ReplayMeasure(synthetic_table(problems, tiny_space))
    with open_store(tmp_path) as store:
        run_campaign(
            problems,
            store=store,
            storage_url=optuna_url(tmp_path),
            gpu=GPU,
            space_fn=replay.space,
            seeds_fn=lambda p: [],
            build_fn=replay.build,
            measure_fn=replay,
            sampler="grid",
        )
    out_path = tmp_path / "exported.json"
    db = f"sqlite:///{tmp_path / 'results.db'}"
    args = [str(out_path), "--from-db", db, "--gpu", GPU.name, "--seeds", "1",
            "--max-trials", "5", "--samplers", "tpe", "--jobs", "1"]  # fmt: skip
    assert cmp.main(args) == 0  # type: ignore[attr-defined]
    assert out_path.exists()
    assert "tpe" in capsys.readouterr().out
