"""Cache problems tuned on a length mix (``kv_lengths``, core.kv_lengths) in what is tuned:
workload entries (``kv_lengths:`` beside ``kv_page:``), ``fa2tune tune --kv-lengths``, the
problem label, warm starts across the two patterns, and a replayed campaign through the real
CLI that tunes the mixed problem of a table (study names ending in ``_mix``), stores it as
its own problem and warm-starts from the dump."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
import typer
from typer.testing import CliRunner

from codegen.families.splitkv.space import enumerate_cache_space
from core.problem import Problem
from core.shape import Shape
from core.splitkv_config import SplitKvConfig
from db.store import Store
from db.transfer import dump
from fa2tune.cli import app
from tests.support.replay import GPU
from tuner.campaign_plan import ShapeOptions, campaign_targets, replay_filter
from tuner.progress import problem_label
from tuner.replay_table import export_replay_table
from tuner.warm_start import WarmStart, load_warm_start, shape_key
from tuner.workload import WorkloadError, load_workload

optuna.logging.set_verbosity(optuna.logging.WARNING)
DECODE = {"d": 128, "heads": 32, "kv_heads": 8, "nq": 1, "nk": 32768, "batch": 32,
          "dtype": "bf16"}  # fmt: skip
FULL = Problem(gpu=GPU.name, d=128, n=1, nk=32768, batch=32, heads=32, kv_heads=8,
               dtype="bf16", kv_page=16)  # fmt: skip
MIXED = replace(FULL, kv_lengths="mixed")


def _workload(tmp_path: Path, *entries: dict[str, object]) -> Path:
    path = tmp_path / "w.json"
    path.write_text(json.dumps(list(entries)))
    return path


def test_workload_entries_take_a_length_pattern(tmp_path: Path) -> None:
    path = _workload(tmp_path, {**DECODE, "kv_page": 16, "kv_lengths": "mixed"},
                     {**DECODE, "kv_page": [0, 16], "kv_lengths": ["full", "mixed"]},
                     {**DECODE, "kv_page": 16})  # fmt: skip
    targets = load_workload(path).targets
    # The second entry's (16, mixed) is the first's problem and the third's its (16, full).
    assert [(t.kv_page, t.kv_lengths) for t in targets] == [
        (16, "mixed"), (0, "full"), (0, "mixed"), (16, "full")]  # fmt: skip
    problem = targets[0].problem("H200")
    assert problem == replace(MIXED, gpu="H200") and problem.study_name.endswith("_kvc_pg16_mix")
    assert targets[0].matches(problem) and not targets[3].matches(problem)
    assert "lengths mixed" in targets[0].describe()
    assert "lengths mixed" not in targets[3].describe()


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({**DECODE, "kv_lengths": "mixed"}, "field 'kv_lengths': .*needs kv_page"),
        ({**DECODE, "kv_lengths": "full"}, "field 'kv_lengths': .*needs kv_page"),
        ({**DECODE, "kv_page": 16, "kv_lengths": "ragged"}, "field 'kv_lengths'"),
        ({**DECODE, "kv_page": 16, "kv_lengths": []}, "field 'kv_lengths': must not be an empty"),
        ({**DECODE, "kv_page": 16, "kv_lengths": 1}, "field 'kv_lengths'"),
        ({"d": 128, "heads": 32, "seqlens": [10, 20], "kv_lengths": "mixed"}, "needs kv_page"),
    ],
)
def test_bad_length_pattern_entries_are_one_line(
    tmp_path: Path, entry: dict[str, object], message: str
) -> None:
    with pytest.raises(WorkloadError, match=message) as info:
        load_workload(_workload(tmp_path, entry))
    assert "\n" not in str(info.value) and "entry 1" in str(info.value)


def test_tune_options_give_the_grid_its_length_patterns() -> None:
    grid = {"d": "128", "nq": "1", "nk": "32768", "batch": "32", "heads": "32",
            "kv_heads": "8", "dtype": "bf16", "causal": "no"}  # fmt: skip
    mixed = campaign_targets(ShapeOptions(**grid, kv_page="0,16", kv_lengths="mixed"))
    assert [(t.kv_page, t.kv_lengths) for t in mixed] == [(0, "mixed"), (16, "mixed")]
    names = [t.problem(GPU.name).study_name for t in mixed]
    assert all(n.endswith("_mix") for n in names) and len(set(names)) == 2
    both = campaign_targets(ShapeOptions(**grid, kv_page="16", kv_lengths="both"))
    assert [t.kv_lengths for t in both] == ["full", "mixed"]
    plain = campaign_targets(ShapeOptions(**grid, kv_page="16"))
    assert [t.kv_lengths for t in plain] == ["full"]


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (ShapeOptions(d="128", nq="1", kv_lengths="mixed"), "needs --kv-page"),
        (ShapeOptions(d="128", nq="1", kv_page="16", kv_lengths="ragged"), "not one of"),
        (ShapeOptions(d="128", nq="1", kv_page="16", kv_lengths=""), "comma-separated"),
        (ShapeOptions(workloads=(Path("w.yaml"),), kv_lengths="mixed"), "the file sets"),
    ],
)
def test_bad_tune_length_options(options: ShapeOptions, words: str) -> None:
    with pytest.raises(typer.BadParameter) as info:
        campaign_targets(options)
    assert "--kv-lengths" in str(info.value.param_hint) and words in str(info.value)


def test_the_cli_refuses_kv_lengths_without_a_layout() -> None:
    result = CliRunner().invoke(app, ["tune", "--d", "128", "--nq", "1", "--kv-lengths", "mixed"])
    assert result.exit_code == 2 and "--kv-lengths" in result.output


def test_replay_filter_keeps_the_asked_patterns() -> None:
    dense = replace(FULL, kv_page=None)
    problems = [dense, FULL, MIXED, replace(MIXED, kv_page=0)]
    assert [replay_filter(ShapeOptions(kv_lengths="mixed"))(p) for p in problems] == [
        False, False, True, True]  # fmt: skip
    keep = replay_filter(ShapeOptions(kv_page="16", kv_lengths="mixed"))
    assert [keep(p) for p in problems] == [False, False, True, False]
    assert all(replay_filter(ShapeOptions())(p) for p in problems)


def test_the_label_names_the_pattern() -> None:
    assert problem_label(MIXED) == "d128 n1 nk32768 bf16 full b32 h32:8 pg16 mix"
    assert problem_label(FULL) == "d128 n1 nk32768 bf16 full b32 h32:8 pg16"


def test_a_cache_problem_warms_from_its_pattern_then_the_other_then_the_dense() -> None:
    dense = replace(FULL, kv_page=None)
    one, two, three = (SplitKvConfig(128, "bf16", False, splits=s, kvcache=True, page=16)
                       for s in (1, 8, 32))  # fmt: skip
    dense_pick = SplitKvConfig(128, "bf16", False, splits=4)
    warm = WarmStart("test", {shape_key(FULL): (one, two), shape_key(MIXED): (three, two),
                              shape_key(dense): (dense_pick,)})  # fmt: skip
    assert shape_key(FULL) != shape_key(MIXED)
    twin = replace(dense_pick, kvcache=True, page=16)
    assert warm.configs_for(MIXED) == (three, two, one, twin)
    assert warm.configs_for(FULL) == (one, two, three, twin)
    # Another layout's winners are other kernels: only the dense twins reach it.
    assert warm.configs_for(replace(MIXED, kv_page=0)) == (replace(dense_pick, kvcache=True,
                                                                   page=0),)  # fmt: skip


def _cache_time(c: SplitKvConfig, mixed: bool) -> float:
    """Milliseconds: full lengths best at 1 split, mixed ones at 16 (the miss the pattern
    is for), over the capacity on mixed lengths and over the length on full ones, 4 warps
    and 2 stages best either way."""
    best = 16 if mixed else 1
    span = (0.9 if mixed else 1.02) if c.cap_split else 1.0
    return 0.05 * span * (1 + 0.2 * abs(math.log2(c.splits / best))) * (
        1 + 0.1 * abs(math.log2(c.warps / 4))) * (1.0 if c.stages == 2 else 1.05)  # fmt: skip


def test_a_replayed_campaign_tunes_the_mixed_problem_as_its_own(tmp_path: Path) -> None:
    configs = [c for c in enumerate_cache_space(128, "bf16", False, 16)
               if c.rows == 16 and c.block_n == 32]  # fmt: skip
    table = tmp_path / "table.json"
    table.write_text(json.dumps({
        "format": "fa2tune-replay/1",
        "gpu": GPU.to_dict(),
        "arch": "sm_90",
        "problems": {
            p.study_name: {"problem": p.to_dict(), "configs": {
                c.name: {"status": "OK", "median_ms": _cache_time(c, p is MIXED),
                         "build_status": "OK"} for c in configs}}
            for p in (FULL, MIXED)
        },
    }))  # fmt: skip
    url = f"sqlite:///{tmp_path / 'results.db'}"
    summary = tmp_path / "summary.json"
    args = ["--db", url, "tune", "--replay", str(table), "--kv-lengths", "mixed", "--sampler",
            "grid", "--summary-json", str(summary)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (row,) = json.loads(summary.read_text())["problems"]
    assert row["study_name"].endswith("_kvc_pg16_mix") and row["problem"]["kv_lengths"] == "mixed"
    fastest = min(configs, key=lambda c: _cache_time(c, True))
    assert row["best_config"] == fastest.name and fastest.splits == 16 and fastest.cap_split
    with Store.from_url(url) as store:
        shape = Shape(1, 32768, 32, 32, 8)
        hit = store.best_for_shape(GPU.name, 128, "bf16", False, shape, kv_page=16,
                                   kv_lengths="mixed")  # fmt: skip
        assert hit is not None and hit.config.name == fastest.name
        # The full-length problem was not tuned: nothing answers for it.
        assert store.best_for_shape(GPU.name, 128, "bf16", False, shape, kv_page=16) is None
        assert {r.kv_lengths for r in store.results(limit=1000).items} == {"mixed"}
        # A table exported from the store replays the same problem.
        exported = export_replay_table(store, GPU.name)["problems"]
        assert isinstance(exported, dict) and list(exported) == [MIXED.study_name]
        assert Problem.from_dict(exported[MIXED.study_name]["problem"]) == MIXED
        dump(store, tmp_path / "results.json")
    # The dump warms the mixed problem first from its own winners, the full one from them too.
    warm = load_warm_start(tmp_path / "results.json", top=2)
    assert warm.configs_for(MIXED)[0].name == fastest.name
    assert warm.configs_for(FULL) == warm.configs_for(MIXED)
