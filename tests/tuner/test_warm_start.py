"""Warm starts (tuner.warm_start, ``fa2tune tune --warm-start``): a results file's fastest
verified configs per problem, measured first by new studies."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from core.fa2_config import Fa2Config
from db.dump_format import TransferError
from db.models import Build, Measurement
from db.models import Problem as ProblemRow
from db.session import session_scope
from db.transfer import dump
from fa2tune.cli import app
from tests.support.replay import open_store, optuna_url, problems_for, synthetic_table, tiny_space
from tuner.campaign import CampaignOptions
from tuner.replay import run_replay_campaign
from tuner.warm_start import WarmStart, load_warm_start, shape_key, with_warm_start

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _campaign(tmp_path: Path, ns: list[int], trials: int, warm: WarmStart | None) -> None:
    problems = problems_for(ns)
    with open_store(tmp_path) as store:
        run_replay_campaign(
            synthetic_table(problems, tiny_space),
            CampaignOptions(sampler="tpe", trials=trials, warm_start=warm),
            store=store,
            storage_url=optuna_url(tmp_path),
            problems=problems,
        )


def _rows(tmp_path: Path) -> list[tuple[int, int | None, str, str, float | None]]:
    """(n, trial number, config, status, median) of every measurement."""
    with open_store(tmp_path) as store, session_scope(store.engine) as s:
        q = (
            s.query(
                ProblemRow.n, Measurement.trial_number, Build.config_name, Measurement.status,
                Measurement.median_ms,
            )
            .join(Build, Build.id == Measurement.build_id)
            .join(ProblemRow, ProblemRow.id == Measurement.problem_id)
        )  # fmt: skip
        return [tuple(r) for r in q]  # type: ignore[misc]


def test_load_takes_the_fastest_verified_configs_in_order(tmp_path: Path) -> None:
    _campaign(tmp_path, [512, 1024], trials=12, warm=None)
    with open_store(tmp_path) as store:
        dump(store, tmp_path / "results.json")
    rows = _rows(tmp_path)
    warm = load_warm_start(tmp_path / "results.json", top=3)
    for p in problems_for([512, 1024]):
        ok = sorted((ms, name) for n, _, name, st, ms in rows if n == p.n and st == "OK")
        assert any(st == "WRONG_RESULT" for n, _, _, st, _ in rows if n == p.n)  # excluded
        assert [c.name for c in warm.configs_for(p)] == [name for _, name in ok[:3]]
    other = problems_for([2048])[0]
    assert warm.configs_for(other) == ()


def test_new_studies_measure_the_warm_configs_first(tmp_path: Path) -> None:
    _, p1024 = problems_for([512, 1024])
    space = [c for c in tiny_space() if c.rows_per_warp == 16]
    first, second = space[-1], space[0]
    warm = WarmStart("test", {shape_key(p1024): (first, second)})
    _campaign(tmp_path, [512, 1024], trials=4, warm=warm)
    rows = sorted(r for r in _rows(tmp_path) if r[0] == 1024 and r[1] is not None)
    assert [r[2] for r in rows[:2]] == [first.name, second.name]
    cold = sorted(r for r in _rows(tmp_path) if r[0] == 512 and r[1] is not None)
    assert {first.name, second.name} != {r[2] for r in cold[:2]}


def test_other_dtype_warms_a_problem_from_the_other_types_winners(tmp_path: Path) -> None:
    _campaign(tmp_path, [512], trials=12, warm=None)  # fp16 only
    with open_store(tmp_path) as store:
        dump(store, tmp_path / "results.json")
    (fp16,) = problems_for([512])
    bf16 = replace(fp16, dtype="bf16")
    plain = load_warm_start(tmp_path / "results.json", top=3)
    crossed = load_warm_start(tmp_path / "results.json", top=3, other_dtype=True)
    assert plain.configs_for(bf16) == ()
    assert crossed.configs_for(fp16) == plain.configs_for(fp16)  # its own, unchanged
    typed = crossed.configs_for(bf16)
    assert [c.name for c in typed] == [
        c.name.replace("_fp16_", "_bf16_") for c in plain.configs_for(fp16)
    ]
    assert len(typed) == 3 and all(c.dtype == "bf16" for c in typed)


def test_other_dtype_comes_after_a_problems_own_winners() -> None:
    from tuner.warm_start import _with_other_dtype

    (fp16,) = problems_for([1024])
    bf16 = replace(fp16, dtype="bf16")
    a, b, c = (replace(x, dtype="fp16") for x in tiny_space()[:3])
    own_bf16 = replace(c, dtype="bf16")
    chosen = {shape_key(fp16): (a, b, c), shape_key(bf16): (own_bf16,)}
    out = _with_other_dtype(chosen, top=3)
    assert out[shape_key(bf16)] == (own_bf16, replace(a, dtype="bf16"), replace(b, dtype="bf16"))
    assert out[shape_key(fp16)] == (a, b, c)  # already full: its own only


def test_cli_other_dtype_needs_a_warm_start_file() -> None:
    result = CliRunner().invoke(app, ["tune", "--warm-start-other-dtype"])
    assert result.exit_code == 2 and "--warm-start" in result.output


def test_warm_configs_then_seeds_without_repeats() -> None:
    (p,) = problems_for([1024])
    a, b, c = tiny_space()[:3]
    warm = WarmStart("test", {shape_key(p): (b, a)})
    assert with_warm_start(warm, [a, c], p) == [b, a, c]
    assert with_warm_start(None, [a, c], p) == [a, c]


def test_bad_files_and_top(tmp_path: Path) -> None:
    with pytest.raises(TransferError):
        load_warm_start(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    with pytest.raises(TransferError):
        load_warm_start(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="at least 1"):
        load_warm_start(tmp_path / "bad.json", top=0)


def test_cli_refuses_a_bad_warm_start_file_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("[]", encoding="utf-8")
    result = CliRunner().invoke(app, ["tune", "--warm-start", str(tmp_path / "bad.json")])
    assert result.exit_code == 2
    assert "--warm-start" in result.output and "Traceback" not in result.output


def test_shipped_results_warm_start(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    warm = load_warm_start(root / "db" / "data" / "h200_results.json", top=5)
    assert len(warm.configs) == 48
    assert all(1 <= len(v) <= 5 for v in warm.configs.values())
    assert all(isinstance(c, Fa2Config) for v in warm.configs.values() for c in v)


def test_a_cache_problem_starts_from_its_own_then_the_dense_shapes_winners() -> None:
    from core.fa3_config import Fa3Config
    from core.problem import Problem
    from core.splitkv_config import SplitKvConfig

    dense = Problem(gpu="", d=128, n=2048, nk=34816, batch=1, heads=32, kv_heads=8,
                    dtype="bf16", causal=True)  # fmt: skip
    cache = replace(dense, kv_page=256)
    fa3_lf = Fa3Config(128, "bf16", True, longest_first=True)
    fa3_tile = Fa3Config(128, "bf16", True, block_n=64)
    fa2 = tiny_space()[0]  # a family without cache kernels: no twin
    own = SplitKvConfig(128, "bf16", True, kvcache=True, page=256)
    warm = WarmStart("test", {shape_key(dense): (fa3_lf, fa2, fa3_tile),
                              shape_key(cache): (own,)})  # fmt: skip
    twin = replace(fa3_lf, longest_first=False, kvcache=True, page=256)
    assert warm.configs_for(cache) == (own, twin, replace(fa3_tile, kvcache=True, page=256))
    assert warm.configs_for(dense) == (fa3_lf, fa2, fa3_tile)  # a dense problem: its own
    # Another layout has no winners of its own: the dense ones' twins of that layout.
    contiguous = warm.configs_for(replace(dense, kv_page=0))
    assert [c.name for c in contiguous] == [twin.name.removesuffix("_pg256"),
                                            fa3_tile.name + "_kvc"]  # fmt: skip
