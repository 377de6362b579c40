"""build_batch end to end on the CPU: real ninja and job runner, a fake nvcc.

The fake prints ptxas-format reports, so everything but the compiler itself is exercised:
cache directories, ninja, failure isolation, caching, report parsing and input order.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import Result

from codegen import build as build_mod
from codegen.build import (
    NvccNotFoundError,
    build_batch,
    build_configs,
    nvcc_version,
    report_to_dict,
)
from codegen.families import fa2 as families_mod
from codegen.families.fa2 import render_instantiation
from codegen.ninja import NinjaEntry
from codegen.render import TemplateMissingError
from core.build_report import BuildStatus
from core.fa2_config import Fa2Config

FAKE_NVCC = r'''#!{python}
"""A stand-in for nvcc that prints ptxas -v style output."""
import re, sys
from pathlib import Path
args = sys.argv[1:]
if args == ["--version"]:
    print("nvcc: fake\nCuda compilation tools, release 99.0, V99.0.1")
    sys.exit(0)
with open({calls!r}, "a") as f:
    f.write(args[-1] + "\n")
inc = Path(args[args.index("-I") + 1])
if not (inc / "fa2_fwd.cuh").is_file():
    sys.stderr.write("x.cu(1): catastrophic error: cannot open source file \"fa2_fwd.cuh\"\n")
    sys.exit(1)
out, src = args[args.index("-o") + 1], Path(args[-1]).read_text()
name = re.search(r"FA2_DEFINE_KERNEL\((\w+),", src).group(1)
br = int(re.search(r"_br(\d+)_", name).group(1))
arch = re.search(r"code=(sm_\d+)", " ".join(args)).group(1)
if "FAIL" in src:
    sys.stderr.write(f"{{args[-1]}}(2): error: identifier \"oops\" is undefined\n")
    sys.stderr.write("\n1 error detected.\n")
    sys.exit(1)
if "SMEMERR" in src:
    sys.stderr.write(f"ptxas error   : Entry function '{{name}}' uses too much shared data "
                     "(0x3a980 bytes, 0xc000 max)\n")
    sys.exit(255)
stack, st, ld = (96, 120, 136) if "SPILL" in src else (0, 0, 0)
smem = ", 200000 bytes smem" if "STATIC_SMEM" in src else ""
sys.stderr.write(
    "ptxas info    : 0 bytes gmem\n"
    f"ptxas info    : Compiling entry function '{{name}}' for '{{arch}}'\n"
    f"ptxas info    : Function properties for {{name}}\n"
    f"    {{stack}} bytes stack frame, {{st}} bytes spill stores, {{ld}} bytes spill loads\n"
    f"ptxas info    : Used {{100 + br}} registers, used 1 barriers{{smem}}\n"
    "ptxas info    : Compile time = 1.0 ms\n"
)
Path(out).write_bytes(b"fake cubin")
'''


class Fake:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.calls_file = root / "calls.txt"
        self.nvcc = root / "bin dir" / "nvcc"
        self.nvcc.parent.mkdir()
        self.nvcc.write_text(FAKE_NVCC.format(python=sys.executable, calls=str(self.calls_file)))
        self.nvcc.chmod(0o755)
        self.templates = root / "template dir"
        self.templates.mkdir()
        (self.templates / "fa2_fwd.cuh").write_text("// fake template\n")
        self.cache = root / "cache dir"

    @property
    def calls(self) -> int:
        return len(self.calls_file.read_text().splitlines()) if self.calls_file.exists() else 0

    def build(self, configs: list[Fa2Config], **kwargs: object) -> build_mod.BuildBatch:
        return build_batch(
            configs,
            "sm_90",
            self.cache,
            2,
            nvcc=str(self.nvcc),
            template_dir=self.templates,
            **kwargs,  # type: ignore[arg-type]
        )


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Fake]:
    nvcc_version.cache_clear()
    yield Fake(tmp_path)
    nvcc_version.cache_clear()


def cfg(br: int = 64, bc: int = 64, warps: int = 4, stages: int = 1, d: int = 64) -> Fa2Config:
    return Fa2Config(d, "fp16", False, br, bc, warps, stages, pad=8)


def mark(monkeypatch: pytest.MonkeyPatch, markers: dict[Fa2Config, str]) -> None:
    """Make chosen configs' instantiations carry a marker the fake nvcc reacts to."""

    def patched(config: Fa2Config) -> str:
        text = render_instantiation(config)
        return text + f"// {markers[config]}\n" if config in markers else text

    # The fa2 family renders through its module's reference to render_instantiation.
    monkeypatch.setattr(families_mod, "render_instantiation", patched)


