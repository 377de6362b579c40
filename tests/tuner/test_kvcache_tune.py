"""KV-cache problems in what is tuned: workload entries (``kv_page:``), ``fa2tune tune
--kv-page``, the campaign's default space (the split-KV cache twins only) and a replayed
campaign of a cache problem through the real CLI, whose winner answers cache lookups only."""

from __future__ import annotations

import json
import math
from pathlib import Path

import optuna
import pytest
import typer
from typer.testing import CliRunner

from codegen.families.splitkv.space import enumerate_cache_space, enumerate_space
from core.problem import Problem
from core.shape import Shape
from core.splitkv_config import SplitKvConfig
from db.store import Store
from fa2tune.cli import app
from tests.support.replay import GPU
from tuner.campaign import _defaults
from tuner.campaign_plan import ShapeOptions, campaign_targets, replay_filter
from tuner.workload import WorkloadError, load_workload

optuna.logging.set_verbosity(optuna.logging.WARNING)
DECODE = {"d": 128, "heads": 32, "kv_heads": 8, "nq": 1, "nk": 8192, "batch": 8}


def _workload(tmp_path: Path, *entries: dict[str, object]) -> Path:
    path = tmp_path / "w.json"
    path.write_text(json.dumps(list(entries)))
    return path


def test_workload_entries_take_a_layout(tmp_path: Path) -> None:
    path = _workload(tmp_path, {**DECODE, "kv_page": 16}, {**DECODE, "kv_page": [0, 16, 64]},
                     DECODE)  # fmt: skip
    targets = load_workload(path).targets
    # The second entry's 16 is the first's problem, tuned once; the third entry is dense.
    assert [t.kv_page for t in targets] == [16, 0, 64, None]
    problem = targets[0].problem("H200")
    assert problem.kv_page == 16 and problem.study_name.endswith("_kvc_pg16")
    assert targets[0].matches(problem) and not targets[3].matches(problem)
    assert "16-token pages" in targets[0].describe()


def test_the_serving_workload_asks_every_layout_of_its_calls() -> None:
    """examples/workloads/llama3_8b_serving.yaml: decode at batch 1-128 and chunked prefill
    over a cached prefix, each over pages of 16 and of 256 tokens, with every sequence full;
    decode at batch 8-128 on mixed lengths, contiguous too."""
    root = Path(__file__).resolve().parents[2]
    targets = load_workload(root / "examples" / "workloads" / "llama3_8b_serving.yaml").targets
    every = [t.problem("NVIDIA H200") for t in targets]
    assert len(every) == 69 and len({p.study_name for p in every}) == 69
    mixed = [p for p in every if p.kv_lengths == "mixed"]
    assert len(mixed) == 15 and {p.kv_page for p in mixed} == {0, 16, 256}
    assert all(p.n == 1 and p.batch > 1 for p in mixed)
    problems = [p for p in every if p.kv_lengths == "full"]
    assert {p.kv_page for p in problems} == {16, 256}
    decode = [p for p in problems if p.n == 1]
    prefill = [p for p in problems if p.n == 2048]
    assert len(decode) == 38 and len(prefill) == 16
    assert all(not p.causal for p in decode)
    assert max(p.batch * p.n_keys for p in decode) == 32 * 131072  # b128 stops at 32k
    assert {p.n_keys for p in prefill} == {2048, 4096, 10240, 34816}
    assert all(p.causal for p in prefill)
    assert {(p.heads, p.n_kv_heads, p.d, p.dtype) for p in problems} == {(32, 8, 128, "bf16")}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({**DECODE, "kv_page": 3}, "field 'kv_page'"),
        ({**DECODE, "kv_page": -1}, "field 'kv_page'"),
        ({**DECODE, "kv_page": 8192}, "field 'kv_page'"),
        ({**DECODE, "kv_page": "16"}, "field 'kv_page'"),
        ({**DECODE, "kv_page": []}, "field 'kv_page'"),
        ({"d": 128, "heads": 32, "seqlens": [10, 20], "kv_page": 16}, "not with seqlens"),
    ],
)
def test_bad_layout_entries_are_one_line(
    tmp_path: Path, entry: dict[str, object], message: str
) -> None:
    with pytest.raises(WorkloadError, match=message) as info:
        load_workload(_workload(tmp_path, entry))
    assert "\n" not in str(info.value) and "entry 1" in str(info.value)


