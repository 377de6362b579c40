"""build.ninja rendering (a pure function), flags, hashing and the nvcc job runner."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from codegen import nvcc_job
from codegen.build import DEFAULT_FLAGS, arch_flags, nvcc_flags, source_hash
from codegen.ninja import NinjaEntry, ninja_binary, ninja_escape_path, render_ninja


def entries(root: Path, names: list[str]) -> list[NinjaEntry]:
    return [NinjaEntry.in_directory(n, root / f"{n}-0123456789abcdef") for n in names]


@pytest.mark.parametrize(
    ("arch", "flag"),
    [
        ("sm_80", "-gencode=arch=compute_80,code=sm_80"),
        ("sm_86", "-gencode=arch=compute_86,code=sm_86"),
        ("sm_89", "-gencode=arch=compute_89,code=sm_89"),
        ("sm_90", "-gencode=arch=compute_90,code=sm_90"),
        ("sm_90a", "-gencode=arch=compute_90a,code=sm_90a"),  # the Hopper family's target
    ],
)
def test_arch_flags(arch: str, flag: str) -> None:
    assert arch_flags(arch) == [flag]
    assert nvcc_flags(arch) == [*DEFAULT_FLAGS, flag]


@pytest.mark.parametrize("arch", ["sm_70", "90", "sm_89a", "compute_90", ""])
def test_arch_flags_rejects_unknown(arch: str) -> None:
    with pytest.raises(ValueError, match="unsupported architecture"):
        arch_flags(arch)


def test_default_flags() -> None:
    assert DEFAULT_FLAGS == ("-O3", "-std=c++17", "-cubin", "-Xptxas", "-v", "-lineinfo")
    assert "--use_fast_math" not in DEFAULT_FLAGS


def test_source_hash_covers_every_input() -> None:
    base = ("t" * 64, "src", ["-O3"], "release 13.0", "sm_90")
    h = source_hash(*base)
    assert len(h) == 16 and h == source_hash(*base)
    variants = [
        ("u" * 64, "src", ["-O3"], "release 13.0", "sm_90"),
        ("t" * 64, "src2", ["-O3"], "release 13.0", "sm_90"),
        ("t" * 64, "src", ["-O2"], "release 13.0", "sm_90"),
        ("t" * 64, "src", ["-O3"], "release 12.8", "sm_90"),
        ("t" * 64, "src", ["-O3"], "release 13.0", "sm_80"),
        ("t" * 64, "src", ["-O", "3"], "release 13.0", "sm_90"),
    ]
    assert len({h, *(source_hash(*v) for v in variants)}) == 1 + len(variants)


def test_ninja_escape_path() -> None:
    assert ninja_escape_path("/a b/c:d/$e") == "/a$ b/c$:d/$$e"
    with pytest.raises(ValueError, match="newline"):
        ninja_escape_path("/a\nb")


def test_render_ninja_is_pure_and_complete(tmp_path: Path) -> None:
    es = entries(tmp_path, ["k1", "k2"])
    kwargs = {"python": "/py/python3", "runner": "/pkg/nvcc_job.py", "timeout_s": 60.0}
    text = render_ninja(es, "/cuda/bin/nvcc", ["-O3", "-I", "/t"], **kwargs)  # type: ignore[arg-type]
    assert text == render_ninja(es, "/cuda/bin/nvcc", ["-O3", "-I", "/t"], **kwargs)  # type: ignore[arg-type]
    assert "rule nvcc_job" in text
    assert "flags = -O3 -I /t" in text
    assert "timeout = 60" in text
    assert text.count("\nbuild ") == 2
    for e in es:
        assert f"build {e.result}: nvcc_job {e.source}" in text
        assert f"  name = {e.name}" in text


def test_render_ninja_rejects_duplicate_outputs(tmp_path: Path) -> None:
    es = entries(tmp_path, ["k1", "k1"])
    with pytest.raises(ValueError, match="same result"):
        render_ninja(es, "nvcc", [])


def test_render_ninja_escapes_paths_with_spaces(tmp_path: Path) -> None:
    """Ninja itself must read the file back into exactly the intended argv."""
    root = tmp_path / "cache dir with spaces" / "sm_90"
    es = entries(root, ["k1"])
    tdir = tmp_path / "tmpl $dir"
    flags = ["-O3", "-I", str(tdir)]
    text = render_ninja(es, "/opt/cuda 13/bin/nvcc", flags, python="/py 3/python", runner="/r/j.py")
    ninja_file = tmp_path / "build.ninja"
    ninja_file.write_text(text)
    out = subprocess.run(
        [ninja_binary(), "-f", str(ninja_file), "-t", "commands"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout.strip()
    argv = shlex.split(out)
    e = es[0]
    assert argv[:2] == ["/py 3/python", "/r/j.py"]
    assert argv[argv.index("--nvcc") + 1] == "/opt/cuda 13/bin/nvcc"
    assert argv[argv.index("--src") + 1] == str(e.source)
    assert argv[argv.index("--cubin") + 1] == str(e.cubin)
    assert argv[argv.index("--log") + 1] == str(e.log)
    assert argv[argv.index("--result") + 1] == str(e.result)
    assert argv[argv.index("--") + 1 :] == flags
    # The build line's output path round-trips too.
    targets = subprocess.run(
        [ninja_binary(), "-f", str(ninja_file), "-t", "targets", "all"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout
    assert f"{e.result}: nvcc_job" in targets


FAKE_NVCC = """\
import sys
import time
args = sys.argv[1:]
out = args[args.index("-o") + 1]
src = open(args[-1]).read()
sys.stderr.write("ptxas info    : Used 10 registers\\n")
if "FAIL" in src:
    sys.stderr.write("x.cu(1): error: broken on purpose\\n")
    sys.exit(2)
