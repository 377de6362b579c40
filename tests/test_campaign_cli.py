"""The ``tune`` command: argument parsing, errors (exit 2), replay mode end to end."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import typer
from test_replay_synthetic import (
    GPU,
    problems_for,
    save_replay_table,
    synthetic_entry,
    synthetic_table,
    tiny_space,
)
from typer.testing import CliRunner

from core.config import DTYPES
from tuner import tune_cli
from tuner.campaign import CampaignOptions
from tuner.replay import ReplayEntry, ReplayTable
from tuner.summary import CampaignSummary, TimeSplit
from tuner.tune_cli import (
    DEFAULT_TRIALS,
    make_problems,
    parse_bool_list,
    parse_choice_list,
    parse_duration,
    parse_int_list,
    resolve_budget,
    tune,
)

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")


@pytest.fixture
def app() -> typer.Typer:
    app = typer.Typer(pretty_exceptions_enable=False)

    @app.callback()
    def main() -> None:
        """Test app."""

    app.command("tune")(tune)
    return app


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
    problems = make_problems(
        "NVIDIA H200",
        parse_int_list(tune_cli.DEFAULT_D, "--d"),
        parse_int_list(tune_cli.DEFAULT_N, "--n"),
        ["fp16"],
        parse_bool_list(tune_cli.DEFAULT_CAUSAL, "--causal"),
        2,
        16,
    )
    assert len(problems) == 24
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
        (["--d", "65"], "65 is not one of"),
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

    from fa2tune import settings

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
        ds: list[int],
        ns: list[int],
        dtypes: list[str],
        causals: list[bool],
        batch: int,
        heads: int,
        options: CampaignOptions,
        *rest: object,
    ) -> CampaignSummary:
        seen.update(
            dtypes=dtypes,
            causals=causals,
            problems=len(tune_cli.make_problems(GPU.name, ds, ns, dtypes, causals, batch, heads)),
        )
        return CampaignSummary(problems=[], times=TimeSplit(), sampler=options.sampler)

    monkeypatch.setattr(tune_cli, "_tune_gpu", fake_tune_gpu)
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
