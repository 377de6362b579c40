"""``fa2tune space`` and the input checks of ``fa2tune build`` (no compiler needed)."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from codegen import commands
from codegen.families.fa2.space import enumerate_space
from codegen.families.fa3 import space as fa3_space

app = typer.Typer()
app.command("space")(commands.space)
app.command("build")(commands.build)
runner = CliRunner()


def test_space_table() -> None:
    result = runner.invoke(app, ["space", "--d", "128"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    n = len(enumerate_space(128))
    assert f"{n} configs" in result.output
    assert "fa2_d128_fp16_full_br128_bc64_w4_s1_pad8" in result.output
    assert "128x64/4w" in result.output and "swizzle" in result.output


def test_space_json() -> None:
    result = runner.invoke(app, ["space", "--d", "64", "--dtype", "bf16", "--causal", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["name"] for r in rows] == [c.name for c in enumerate_space(64, "bf16", True)]
    row = next(r for r in rows if r["name"] == "fa2_d64_bf16_causal_br128_bc128_w4_s1_pad8")
    assert row["tile"] == "128x128/4w" and row["stages"] == 1 and row["pad"] == 8
    assert row["layout"] == "pad 8"
    assert row["smem_bytes"] == (128 + 2 * 128) * 72 * 2
    assert isinstance(row["est_registers"], int)


def test_space_of_the_hopper_family() -> None:
    result = runner.invoke(
        app, ["space", "--d", "128", "--family", "fa3", "--smem-limit", "100000", "--json"]
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    expected = [c for c in fa3_space.enumerate_space(128, "fp16", False) if c.smem_bytes <= 100000]
    assert [r["name"] for r in rows] == [c.name for c in expected] and rows
    assert all(r["family"] == "fa3" and r["smem_bytes"] <= 100000 for r in rows)
    bad = runner.invoke(app, ["space", "--d", "128", "--family", "fa9"])
    assert bad.exit_code == 2 and "not a kernel family" in bad.output


@pytest.mark.parametrize("d", [40, 80, 160, 192])
@pytest.mark.parametrize("family", ["fa2", "splitkv"])
def test_space_takes_any_multiple_of_8(d: int, family: str) -> None:
    result = runner.invoke(app, ["space", "--d", str(d), "--family", family, "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert rows and all(r["name"].startswith(f"{family}_d{d}_") for r in rows)


def test_space_smem_limit() -> None:
    result = runner.invoke(app, ["space", "--d", "128", "--smem-limit", "49152", "--json"])
    assert result.exit_code == 0
    rows = json.loads(result.output)
    assert rows and all(r["smem_bytes"] <= 49152 for r in rows)


def test_space_of_a_target_keeps_to_its_shared_memory() -> None:
    """--arch sm_120 (99 KB per block): the sm_90 space less what does not fit there."""
    result = runner.invoke(app, ["space", "--d", "128", "--arch", "sm_120", "--json"])
    assert result.exit_code == 0, result.output
    names = [r["name"] for r in json.loads(result.output)]
    wide = enumerate_space(128)
    assert names == [c.name for c in wide if c.smem_bytes <= 99 * 1024]
    assert 0 < len(names) < len(wide)
    refused = runner.invoke(app, ["space", "--d", "128", "--family", "fa3", "--arch", "sm_120"])
    assert refused.exit_code == 2 and "does not build for sm_120" in refused.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["space", "--d", "12"], "12 is not a supported head dim; use a multiple of 8 from 8"),
        (["space", "--d", "264"], "264 is not a supported head dim"),
        (["space", "--d", "0", "--family", "fa3"], "0 is not a supported head dim"),
        (
            ["space", "--d", "40", "--family", "fa3"],
            "the fa3 family has no head dim 40; use one of 64, 96, 128, 256",
        ),
        (["space", "--d", "64", "--dtype", "fp32"], "not a supported dtype"),
        (["build", "--d", "12"], "not a supported head dim"),
        (["build", "--d", "80", "--family", "fa3"], "the fa3 family has no head dim 80"),
        (["build", "--d", "64", "--arch", "sm_70"], "not a supported architecture"),
        (["build", "--d", "64", "--dtype", "int8"], "not a supported dtype"),
        (
            ["build", "--family", "fa3", "--arch", "sm_120"],
            "the fa3 family does not build for sm_120",
        ),
        (["build", "--config", "not_a_config"], "not a kernel config name"),
        (["build", "--config", "fa2_d64_fp16_full_br64_bc64_w8_s1_pad8"], "16 * warps"),
        (
            ["build", "--d", "128", "--config", "fa2_d64_fp16_full_br64_bc64_w4_s1_pad8"],
            "has D=64, not 128",
        ),
        (
            ["build", "--arch", "sm_86", "--config", "fa2_d128_fp16_full_br128_bc64_w4_s2_pad8"],
            "shared memory",
        ),
        (["build", "--d", "64", "--limit", "0"], "--limit"),
    ],
)
def test_bad_input_is_a_usage_error(args: list[str], message: str) -> None:
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
