"""The ``tune`` command: argument parsing, errors (exit 2), replay mode end to end."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import pytest
import typer
from typer.testing import CliRunner

from core.config import DTYPES
from core.problem import Problem
from core.shape import Shape
from tests.support.replay import (
    GPU,
    problems_for,
    synthetic_entry,
    synthetic_table,
    tiny_space,
)
from tuner import campaign_run
from tuner.campaign import CampaignOptions
from tuner.campaign_plan import (
    ShapeOptions,
    campaign_targets,
    make_problems,
    parse_shapes,
    replay_filter,
)
from tuner.cli_values import parse_bool_list, parse_choice_list, parse_duration, parse_int_list
from tuner.replay_table import ReplayEntry, ReplayTable, save_replay_table
from tuner.summary import CampaignSummary, TimeSplit
from tuner.tune_cli import DEFAULT_TRIALS, resolve_budget
from tuner.workload import Target

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")


@pytest.fixture
def table_path(tmp_path: Path) -> Path:
    problems = problems_for([512, 1024]) + problems_for([512], causal=True)
    path = tmp_path / "table.json"
    save_replay_table(synthetic_table(problems, tiny_space), path)
    return path


def test_parse_lists() -> None:
    assert parse_int_list("64,128", "--d") == [64, 128]
    assert parse_int_list(" 512 , 1024,512", "--n") == [512, 1024]  # trimmed, deduplicated
    assert parse_choice_list("FP16,bf16", "--dtype", ("fp16", "bf16")) == ["fp16", "bf16"]
    assert parse_bool_list("no,yes", "--causal") == [False, True]
    assert parse_bool_list("causal,full,true", "--causal") == [True, False]
    assert parse_bool_list("both", "--causal") == [False, True]
    assert parse_bool_list("yes,both", "--causal") == [True, False]
    assert parse_choice_list("both", "--dtype", DTYPES, both=True) == ["fp16", "bf16"]
    assert parse_choice_list("BF16,both", "--dtype", DTYPES, both=True) == ["bf16", "fp16"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("600", 600), ("90s", 90), ("10m", 600), ("1h30m", 5400), ("1.5h", 5400), ("2m 30s", 150)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "10x", "m", "-5m", "0", "0s", "10m10m", "1h 2", "ten"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(typer.BadParameter):
        parse_duration(text)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: parse_int_list("64,", "--d"), "comma-separated"),
        (lambda: parse_int_list("64,abc", "--d"), "not an integer"),
        (lambda: parse_int_list("0", "--n"), "below 1"),
        (lambda: parse_int_list("65", "--d", allowed=(64, 128)), "not one of"),
        (lambda: parse_choice_list("fp32", "--dtype", ("fp16", "bf16")), "not one of"),
        (lambda: parse_choice_list("both", "--dtype", ("fp16", "bf16")), "not one of fp16, bf16"),
        (lambda: parse_bool_list("maybe", "--causal"), "yes or no"),
    ],
)
def test_parse_errors(call: object, match: str) -> None:
    with pytest.raises(typer.BadParameter, match=match):
        call()  # type: ignore[operator]


def test_default_campaign_is_24_grouped_problems() -> None:
    problems = make_problems("NVIDIA H200", campaign_targets(ShapeOptions()))
    assert len(problems) == 24
    # The problems (and study names) of the campaign before shapes were options.
    assert problems[0] == Problem(gpu="NVIDIA H200", d=64, n=512, batch=2, heads=16)
    assert problems[0].study_name == "nvidia-h200_d64_n512_b2_h16_fp16_full"
    assert all(p.nk is None and p.kv_heads is None for p in problems)
    groups = [(p.dtype, p.causal, p.d) for p in problems]
    # Each (dtype, causal, D) group is contiguous, so its builds serve it in one go.
    assert len({g for g in groups}) == 4
    assert all(groups[i] == groups[i - 1] or groups[i] not in groups[:i] for i in range(24))


def test_default_budget() -> None:
    assert resolve_budget("tpe", None, None) == (DEFAULT_TRIALS, None)
    assert resolve_budget("random", None, None) == (DEFAULT_TRIALS, None)
    assert resolve_budget("grid", None, None) == (None, None)  # exhaustive
    assert resolve_budget("tpe", None, 600.0) == (None, 600.0)
    assert resolve_budget("tpe", 5, 600.0) == (5, 600.0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--d", "65"], "65 is not a multiple of 8 from 8 to 256"),
        (["--n", "0"], "below 1"),
        (["--n", "1k"], "not an integer"),
        (["--dtype", "fp32"], "not one of"),
        (["--dtype", "both,fp32"], "'fp32' is not one of fp16, bf16 or both"),
        (["--causal", "sometimes"], "yes or no"),
        (["--causal", "no,bothh"], "'bothh' is not yes or no (or both)"),
        (["--time-budget", "10x"], "not a duration"),
        (["--time-budget", "0"], "positive"),
        (["--sampler", "bayes"], "not one of tpe"),
        (["--trials", "0"], "--trials"),
        (["--arch", "sm_70"], "not one of"),
        (["--batch", "0"], "--batch"),
        (["--batch", "2,0"], "'--batch': 0 is below 1"),
        (["--n", "99999999999"], "'--n': 99999999999 is above 2147483647"),
        (["--n", "512,2147483648"], "'--n': 2147483648 is above 2147483647"),
        (["--nq", "1", "--nk", "99999999999"], "'--nk': 99999999999 is above"),
        (["--heads", "2147483648"], "'--heads': 2147483648 is above"),
        (["--kv-heads", "0"], "'--kv-heads': 0 is below 1"),
        (["--heads", "16,12", "--kv-heads", "8"], "'--kv-heads': heads 12 is not a multiple"),
        (["--n", "512", "--nq", "1"], "'--nq': give --n (Nq = Nk) or --nq (with --nk), not both"),
        (["--nk", "1024"], "'--nk': needs --nq"),
        (["--n", "512", "--nk", "1024"], "'--nk': needs --nq"),
        (["--workload", "nope.yaml"], "'--workload': nope.yaml: cannot read"),
        (["--workload", "w.txt"], "'--workload': w.txt: unknown extension"),
        (["--max-spill-bytes", "-1"], "--max-spill-bytes"),
    ],
)
def test_cli_bad_input_exits_2(app: typer.Typer, args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["tune", *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_cli_replay_errors_exit_2(app: typer.Typer, tmp_path: Path, table_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(app, ["tune", "--replay", str(tmp_path / "nope.json")])
    assert missing.exit_code == 2 and "--replay" in missing.output
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert runner.invoke(app, ["tune", "--replay", str(bad)]).exit_code == 2
    no_match = runner.invoke(app, ["tune", "--replay", str(table_path), "--d", "128"])
    assert no_match.exit_code == 2
    assert "no problem of the table" in " ".join(no_match.output.split())


@pytest.mark.slow
def test_cli_replay_runs_the_campaign(app: typer.Typer, tmp_path: Path, table_path: Path) -> None:
    out = tmp_path / "summary.json"
    result = CliRunner().invoke(
        app,
        ["tune", "--replay", str(table_path), "--n", "512", "--causal", "no,yes",
         "--trials", "3", "--sampler", "random", "--seed", "5", "--summary-json", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "fa2tune tune" in result.output
    summary = json.loads(out.read_text())
    assert summary["sampler"] == "random"
    assert [p["problem"]["causal"] for p in summary["problems"]] == [False, True]
    assert all(p["trials"] == 3 for p in summary["problems"])
    assert all(p["best_config"] for p in summary["problems"])


@pytest.mark.slow
def test_cli_replay_with_a_bare_table(app: typer.Typer, tmp_path: Path) -> None:
    (problem,) = problems_for([512])
    table = synthetic_table([problem], tiny_space())
    bare = {
        study: {name: {"status": e.status, "median_ms": e.median_ms} for name, e in rows.items()}
        for study, rows in table.studies.items()
    }
    path = tmp_path / "bare.json"
    path.write_text(json.dumps(bare))
    result = CliRunner().invoke(app, ["tune", "--replay", str(path), "--sampler", "grid"])
    assert result.exit_code == 0, result.output
    assert table.best(problem.study_name)[0][:20] in result.output  # type: ignore[index]


def test_cli_without_a_gpu_worker_exits_1(
    app: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    from core import settings

    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed: a worker may start here")
    monkeypatch.setitem(settings._overrides, "db_url", f"sqlite:///{tmp_path / 'r.db'}")
    result = CliRunner().invoke(app, ["tune", "--d", "64", "--n", "512", "--causal", "no"])
    assert result.exit_code == 1, result.output
    assert "no GPU worker on device 0" in result.output


@pytest.mark.parametrize(
    ("flags", "untimed_spills"),
    [([], "heavy"), (["--max-spill-bytes", "0"], "all"), (["--allow-spills"], "none")],
)
@pytest.mark.slow
def test_cli_spill_limit_reaches_the_campaign(
    app: typer.Typer, tmp_path: Path, flags: list[str], untimed_spills: str
) -> None:
    """The table's only small spiller (24 B) is timed under the default limit, not with 0;
    the heavy ones (512 B) only with --allow-spills."""
    (problem,) = problems_for([512])
    table = synthetic_table([problem], tiny_space())
    entries = table.studies[problem.study_name]
    heavy = sum(e.spill_bytes == 512 for e in entries.values())
    small = next(n for n, e in entries.items() if e.status == "OK")
    entries[small] = ReplayEntry(status="OK", median_ms=1e-3, build_status="SPILLS", spill_bytes=24)
    path, out = tmp_path / "table.json", tmp_path / "summary.json"
    save_replay_table(table, path)
    result = CliRunner().invoke(
        app,
        ["tune", "--replay", str(path), "--sampler", "grid", "--summary-json", str(out), *flags],
    )
    assert result.exit_code == 0, result.output
    (p,) = json.loads(out.read_text())["problems"]
    expected = {"heavy": heavy, "all": heavy + 1, "none": 0}[untimed_spills]
    assert p["statuses"].get("SPILLS", 0) == expected
    assert (p["best_config"] == small) == (untimed_spills != "all")


def test_cli_both_dtypes_and_masks_reach_the_gpu_campaign(
    app: typer.Typer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--dtype both --causal both`` on the GPU path: every dtype and mask is tuned (the GPU
    campaign itself is stubbed: no GPU here)."""
    seen: dict[str, object] = {}

    def fake_tune_gpu(
        targets: list[Target], options: CampaignOptions, *rest: object
    ) -> CampaignSummary:
        seen.update(
            dtypes=_unique(t.dtype for t in targets),
            causals=_unique(t.causal for t in targets),
            problems=len(make_problems(GPU.name, targets)),
        )
        return CampaignSummary(problems=[], times=TimeSplit(), sampler=options.sampler)

    monkeypatch.setattr(campaign_run, "tune_gpu", fake_tune_gpu)
    args = ["tune", "--d", "64", "--n", "512", "--dtype", "both", "--causal", "both"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert seen["dtypes"] == ["fp16", "bf16"]
    assert seen["causals"] == [False, True]
    assert seen["problems"] == 4
    mixed = CliRunner().invoke(app, ["tune", "--dtype", "bf16,both", "--causal", "yes,both"])
    assert mixed.exit_code == 0, mixed.output
    assert (seen["dtypes"], seen["causals"]) == (["bf16", "fp16"], [True, False])


def _two_dtype_table() -> ReplayTable:
    """fp16 and bf16, full and causal, at N=512: each problem over its own dtype's configs."""
    problems = [
        replace(p, dtype=dtype)
        for dtype in ("fp16", "bf16")
        for causal in (False, True)
        for p in problems_for([512], causal=causal)
    ]
    studies = {
        p.study_name: {
            (c := replace(config, dtype=p.dtype)).name: synthetic_entry(c, p.n)
            for config in tiny_space(p.d, p.causal)
        }
        for p in problems
    }
    problem_of = {p.study_name: p for p in problems}
    return ReplayTable(studies=studies, problems=problem_of, gpu=GPU, arch="sm_90")


@pytest.mark.slow
def test_cli_replay_with_both_dtypes_and_masks(app: typer.Typer, tmp_path: Path) -> None:
    path, out = tmp_path / "table.json", tmp_path / "summary.json"
    save_replay_table(_two_dtype_table(), path)
    args = ["tune", "--replay", str(path), "--dtype", "both", "--causal", "both",
            "--trials", "2", "--sampler", "random", "--summary-json", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    tuned = [
        (p["problem"]["dtype"], p["problem"]["causal"])
        for p in json.loads(out.read_text())["problems"]
    ]
    assert tuned == [("bf16", False), ("bf16", True), ("fp16", False), ("fp16", True)]
    only_bf16 = CliRunner().invoke(
        app, ["tune", "--replay", str(path), "--dtype", "bf16", "--causal", "both",
              "--trials", "1", "--summary-json", str(out)],
    )  # fmt: skip
    assert only_bf16.exit_code == 0, only_bf16.output
    summary = json.loads(out.read_text())
    assert [p["problem"]["dtype"] for p in summary["problems"]] == ["bf16", "bf16"]


T = TypeVar("T")


def _unique(values: Iterable[T]) -> list[T]:
    return list(dict.fromkeys(values))


WORKLOAD = """\
name: test model
shapes:
  - label: decode
    d: 128
    heads: 32
    kv_heads: 8
    batch: [1, 8]
    nq: 1
    nk: [1024, 8192]
  - label: prefill
    d: 64
    heads: 16
    batch: 2
    causal: true
    n: 512
"""


@pytest.fixture
def workload_path(tmp_path: Path) -> Path:
    path = tmp_path / "model.yaml"
    path.write_text(WORKLOAD, encoding="utf-8")
    return path


@pytest.fixture
def tuned(monkeypatch: pytest.MonkeyPatch) -> list[Problem]:
    """The problems ``tune`` hands the GPU campaign (stubbed: no GPU here), on GPU.name."""
    problems: list[Problem] = []

    def fake_tune_gpu(
        targets: list[Target], options: CampaignOptions, *rest: object
    ) -> CampaignSummary:
        problems[:] = make_problems(GPU.name, targets)
        return CampaignSummary(problems=[], times=TimeSplit(), sampler=options.sampler)

    monkeypatch.setattr(campaign_run, "tune_gpu", fake_tune_gpu)
    return problems


def test_shapes_cross_nq_nk_batch_heads_kv_heads() -> None:
    shapes = parse_shapes(
        ShapeOptions(nq="1,128", nk="1024,8192", batch="1,8", heads="32,16", kv_heads="8,16")
    )
    # heads 32 over 8 and 16 KV heads, 16 over 8 and 16; each with 2 batches and 2x2 lengths.
    assert len(shapes) == 2 * 4 * 4
    assert shapes[:4] == [
        Shape(1, 1024, 1, 32, 8), Shape(1, 8192, 1, 32, 8),
        Shape(128, 1024, 1, 32, 8), Shape(128, 8192, 1, 32, 8),
    ]  # fmt: skip
    # --nq without --nk is square; --kv-heads defaults to each --heads.
    assert parse_shapes(ShapeOptions(nq="64", heads="4,2")) == [
        Shape(64, 64, 2, 4, 4), Shape(64, 64, 2, 2, 2),
    ]  # fmt: skip


def test_problems_from_lists_keep_old_names_when_square_and_not_gqa() -> None:
    targets = campaign_targets(
        ShapeOptions(d="128", causal="no", nq="512", nk="512,4096", heads="32", kv_heads="32,8")
    )
    names = [t.problem("NVIDIA H200").study_name for t in targets]
    assert names == [
        "nvidia-h200_d128_n512_b2_h32_fp16_full",
        "nvidia-h200_d128_n512_nk4096_b2_h32_fp16_full",
        "nvidia-h200_d128_n512_b2_h32_kv8_fp16_full",
        "nvidia-h200_d128_n512_nk4096_b2_h32_kv8_fp16_full",
    ]
    old = campaign_targets(ShapeOptions(d="128", n="512", causal="no", heads="32"))
    assert old == targets[:1]


def test_workload_alone_tunes_only_the_workload(workload_path: Path) -> None:
    problems = make_problems(GPU.name, campaign_targets(ShapeOptions(workloads=(workload_path,))))
    assert [(p.d, p.n, p.n_keys, p.batch, p.heads, p.kv_heads, p.causal) for p in problems] == [
        (128, 1, 1024, 1, 32, 8, False),
        (128, 1, 8192, 1, 32, 8, False),
        (128, 1, 1024, 8, 32, 8, False),
        (128, 1, 8192, 8, 32, 8, False),
        (64, 512, 512, 2, 16, None, True),
    ]
    assert problems[-1].nk is None


def test_workload_adds_to_the_options_once(workload_path: Path) -> None:
    """The options' grid first, then the workload's problems it did not already have."""
    options = ShapeOptions(d="64", n="512,1024", causal="yes", workloads=(workload_path,))
    problems = make_problems(GPU.name, campaign_targets(options))
    assert [(p.d, p.n, p.n_keys) for p in problems] == [
        (64, 512, 512),  # also the workload's prefill entry: tuned once
        (64, 1024, 1024),
        (128, 1, 1024), (128, 1, 8192), (128, 1, 1024), (128, 1, 8192),
    ]  # fmt: skip
    assert len(set(problems)) == len(problems)


def test_cli_passes_lists_and_workload_to_the_campaign(
    app: typer.Typer, workload_path: Path, tuned: list[Problem]
) -> None:
    args = ["tune", "--d", "128", "--nq", "1", "--nk", "2048,4096", "--batch", "1,4",
            "--heads", "32", "--kv-heads", "8", "--causal", "no"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert [(p.n, p.nk, p.batch, p.heads, p.kv_heads) for p in tuned] == [
        (1, 2048, 1, 32, 8), (1, 4096, 1, 32, 8), (1, 2048, 4, 32, 8), (1, 4096, 4, 32, 8),
    ]  # fmt: skip
    alone = CliRunner().invoke(app, ["tune", "--workload", str(workload_path)])
    assert alone.exit_code == 0, alone.output
    assert len(tuned) == 5 and tuned[0].study_name.endswith("_d128_n1_nk1024_b1_h32_kv8_fp16_full")
    both = CliRunner().invoke(app, ["tune", "--workload", str(workload_path), "--n", "512"])
    assert both.exit_code == 0, both.output
    # The default grid at N=512 (D 64/128, full/causal), then the workload less the D=64
    # causal N=512 problem the grid already has.
    assert len(tuned) == 4 + 5 - 1
    assert tuned[0] == Problem(gpu=GPU.name, d=64, n=512, batch=2, heads=16)
    assert sum(p.kv_heads == 8 for p in tuned) == 4


def test_cli_tunes_several_workload_files_in_order_each_problem_once(
    app: typer.Typer, workload_path: Path, tmp_path: Path, tuned: list[Problem]
) -> None:
    second = tmp_path / "second.yaml"
    # One problem the first file has (D=64 causal N=512) and one it has not.
    second.write_text(
        "- {d: 64, heads: 16, batch: 2, causal: true, n: 512}\n"
        "- {d: 256, heads: 16, batch: 1, n: 2048}\n"
    )
    args = ["tune", "--workload", str(workload_path), "--workload", str(second)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert [(p.d, p.n) for p in tuned] == [(128, 1)] * 4 + [(64, 512), (256, 2048)]


def test_cli_rejects_dtype_or_causal_with_a_workload_alone(
    app: typer.Typer, workload_path: Path
) -> None:
    """Each entry sets its dtype and mask: the options would otherwise be silently ignored."""
    for option in ("--dtype", "--causal"):
        result = CliRunner().invoke(app, ["tune", "--workload", str(workload_path), option, "both"])
        assert result.exit_code == 2, result.output
        assert f"'{option}': with --workload alone" in " ".join(result.output.split())


def test_cli_bad_workload_names_file_entry_and_field(app: typer.Typer, tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    path.write_text(json.dumps([{"d": 12, "heads": 8, "n": 1}]))
    result = CliRunner().invoke(app, ["tune", "--workload", str(path)])
    assert result.exit_code == 2, result.output
    # The error box wraps long lines anywhere, between its borders.
    text = "".join(result.output.replace("│", "").split())
    assert "'--workload':" in text and "w.json:entry1:field'd':mustbeamultipleof8" in text


def _gqa_problems() -> list[Problem]:
    (square,) = problems_for([512])
    return [
        square,
        replace(square, nk=4096),
        replace(square, n=1, nk=4096, heads=32, kv_heads=8, batch=8),
        replace(square, n=1024, heads=32, kv_heads=8),
    ]


@pytest.mark.parametrize(
    ("options", "kept"),
    [
        (ShapeOptions(), [0, 1, 2, 3]),
        (ShapeOptions(n="512"), [0]),  # --n is Nq = Nk: not the Nk=4096 one
        (ShapeOptions(nq="512"), [0, 1]),
        (ShapeOptions(nq="1,512", nk="4096"), [1, 2]),
        (ShapeOptions(kv_heads="8"), [2, 3]),
        (ShapeOptions(heads="16"), [0, 1]),
        (ShapeOptions(batch="8"), [2]),
        (ShapeOptions(batch="2", heads="32"), [3]),
    ],
)
def test_replay_filters_by_the_shape_options(options: ShapeOptions, kept: list[int]) -> None:
    problems = _gqa_problems()
    keep = replay_filter(options)
    assert [i for i, p in enumerate(problems) if keep(p)] == kept


def test_replay_filter_with_a_workload(tmp_path: Path) -> None:
    problems = _gqa_problems()
    path = tmp_path / "w.json"
    entry = {"d": 64, "heads": 32, "kv_heads": 8, "batch": 8, "nq": 1, "nk": 4096}
    path.write_text(json.dumps([entry]))
    alone = replay_filter(ShapeOptions(workloads=(path,)))
    assert [i for i, p in enumerate(problems) if alone(p)] == [2]
    with_n = replay_filter(ShapeOptions(n="512", workloads=(path,)))
    assert [i for i, p in enumerate(problems) if with_n(p)] == [0, 2]


@pytest.mark.slow
def test_cli_replay_of_a_workload(app: typer.Typer, tmp_path: Path) -> None:
    problems = _gqa_problems()
    path, out = tmp_path / "table.json", tmp_path / "summary.json"
    save_replay_table(synthetic_table(problems, tiny_space), path)
    workload = tmp_path / "w.yaml"
    workload.write_text("- {d: 64, heads: 32, kv_heads: 8, batch: 8, nq: 1, nk: 4096}\n")
    args = ["tune", "--replay", str(path), "--workload", str(workload), "--trials", "2",
            "--sampler", "random", "--summary-json", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (summary,) = json.loads(out.read_text())["problems"]
    assert Problem.from_dict(summary["problem"]) == problems[2]


def test_family_and_timing_target_reach_the_gpu_campaign(
    app: typer.Typer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--family`` restricts the default space (registry order, unknown names exit 2) and
    ``--target-ms`` sets the worker's timing target (the GPU campaign is stubbed)."""
    seen: dict[str, object] = {}

    def fake_tune_gpu(
        targets: list[Target], options: CampaignOptions, *rest: object
    ) -> CampaignSummary:
        seen.update(families=options.families, target_ms=rest[3] if len(rest) > 3 else None)
        return CampaignSummary(problems=[], times=TimeSplit(), sampler=options.sampler)

    monkeypatch.setattr(campaign_run, "tune_gpu", fake_tune_gpu)
    ok = CliRunner().invoke(app, ["tune", "--family", "splitkv,fa2", "--target-ms", "30"])
    assert ok.exit_code == 0, ok.output
    assert seen == {"families": ("fa2", "splitkv"), "target_ms": 30.0}
    default = CliRunner().invoke(app, ["tune"])
    assert default.exit_code == 0 and seen["families"] is None
    bad = CliRunner().invoke(app, ["tune", "--family", "fa2,fa9"])
    assert bad.exit_code == 2 and "unknown fa9 (known: fa2, fa3, splitkv)" in bad.output
    with pytest.raises(ValueError, match="unknown kernel family 'fa9'"):
        CampaignOptions(families=("fa9",))


def test_a_head_dim_only_some_families_have(
    app: typer.Typer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """D=40 with every family, or with fa2 among those named, reaches the campaign (which
    skips the families without it); fa3 alone is a usage error naming fa3's head dims."""
    seen: list[tuple[list[int], tuple[str, ...] | None]] = []

    def fake_tune_gpu(
        targets: list[Target], options: CampaignOptions, *rest: object
    ) -> CampaignSummary:
        seen.append((sorted({t.d for t in targets}), options.families))
        return CampaignSummary(problems=[], times=TimeSplit(), sampler=options.sampler)

    monkeypatch.setattr(campaign_run, "tune_gpu", fake_tune_gpu)
    for args in (["--d", "40,64"], ["--d", "40", "--family", "fa2,fa3"]):
        result = CliRunner().invoke(app, ["tune", *args, "--n", "1024"])
        assert result.exit_code == 0, result.output
    assert seen == [([40, 64], None), ([40], ("fa2", "fa3"))]
    for args, why in [
        (
            ["--d", "40", "--family", "fa3"],
            "fa3 has no head dim 40 (head dims fa3: 64, 96, 128, 256)",
        ),
        (["--d", "64,80", "--family", "fa3"], "fa3 has no head dim 80"),
        (["--d", "12"], "12 is not a multiple of 8 from 8 to 256"),
        (["--d", "264"], "264 is not a multiple of 8 from 8 to 256"),
    ]:
        result = CliRunner().invoke(app, ["tune", *args, "--n", "1024"])
        assert result.exit_code == 2, result.output
        assert why in " ".join(result.output.replace("│", " ").split()), result.output
    assert len(seen) == 2


def test_a_worker_that_cannot_start_is_one_line_naming_what_to_install() -> None:
    from measure.worker import WorkerStartError

    child = WorkerStartError(
        'worker setup failed:\nTraceback (most recent call last):\n  File "x.py", line 1\n'
        "ModuleNotFoundError: No module named 'torch'\n"
    )
    assert campaign_run.worker_error(child) == (
        "worker setup failed: ModuleNotFoundError: No module named 'torch' "
        "(install the GPU extra: pip install 'fa2tune[gpu]')"
    )
    assert campaign_run.worker_error(WorkerStartError("no CUDA device")) == "no CUDA device"


def _two_family_table() -> ReplayTable:
    """One problem whose recorded configs are fa2's and fa3's (as a table exported from the
    shipped two-family results is), the fastest an fa3 config."""
    from codegen.families import FAMILIES

    (problem,) = problems_for([512], d=128)
    fa2 = tiny_space(128)[:6]
    fa3 = list(FAMILIES["fa3"].seeds(128, "fp16", False))[:3]
    entries = {c.name: synthetic_entry(c, problem.n) for c in fa2}
    entries.update(
        {c.name: ReplayEntry(status="OK", median_ms=0.001 * (i + 1)) for i, c in enumerate(fa3)}
    )
    return ReplayTable(
        studies={problem.study_name: entries}, problems={problem.study_name: problem}, gpu=GPU
    )


def test_cli_replay_of_a_two_family_table(app: typer.Typer, tmp_path: Path) -> None:
    # Configs of different families do not compare: ordering the table's configs by them
    # crashed ("'<' not supported between instances of 'Fa3Config' and 'Fa2Config'").
    table = _two_family_table()
    (study,) = table.studies
    configs = table.configs(study)
    assert sorted(c.name for c in configs) == sorted(table.studies[study])
    families = [c.family for c in configs]
    assert families == sorted(families) and set(families) == {"fa2", "fa3"}
    path, out = tmp_path / "table.json", tmp_path / "summary.json"
    save_replay_table(table, path)
    args = ["tune", "--replay", str(path), "--sampler", "grid", "--summary-json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (summary,) = json.loads(out.read_text())["problems"]
    assert summary["best_config"].startswith("fa3_"), summary


class _FakeWorker:
    """Stands in for measure.worker.BenchWorker: fails to start, or runs on ``gpu``."""

    gpu: object = None
    start_error: str | None = None

    def __init__(self, **kwargs: object) -> None:
        self.gpu_info = self.gpu

    def __enter__(self) -> _FakeWorker:
        from measure.worker import WorkerStartError

        if self.start_error is not None:
            raise WorkerStartError(self.start_error)
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def test_cli_gpu_worker_failures(
    app: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without torch exit 1 naming the GPU extra, whether torch is installed or not; a GPU of
    an unsupported architecture is a usage error of --arch (exit 2)."""
    import measure.worker
    from core import settings

    monkeypatch.setitem(settings._overrides, "db_url", f"sqlite:///{tmp_path / 'r.db'}")
    monkeypatch.setattr(measure.worker, "BenchWorker", _FakeWorker)
    args = ["tune", "--d", "64", "--n", "512", "--causal", "no"]
    monkeypatch.setattr(
        _FakeWorker, "start_error", "worker failed:\nTraceback\nNo module named 'torch'"
    )
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "fa2tune tune: no GPU worker on device 0: worker failed: No module named" in (
        result.output
    )
    assert "pip install 'fa2tune[gpu]'" in result.output
    monkeypatch.setattr(_FakeWorker, "start_error", None)
    monkeypatch.setattr(_FakeWorker, "gpu", replace(GPU, compute_capability="7.0"))
    old = CliRunner().invoke(app, args)
    assert old.exit_code == 2, old.output
    said = " ".join(old.output.replace("│", " ").split())
    assert "fa2tune has no code a GPU of compute capability 7.0 runs" in said, said
    # A target whose code the GPU cannot run is refused before anything is built.
    monkeypatch.setattr(_FakeWorker, "gpu", replace(GPU, compute_capability="9.0"))
    wrong = CliRunner().invoke(app, [*args, "--arch", "sm_120"])
    assert wrong.exit_code == 2, wrong.output
    said = " ".join(wrong.output.replace("│", " ").split())
    assert "sm_120 code does not run on" in said and "compute capability 9.0" in said, said
