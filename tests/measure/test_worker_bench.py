"""``fa2tune bench`` and :mod:`measure.bench` on the CPU: argument errors, fake worker, builds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from core.build_report import BuildReport, BuildStatus
from core.fa2_config import Fa2Config
from core.problem import Problem
from core.records import MeasureResult, MeasureStatus
from fa2tune.cli import app
from measure.bench import BenchReport, build_summary, run_bench
from measure.sdpa import SdpaTiming
from tests.support.fake_handlers import FAKE

NAME = "fa2_d64_fp16_full_br64_bc64_w2_s1_pad0"
runner = CliRunner()


def _report(status: BuildStatus, cubin: Path | None, error: str | None = None) -> BuildReport:
    return BuildReport(
        config=Fa2Config.from_name(NAME),
        arch="sm_90",
        status=status,
        registers=96 if cubin else None,
        spill_stores=0,
        spill_loads=0,
        stack_bytes=0,
        static_smem=0,
        compile_seconds=0.5,
        cubin=cubin,
        source_hash="h",
        nvcc_version="13.0",
        error=error,
    )


def test_bad_config_name_exits_2() -> None:
    res = runner.invoke(app, ["bench", "--config", "fa2_nonsense"])
    assert res.exit_code == 2
    assert "not a kernel config name" in res.output


def test_bad_layout_and_heads_exit_2() -> None:
    assert runner.invoke(app, ["bench", "--config", NAME, "--layout", "nhbd"]).exit_code == 2
    res = runner.invoke(app, ["bench", "--config", NAME, "--heads", "6", "--kv-heads", "4"])
    assert res.exit_code == 2
    assert runner.invoke(app, ["bench", "--config", NAME, "--n", "0"]).exit_code == 2


def test_bench_json_with_a_fake_worker(tmp_path: Path) -> None:
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(b"\0")
    res = runner.invoke(
        app,
        [
            "bench", "--config", NAME, "--n", "512", "--nk", "256", "--batch", "1",
            "--heads", "8", "--kv-heads", "2", "--cubin", str(cubin), "--handler", FAKE, "--json",
        ],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["config"] == NAME
    assert data["result"]["status"] == "OK"
    assert data["problem"]["nk"] == 256 and data["problem"]["kv_heads"] == 2
    assert data["problem"]["d"] == 64 and data["problem"]["dtype"] == "fp16"
    assert data["build"] is None


def test_bench_table_with_a_fake_worker(tmp_path: Path) -> None:
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(b"\0")
    res = runner.invoke(
        app, ["bench", "--config", NAME, "--n", "128", "--cubin", str(cubin), "--handler", FAKE]
    )
    assert res.exit_code == 0, res.output
    assert NAME in res.output and "ours" in res.output and "OK" in res.output


def test_run_bench_builds_first_and_reports_the_build(tmp_path: Path) -> None:
    cubin = tmp_path / "built.cubin"
    cubin.write_bytes(b"\0")
    calls: list[tuple[list[str], str]] = []

    def build(configs: object, arch: str) -> list[BuildReport]:
        calls.append(([c.name for c in configs], arch))  # type: ignore[attr-defined]
        return [_report(BuildStatus.OK, cubin)]

    report = run_bench(
        Fa2Config.from_name(NAME), n=64, batch=1, heads=2, arch="sm_90a", handler=FAKE,
        build_fn=build,
    )  # fmt: skip
    assert calls == [([NAME], "sm_90a")]
    assert report.ok and report.build is not None and report.build["status"] == "OK"
    assert report.build["cubin"] == str(cubin)


def test_run_bench_does_not_measure_a_failed_build() -> None:
    def build(configs: object, arch: str) -> list[BuildReport]:
        return [_report(BuildStatus.COMPILE_FAILED, None, error="ptxas: boom")]

    report = run_bench(Fa2Config.from_name(NAME), n=64, handler=FAKE, build_fn=build)
    assert report.result.status == MeasureStatus.COMPILE_FAILED
    assert report.result.error == "ptxas: boom"
    assert not report.ok


def test_speedup_and_to_dict() -> None:
    cfg = Fa2Config.from_name(NAME)
    report = BenchReport(
        config=cfg,
        problem=Problem(gpu="g", d=64, n=128),
        result=MeasureResult(status=MeasureStatus.OK, median_ms=1.0, extra={"sdpa": {}}),
        sdpa={
            "flash": SdpaTiming("flash", "OK", median_ms=1.5),
            "cudnn": SdpaTiming("cudnn", "UNSUPPORTED", note="no"),
        },
    )
    assert report.speedup("flash") == pytest.approx(1.5)
    assert report.speedup("cudnn") is None
    d = report.to_dict()
    assert "sdpa" not in d["result"]["extra"]
    assert d["sdpa"]["flash"]["speedup_vs_sdpa"] == pytest.approx(1.5)
    assert SdpaTiming.from_dict(d["sdpa"]["cudnn"]) == report.sdpa["cudnn"]
    json.dumps(d)


def test_build_summary_is_json_able(tmp_path: Path) -> None:
    s = build_summary(_report(BuildStatus.SPILLS, tmp_path / "x.cubin"))
    assert s["status"] == "SPILLS" and s["cubin"].endswith("x.cubin")
    json.dumps(s)
