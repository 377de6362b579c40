"""core.gpu_name: one GPU-name rule for the store, the service and the exported header's C++."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from core.gpu_name import normalize_gpu_name

ROOT = Path(__file__).resolve().parents[2]
CPP_RULE = ROOT / "codegen" / "templates" / "gpu_name.cuh"
SHIPPED = ROOT / "db" / "data"

# Names as drivers report them, as users write them, and edge cases of the rule.
NAMES = [
    "NVIDIA H200",
    "NVIDIA-H200",
    "nvidia_h200",
    "H200",
    "h200",
    "  NVIDIA   H200 ",
    "NVIDIA\tH200\n",
    "NVIDIA A100-SXM4-80GB",
    "NVIDIA H100 80GB HBM3",
    "NVIDIA GeForce RTX 4090",
    "NVIDIA RTX 6000 Ada Generation",
    "Quadro RTX 6000 (rev. 2)",
    "Tesla NVIDIA X",
    "nvidia nvidia h200",
    "NVIDIAH200",
    "NVIDIA",
    "nvidia-",
    "",
    "---",
    "NVIDIA H200 Überkarte",
    "x" * 300,
]


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA-H200", "h200"),  # matched in the header before; now in the store too
        ("h200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100 sxm4 80gb"),
        ("Tesla NVIDIA X", "tesla nvidia x"),
        ("nvidia nvidia h200", "nvidia h200"),
        ("NVIDIA", ""),
        ("NVIDIA H200 Überkarte", "h200 berkarte"),  # only ASCII counts, as in the C++
    ],
)
def test_rule(name: str, key: str) -> None:
    assert normalize_gpu_name(name) == key


def _old_store_rule(name: str) -> str:
    # db.store.normalize_gpu_name before the rules were merged: the keys stored in gpus.name_key.
    key = re.sub(r"\s+", " ", name.strip()).casefold()
    return re.sub(r"^nvidia\s+", "", key)


def test_shipped_gpu_names_keep_their_keys() -> None:
    files = sorted(SHIPPED.glob("*.json"))
    assert files, "no shipped results"
    for f in files:
        for gpu in json.loads(f.read_text())["gpus"]:
            name = gpu["name"]
            assert normalize_gpu_name(name) == _old_store_rule(name), name
            for query in (name, name.upper(), name.lower(), name.removeprefix("NVIDIA ")):
                assert normalize_gpu_name(query) == normalize_gpu_name(name)


def test_store_and_service_use_the_rule() -> None:
    import db.store
    import service.index

    assert db.store.normalize_gpu_name is normalize_gpu_name
    assert service.index.gpu_key("NVIDIA-H200") == "h200"


PROBE = r"""
#include "gpu_name.cuh"
#include <cstdio>
#include <cstring>
// Prints the key of every argument, one per line, in brackets (an empty key is visible).
int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    char key[512];
    fa2tune_detail::normalise_name(argv[i], key, sizeof(key));
    std::printf("[%s]\n", key);
  }
  return 0;
}
"""


def _host_compiler() -> list[str] | None:
    if gxx := shutil.which("g++"):
        return [gxx, "-std=c++17", "-x", "c++"]
    if nvcc := shutil.which("nvcc"):
        return [nvcc, "-std=c++17", "-x", "cu"]
    return None


@pytest.mark.skipif(_host_compiler() is None, reason="neither g++ nor nvcc is on PATH")
def test_cpp_rule_agrees_with_python(tmp_path: Path) -> None:
    compiler = _host_compiler()
    assert compiler is not None
    (tmp_path / "probe.cpp").write_text(PROBE)
    exe = tmp_path / "probe"
    proc = subprocess.run(
        [*compiler, "-I", str(CPP_RULE.parent), str(tmp_path / "probe.cpp"), "-o", str(exe)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out = subprocess.run([str(exe), *NAMES], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"[{normalize_gpu_name(n)}]" for n in NAMES]