def test_tune_options_give_the_grid_its_layouts() -> None:
    options = ShapeOptions(d="128", nq="1", nk="8192", batch="8", heads="32", kv_heads="8",
                           kv_page="0,16")  # fmt: skip
    targets = campaign_targets(options)
    assert [t.kv_page for t in targets] == [0, 16, 0, 16]  # two masks (the default) x two
    (dense,) = {t.kv_page for t in campaign_targets(ShapeOptions(d="128", n="512"))}
    assert dense is None


@pytest.mark.parametrize(
    ("options", "hint"),
    [
        (ShapeOptions(d="128", nq="1", kv_page="3"), "--kv-page"),
        (ShapeOptions(d="128", nq="1", kv_page="x"), "--kv-page"),
        (ShapeOptions(d="128", nq="1", kv_page="-16"), "--kv-page"),
        (ShapeOptions(workloads=(Path("w.yaml"),), kv_page="16"), "--kv-page"),
    ],
)
def test_bad_tune_layout_options(options: ShapeOptions, hint: str) -> None:
    with pytest.raises(typer.BadParameter) as info:
        campaign_targets(options)
    assert hint in str(info.value.param_hint)


def test_replay_filter_keeps_the_asked_layouts() -> None:
    base = Problem(gpu="g", d=128, n=1, nk=8192, batch=8, heads=32, kv_heads=8)
    problems = [base, *(Problem(**{**base.to_dict(), "kv_page": p}) for p in (0, 16))]  # type: ignore[arg-type]
    keep = replay_filter(ShapeOptions(kv_page="16"))
    assert [keep(p) for p in problems] == [False, False, True]
    keep_all = replay_filter(ShapeOptions())
    assert all(keep_all(p) for p in problems)


def test_default_space_of_a_cache_problem_is_the_split_kv_twins() -> None:
    space_fn, seeds_fn, _ = _defaults("sm_90", GPU, None, None, None)
    cache = Problem(gpu=GPU.name, d=128, n=1, nk=8192, batch=8, heads=32, kv_heads=8,
                    dtype="bf16", kv_page=16)  # fmt: skip
    configs = list(space_fn(cache))
    assert configs == enumerate_cache_space(128, "bf16", False, 16, GPU.smem_optin_bytes)
    # Each tile twice: its splits over the sequence's length and over the capacity.
    assert len(configs) == 2 * len(enumerate_space(128, "bf16", False, GPU.smem_optin_bytes))
    seeds = list(seeds_fn(cache))
    assert seeds and all(c.name.endswith("_kvc_pg16") for c in seeds)
    # A mix seeds both spans of each seed tile.
    mixed = list(seeds_fn(Problem(**{**cache.to_dict(), "kv_lengths": "mixed"})))  # type: ignore[arg-type]
    assert [c.name for c in mixed[::2]] == [c.name for c in seeds]
    assert [c.name for c in mixed[1::2]] == [c.name + "_cs" for c in seeds]
    # Also on a shape split-KV's serves() leaves to the split-Q families: no other kernel
    # reads a cache.
    wide = Problem(gpu=GPU.name, d=128, n=16, nk=8192, batch=8, heads=64, kv_heads=1,
                   kv_page=0)  # fmt: skip
    assert all(isinstance(c, SplitKvConfig) and c.kvcache and c.page == 0
               for c in space_fn(wide))  # fmt: skip
    assert space_fn(wide)
    # Only fa2: nothing to search for a cache problem.
    fa2_space, _, _ = _defaults("sm_90", GPU, None, None, None, only=("fa2",))
    assert list(fa2_space(cache)) == []


