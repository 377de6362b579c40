"""The exported header escapes whatever it quotes (issue 15).

GPU names, versions and file names come from results files: a backslash at the end of a
``//`` line must not splice the next line into the comment, control characters must not reach
a comment, C string literals escape quotes, backslashes and control bytes, and the re-export
command is shell-quoted. One compiler run checks that the header's host part builds and that
the string literals hold exactly the bytes meant.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from codegen.cpp_text import c_string as _c_string
from codegen.export import TunedPoint, render_header
from codegen.families.fa2.space import fa2_default_config
from core.gpu_name import normalize_gpu_name

WHEN = datetime(2026, 11, 30, tzinfo=UTC)

HOSTILE = [
    "NVIDIA H200\\",  # a backslash at the end of a // line
    "NVIDIA H200 \\ ",  # ... followed by blanks (compilers still splice)
    'Evil "GPU" */ /* x',
    "it's an H200; rm -rf / #",
    "H200\n#error spliced",
    "H200\x00\r\x0b\x0c\x1b[2J\u202e\u2028",
    "H200 ??/",
    "$(touch pwned) `id` H200",
]


def _header(name: str, *, tail: str = "") -> str:
    config = fa2_default_config(64, "fp16", False)
    point = TunedPoint(
        d=64,
        dtype="fp16",
        causal=False,
        n=4096,
        config=config,
        median_ms=0.1,
        tflops=100.0,
        arch="sm_90",
        source_hash="abc" + tail,
        nvcc_version="release 12.6" + tail,
        driver_version="550.54" + tail,
        cuda_version="12.4" + tail,
        measured_at=WHEN,
    )
    return render_header(
        name, [point], ds=[64], dtypes=["fp16"], generated_at=WHEN, filename="x\\ y'.cuh"
    )


def _preamble(header: str) -> list[str]:
    lines = header.splitlines()
    return lines[: next(i for i, line in enumerate(lines) if "PUBLIC API" in line)]


@pytest.mark.parametrize("name", HOSTILE)
def test_comments_stay_comments(name: str) -> None:
    header = _header(name, tail=name)
    assert "\x00" not in header and "\r" not in header and "\u202e" not in header
    for line in header.split("\n"):
        if line.lstrip().startswith("//"):
            assert not line.rstrip().endswith("\\"), repr(line)
    preamble = _preamble(header)
    assert preamble and all(line.startswith("//") for line in preamble), preamble
    assert "#error" not in "\n".join(line for line in header.split("\n") if line.startswith("#"))


@pytest.mark.parametrize("name", HOSTILE)
def test_re_export_command_is_shell_quoted(name: str) -> None:
    command = next(line for line in _preamble(_header(name)) if "fa2tune export" in line)
    args = shlex.split(command.removeprefix("//").rstrip(" /"))
    gpu = args[args.index("--gpu") + 1]
    # The name itself, or (when a comment cannot hold it) its key, which matches the same GPU.
    assert gpu in (name, normalize_gpu_name(name))
    assert normalize_gpu_name(gpu) == normalize_gpu_name(name)
    assert args[args.index("-o") + 1] == "x\\ y'.cuh"
    assert args[:2] == ["fa2tune", "export"] and len(args) == 10, args


def test_c_string_escapes() -> None:
    assert _c_string('a"b\\c') == '"a\\"b\\\\c"'
    assert _c_string("x\n\x00?") == '"x\\012\\000\\?"'
    assert _c_string("é") == '"\\303\\251"'  # octal: never swallows a following hex digit


PROBE = """\
#include "fa2_tuned.cuh"
#include <cstdio>
static const char kHostile[] = {literal};
int main() {{
  std::printf("%s\\n", fa2tune_detail::kTunedGpu);
  for (unsigned i = 0; i + 1 < sizeof kHostile; ++i)
    std::printf("%02x", (unsigned char)kHostile[i]);
  std::printf("\\n");
  return 0;
}}
"""


@pytest.mark.compile
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_hostile_header_compiles_and_strings_hold_their_bytes(tmp_path: Path) -> None:
    """One nvcc run: the header for the most hostile name builds (a spliced comment would eat
    code, an unescaped quote would end a literal) and its literals are exactly the bytes."""
    name = "".join(HOSTILE)
    (tmp_path / "fa2_tuned.cuh").write_text(_header(name, tail=name), encoding="utf-8")
    (tmp_path / "probe.cu").write_text(PROBE.format(literal=_c_string(name)), encoding="utf-8")
    nvcc = shutil.which("nvcc")
    assert nvcc is not None
    proc = subprocess.run(
        [nvcc, "-std=c++17", "-gencode=arch=compute_80,code=sm_80", "probe.cu", "-o", "probe"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"nvcc failed:\n{proc.stdout}\n{proc.stderr}"
    out = subprocess.run(
        [str(tmp_path / "probe")], capture_output=True, timeout=60, check=True
    ).stdout.decode()
    key, hostile = out.splitlines()
    assert key == normalize_gpu_name(name)
    assert bytes.fromhex(hostile) == name.encode("utf-8")