open(out, "wb").write(b"cubin:" + " ".join(args[:-3]).encode())
"""


def test_nvcc_job_records_success_and_failure(tmp_path: Path) -> None:
    fake = tmp_path / "fake_nvcc.py"
    fake.write_text(FAKE_NVCC)
    wrapper = tmp_path / "nvcc"
    wrapper.write_text(
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(fake))} "$@"\n'
    )
    wrapper.chmod(0o755)
    for name, body in (("good", "ok"), ("bad", "FAIL")):
        e = NinjaEntry.in_directory(name, tmp_path / name)
        e.source.parent.mkdir()
        e.source.write_text(body)
        argv = [
            "--nvcc",
            str(wrapper),
            "--src",
            str(e.source),
            "--cubin",
            str(e.cubin),
            "--log",
            str(e.log),
            "--result",
            str(e.result),
            "--",
            "-O3",
            "-Xptxas",
            "-v",
        ]
        assert nvcc_job.main(argv) == 0, "the job never fails"
        result = json.loads(e.result.read_text())
        assert result["finished"] is True and result["seconds"] >= 0
        assert "ptxas info" in e.log.read_text()
        if name == "good":
            assert result["returncode"] == 0 and result["cubin"] == "good.cubin"
            assert e.cubin.read_bytes() == b"cubin:-O3 -Xptxas -v"
        else:
            assert result["returncode"] == 2 and result["cubin"] is None
            assert not e.cubin.exists()
            assert "broken on purpose" in e.log.read_text()
        leftovers = [p.name for p in e.source.parent.iterdir() if p.name.startswith(".")]
        assert leftovers == []


def test_nvcc_job_survives_a_missing_nvcc(tmp_path: Path) -> None:
    e = NinjaEntry.in_directory("k", tmp_path)
    e.source.write_text("")
    argv = [
        "--nvcc",
        str(tmp_path / "no-nvcc"),
        "--src",
        str(e.source),
        "--cubin",
        str(e.cubin),
        "--log",
        str(e.log),
        "--result",
        str(e.result),
    ]
    assert nvcc_job.main(argv) == 0
    assert json.loads(e.result.read_text())["returncode"] == 127
    assert "cannot run" in e.log.read_text()


def test_nvcc_job_timeout(tmp_path: Path) -> None:
    slow = tmp_path / "slow"
    # A background child keeps the output pipe open, like ptxas under nvcc: the whole process
    # group must be killed or the job would wait for it.
    slow.write_text("#!/bin/sh\nsleep 30 &\nsleep 30\n")
    slow.chmod(0o755)
    e = NinjaEntry.in_directory("k", tmp_path)
    e.source.write_text("")
    argv = [
        "--nvcc",
        str(slow),
        "--timeout",
        "0.3",
        "--src",
        str(e.source),
        "--cubin",
        str(e.cubin),
        "--log",
        str(e.log),
        "--result",
        str(e.result),
    ]
    start = time.monotonic()
    assert nvcc_job.main(argv) == 0
    assert time.monotonic() - start < 10
    result = json.loads(e.result.read_text())
    assert result["timed_out"] is True and result["returncode"] != 0
    assert "timed out" in e.log.read_text()