def _cache_time(c: SplitKvConfig) -> float:
    """Milliseconds: best at 32 splits, 4 warps, 2 stages, length splits (a smooth,
    learnable shape)."""
    return 0.02 * (1 + 0.2 * abs(math.log2(c.splits / 32))) * (1 + 0.1 * abs(
        math.log2(c.warps / 4))) * (1.0 if c.stages == 2 else 1.05) * (
        1.02 if c.cap_split else 1.0)  # fmt: skip


def test_a_replayed_cache_campaign_answers_cache_lookups_only(tmp_path: Path) -> None:
    problem = Problem(gpu=GPU.name, d=128, n=1, nk=8192, batch=8, heads=32, kv_heads=8,
                      dtype="bf16", kv_page=16)  # fmt: skip
    configs = [c for c in enumerate_cache_space(128, "bf16", False, 16)
               if c.rows == 16 and c.block_n == 32]  # fmt: skip
    entries = {c.name: {"status": "OK", "median_ms": _cache_time(c), "build_status": "OK"}
               for c in configs}  # fmt: skip
    wrong = configs[0].name
    entries[wrong] = {"status": "WRONG_RESULT", "build_status": "OK"}  # failures are data
    table = tmp_path / "table.json"
    table.write_text(json.dumps({
        "format": "fa2tune-replay/1",
        "gpu": GPU.to_dict(),
        "arch": "sm_90",
        "problems": {problem.study_name: {"problem": problem.to_dict(), "configs": entries}},
    }))  # fmt: skip
    url = f"sqlite:///{tmp_path / 'results.db'}"
    summary = tmp_path / "summary.json"
    args = ["--db", url, "tune", "--replay", str(table), "--kv-page", "16", "--sampler", "grid",
            "--summary-json", str(summary)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (row,) = json.loads(summary.read_text())["problems"]
    fastest = min((e["median_ms"], n) for n, e in entries.items() if e["status"] == "OK")
    assert (row["best_config"], row["best_ms"]) == (fastest[1], fastest[0])
    with Store.from_url(url) as store:
        shape = Shape(1, 8192, 8, 32, 8)
        hit = store.best_for_shape(GPU.name, 128, "bf16", False, shape, kv_page=16)
        assert hit is not None and hit.config.name == fastest[1] and hit.kv_page == 16
        assert store.best_for_shape(GPU.name, 128, "bf16", False, shape) is None
        assert store.best_for_shape(GPU.name, 128, "bf16", False, shape, kv_page=0) is None
        statuses = {r.config_name: r.status for r in store.results(limit=1000).items}
        assert statuses[wrong] == "WRONG_RESULT"
    # Without --kv-page the table's cache problem is still the campaign (every layout kept);
    # asking for another layout selects nothing.
    other = CliRunner().invoke(app, ["--db", url, "tune", "--replay", str(table), "--kv-page",
                                     "0"])  # fmt: skip
    assert other.exit_code == 2 and "no problem of the table" in other.output


def test_a_chunked_prefill_cache_problem_also_searches_the_hopper_twins() -> None:
    space_fn, seeds_fn, _ = _defaults("sm_90", GPU, None, None, None)
    chunk = Problem(gpu=GPU.name, d=128, n=2048, nk=34816, batch=1, heads=32, kv_heads=8,
                    dtype="bf16", causal=True, kv_page=256)  # fmt: skip
    configs = list(space_fn(chunk))
    families = {c.family for c in configs}
    assert families == {"splitkv", "fa3"}
    fa3 = [c for c in configs if c.family == "fa3"]
    assert all(c.kvcache and c.page == 256 and not c.longest_first for c in fa3)
    assert {c.block_n for c in fa3} == {64, 128}  # the tiles a 256-key page holds whole
    assert {c.family for c in seeds_fn(chunk)} == {"splitkv", "fa3"}