def test_builds_reports_and_caches(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    ok, spill, bad, smem_err, static = (
        cfg(64, 64),
        cfg(128, 64),
        cfg(64, 32),
        cfg(64, 128),
        cfg(128, 128),
    )
    mark(monkeypatch, {spill: "SPILL", bad: "FAIL", smem_err: "SMEMERR", static: "STATIC_SMEM"})
    configs = [spill, ok, bad, smem_err, static, ok]  # a duplicate is built once
    batch = fake.build(configs)
    assert fake.calls == 5
    assert (batch.built, batch.cached, batch.failed, batch.spilling) == (5, 0, 3, 1)
    assert [r.config for r in batch.reports] == configs, "reports come in input order"
    by = {r.config: r for r in batch.reports}

    r = by[ok]
    assert r.status == BuildStatus.OK and r.usable
    assert (r.registers, r.spill_stores, r.spill_loads, r.stack_bytes) == (164, 0, 0, 0)
    assert r.cubin is not None and r.cubin.read_bytes() == b"fake cubin"
    assert r.cubin.parent.parent == fake.cache / "sm_90"
    assert r.cubin.parent.name == f"{ok.name}-{r.source_hash}"
    assert r.nvcc_version == "Cuda compilation tools, release 99.0, V99.0.1"
    assert r.flags == tuple(build_mod.nvcc_flags("sm_90"))
    assert r.compile_seconds > 0 and r.error is None

    r = by[spill]
    assert r.status == BuildStatus.SPILLS and r.usable
    assert (r.spill_stores, r.spill_loads, r.stack_bytes) == (120, 136, 96)

    r = by[bad]
    assert r.status == BuildStatus.COMPILE_FAILED and not r.usable
    assert r.cubin is None and r.registers is None
    assert r.error is not None and 'identifier "oops" is undefined' in r.error

    r = by[smem_err]
    assert r.status == BuildStatus.SMEM_OVERFLOW and r.cubin is None
    assert r.error is not None and "too much shared data" in r.error

    r = by[static]
    assert r.status == BuildStatus.SMEM_OVERFLOW and not r.usable
    assert r.static_smem == 200000
    assert r.error is not None and "static" in r.error and "sm_90" in r.error

    again = fake.build(configs)
    assert fake.calls == 5, "nothing is recompiled, failures included"
    assert (again.built, again.cached) == (0, 5)
    assert again.configs_per_minute is None
    assert [report_to_dict(a) for a in again.reports] == [report_to_dict(b) for b in batch.reports]


def test_changed_inputs_get_new_directories(fake: Fake) -> None:
    c = cfg()
    first = fake.build([c]).reports[0]
    (fake.templates / "fa2_fwd.cuh").write_text("// edited template\n")
    second = fake.build([c]).reports[0]
    assert second.source_hash != first.source_hash
    assert fake.calls == 2
    other_arch = build_batch(
        [c], "sm_80", fake.cache, 1, nvcc=str(fake.nvcc), template_dir=fake.templates
    ).reports[0]
    assert other_arch.status == BuildStatus.OK and other_arch.cubin is not None
    assert other_arch.cubin.parent.parent.name == "sm_80"
    assert other_arch.flags[-1] == "-gencode=arch=compute_80,code=sm_80"
    assert fake.calls == 3


def test_unfinished_result_is_rebuilt(fake: Fake) -> None:
    c = cfg()
    r = fake.build([c]).reports[0]
    assert r.cubin is not None
    entry = NinjaEntry.in_directory(c.name, r.cubin.parent)
    entry.result.write_text(json.dumps({"finished": False}))
    assert fake.build([c]).built == 1
    entry.result.write_text("{not json")
    assert fake.build([c]).built == 1
    assert fake.calls == 3


def test_job_that_never_finishes_is_a_failure(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_compile(*args: object, **kwargs: object) -> float:
        return 0.0

    monkeypatch.setattr(build_mod, "compile_entries", no_compile)
    r = fake.build([cfg()]).reports[0]
    assert r.status == BuildStatus.COMPILE_FAILED
    assert r.error is not None and "did not finish" in r.error


def test_smem_limit_override(fake: Fake) -> None:
    c = cfg()
    r = fake.build([c], smem_limit=c.smem_bytes - 1).reports[0]
    assert r.status == BuildStatus.SMEM_OVERFLOW and r.registers == 164


def test_missing_template(fake: Fake) -> None:
    (fake.templates / "fa2_fwd.cuh").unlink()
    with pytest.raises(TemplateMissingError, match=r"fa2_fwd\.cuh"):
        fake.build([cfg()])


def test_missing_nvcc(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    """No nvcc and no NVRTC (made unloadable here, whatever this machine has): the error
    names both ways of getting a compiler."""
    from codegen import nvrtc_compile

    def no_nvrtc() -> str:
        raise ImportError("no NVRTC library")

    monkeypatch.setattr(nvrtc_compile, "nvrtc_release", no_nvrtc)
    with pytest.raises(NvccNotFoundError, match=r"FA2TUNE_NVCC.*NVRTC is not available"):
        build_configs(
            [cfg()],
            "sm_90",
            fake.cache,
            1,
            nvcc=str(fake.root / "missing-nvcc"),
            template_dir=fake.templates,
        )


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda f: build_batch(
                [cfg()], "sm_75", f.cache, 1, nvcc=str(f.nvcc), template_dir=f.templates
            ),
            "architecture",
        ),
        (
            lambda f: build_batch(
                [cfg()], "sm_90", f.cache, 0, nvcc=str(f.nvcc), template_dir=f.templates
            ),
            "jobs",
        ),
    ],
)
def test_bad_arguments(fake: Fake, call: Callable[[Fake], object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call(fake)


def test_nvcc_version_is_cached(fake: Fake) -> None:
    assert nvcc_version(str(fake.nvcc)) == "Cuda compilation tools, release 99.0, V99.0.1"
    fake.nvcc.unlink()
    assert nvcc_version(str(fake.nvcc)) == "Cuda compilation tools, release 99.0, V99.0.1"


# --------------------------------------------------------------------------------------------
# The ``fa2tune build`` command over the fake compiler


@pytest.fixture
def cli(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> Callable[[list[str]], Result]:
    import typer
    from typer.testing import CliRunner

    from codegen import commands
    from core import settings

    monkeypatch.setattr(
        settings, "_overrides", {"nvcc": str(fake.nvcc), "cache_dir": fake.cache, "build_jobs": 2}
    )
    monkeypatch.setattr(build_mod, "default_template_dir", lambda: fake.templates)
    app = typer.Typer()
    app.command("build")(commands.build)
    app.command("space")(commands.space)
    runner = CliRunner()

    def invoke(args: list[str]) -> Result:
        return runner.invoke(app, ["build", *args], env={"COLUMNS": "250"})

    return invoke


def test_cli_build_limit_table_and_summary(
    cli: Callable[[list[str]], Result], fake: Fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    from codegen.families.fa2.space import enumerate_space

    space = enumerate_space(64)
    mark(monkeypatch, {space[1]: "FAIL", space[2]: "SPILL"})
    result = cli(["--d", "64", "--limit", "3"])
    assert result.exit_code == 0, result.output  # a failed config is data, not an error
    assert fake.calls == 3
    for c in space[:3]:
        assert c.name in result.output
    assert "COMPILE_FAILED" in result.output and "SPILLS" in result.output
    assert 'identifier "oops" is undefined' in result.output
    assert "built 3, cached 0, failed 1, spilling 1" in result.output
    assert "configs/minute" in result.output
    again = cli(["--d", "64", "--limit", "3"])
    assert "built 0, cached 3, failed 1, spilling 1" in again.output
    assert fake.calls == 3


def test_cli_build_named_configs_json(cli: Callable[[list[str]], Result], fake: Fake) -> None:
    names = ["fa2_d128_fp16_full_br128_bc64_w4_s1_pad8", "fa2_d64_bf16_causal_br64_bc64_w4_s2_swz"]
    result = cli(["--config", names[0], "--config", names[1], "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["name"] for r in rows] == names
    assert rows[0]["status"] == "OK" and rows[0]["registers"] == 228
    assert rows[1]["config"]["causal"] is True and rows[1]["config"]["swizzle"] is True
    assert rows[0]["dynamic_smem"] == Fa2Config.from_name(names[0]).smem_bytes


def test_cli_build_without_nvcc(
    cli: Callable[[list[str]], Result], fake: Fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    from codegen import nvrtc_compile

    def no_nvrtc() -> str:
        raise ImportError("no NVRTC library")

    monkeypatch.setattr(nvrtc_compile, "nvrtc_release", no_nvrtc)  # no compiler at all
    fake.nvcc.unlink()
    result = cli(["--d", "64", "--limit", "1"])
    assert result.exit_code == 1
    assert "cannot run nvcc" in result.output


def test_cli_build_without_template(cli: Callable[[list[str]], Result], fake: Fake) -> None:
    (fake.templates / "fa2_fwd.cuh").unlink()
    result = cli(["--d", "64", "--limit", "1"])
    assert result.exit_code == 1
    assert "fa2_fwd.cuh not found" in result.output
