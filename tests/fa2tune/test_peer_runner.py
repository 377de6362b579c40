"""bench/peer's runner of FlashAttention-3's tests, on a tiny fake test module (CPU).

The script is run on a fake peer folder whose ``test_flash_attn.py`` imports
``flash_attn_interface`` (the alias must resolve to fa2tune.flash_attn), with tests that
pass, fail, skip, raise NotImplementedError through the real interface (CPU tensors, no
fallback) and one that is not applicable; the summary's counts per function, the sample, the
reasons and the exit status are checked. Skipped without torch (the alias imports it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "peer" / "run_fa3_tests.sh"

FAKE_TESTS = """
import pytest
import torch
from einops import rearrange  # the real suite imports it: the runner checks it is there
from flash_attn_interface import flash_attn_func, flash_attn_varlen_func


@pytest.mark.parametrize("i", range(6))
def test_passes(i):
    assert flash_attn_func.__module__ == "fa2tune.flash_attn"


@pytest.mark.parametrize("i", range(4))
def test_unsupported(i):
    q = torch.randn(1, 4, 2, 64)
    flash_attn_func(q, q, q, causal=bool(i % 2))  # CPU tensors: NotImplementedError


@pytest.mark.parametrize("i", range(2))
def test_fails(i):
    assert i < 0, "a real failure"


@pytest.mark.parametrize("i", range(2))
def test_skips(i):
    pytest.skip("not on this build")


def test_flash3_bw_compatibility():
    assert torch.ops.flash_attn_3.fwd  # FlashAttention-3's own extension: not ours
"""


@pytest.fixture
def peer(tmp_path: Path) -> Path:
    folder = tmp_path / "peer"
    folder.mkdir()
    (folder / "test_flash_attn.py").write_text(FAKE_TESTS)
    stubs = tmp_path / "stubs"
    (stubs / "einops").mkdir(parents=True)
    (stubs / "einops" / "__init__.py").write_text("def rearrange(*a, **k):\n    pass\n")
    return folder


def _run(peer: Path, *args: str, every: int = 2, where: str = "",
         ) -> tuple[int, dict[str, Any], str]:  # fmt: skip
    out = peer.parent / "out"
    env = {
        **os.environ,
        "FA2TUNE_PEER_WHERE": where,
        "PYTHON": sys.executable,
        "FA2TUNE_PEER_EVERY": str(every),
        "FA2TUNE_PEER_WORKERS": "0",
        "FA2TUNE_PEER_OUT": str(out),
        "PYTHONPATH": str(peer.parent / "stubs"),
    }
    env.pop("OUT", None)
    proc = subprocess.run(["bash", str(SCRIPT), str(peer), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    path = out / "summary.json"
    summary = json.loads(path.read_text()) if path.exists() else {}
    return proc.returncode, summary, proc.stdout + proc.stderr


def test_runner_counts_each_function_and_samples(peer: Path) -> None:
    code, summary, log = _run(peer)
    assert code == 1, log  # one real failure in the sample
    fns = {name.split("::")[-1]: counts for name, counts in summary["functions"].items()}
    assert fns["test_passes"] == {"collected": 6, "selected": 3, "passed": 3}
    assert fns["test_unsupported"] == {"collected": 4, "selected": 2, "unsupported": 2}
    assert fns["test_fails"] == {"collected": 2, "selected": 1, "failed": 1}
    assert fns["test_skips"] == {"collected": 2, "selected": 1, "skipped": 1}
    assert "test_flash3_bw_compatibility" not in fns
    assert "test_flash3_bw_compatibility" in summary["not_applicable"]
    assert summary["total"] == {"selected": 7, "passed": 3, "unsupported": 2, "failed": 1,
                                "skipped": 1}  # fmt: skip
    (reason, n), *_ = summary["unsupported_reasons"]
    assert n == 2 and "cpu" in reason and "fa2tune does not run this call" in reason
    assert "a real failure" in summary["failures"][0][0]
    text = (peer.parent / "out" / "summary.txt").read_text()
    assert "test_unsupported" in text and "unsupported (NotImplementedError)" in text
    assert "test_unsupported" in log  # printed at the end too


def test_runner_exit_status_ignores_unsupported(peer: Path) -> None:
    code, summary, log = _run(peer, "-k", "not fails", every=1)
    assert code == 0, log
    assert summary["total"] == {"selected": 12, "passed": 6, "unsupported": 4, "skipped": 2}


def test_runner_keeps_only_the_items_the_where_expression_accepts(peer: Path) -> None:
    # Items without the named parameter (test_flash3_..., none here) and items whose
    # parameter fails the test are left out; the sample is taken within what is kept.
    code, summary, log = _run(peer, every=1, where="i % 2 == 1")
    assert code == 1, log
    fns = {name.split("::")[-1]: counts for name, counts in summary["functions"].items()}
    assert fns["test_passes"] == {"collected": 6, "selected": 3, "passed": 3}
    assert fns["test_unsupported"] == {"collected": 4, "selected": 2, "unsupported": 2}
    assert fns["test_fails"]["selected"] == 1 and fns["test_skips"]["selected"] == 1
    code, summary, log = _run(peer, every=2, where="i >= 2 and not undefined_name")
    assert summary["total"] == {}, log  # the name error leaves every item out


def test_where_expression_that_does_not_parse_is_a_usage_error(peer: Path) -> None:
    code, _, log = _run(peer, where="i ==")
    assert code != 0 and "FA2TUNE_PEER_WHERE does not parse" in log


def test_runner_needs_the_peer_folder(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "nowhere")], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2 and "no test_flash_attn.py" in proc.stderr


def test_sample_is_per_function_and_deterministic() -> None:
    sys.path.insert(0, str(ROOT / "bench" / "peer"))
    try:
        from peer_plugin import sample
    finally:
        sys.path.remove(str(ROOT / "bench" / "peer"))
    ids = [f"t.py::a[{i}]" for i in range(5)] + ["t.py::b[0]"] + [f"t.py::c[{i}]" for i in range(3)]
    assert sample(ids, 2, 0) == [True, False, True, False, True, True, True, False, True]
    assert sample(ids, 2, 1) == [False, True, False, True, False, False, False, True, False]
    assert sample(ids, 1, 0) == [True] * len(ids)


CHOICE_TESTS = """
import logging

import pytest
import torch
from flash_attn_interface import flash_attn_func

FAMILIES = {0: ["fa3"], 1: ["splitkv"], 2: ["fa3", "splitkv"], 3: []}


@pytest.mark.parametrize("i", range(4))
def test_logs_choices(i):
    # what fa2tune's choice lines look like (FA2TUNE_PRINT_CHOICE): one per decided call
    for family in FAMILIES[i]:
        logging.getLogger("fa2tune.ops.kvcache").warning(
            "fa2tune.torch: kvcache %s_d128_bf16_causal_m128_n128_kvc (tuned) for B=1", family)
    assert logging.getLogger("fa2tune").getEffectiveLevel() <= logging.INFO


def test_refused():
    q = torch.randn(1, 4, 2, 64)
    flash_attn_func(q, q, q)  # CPU tensors: NotImplementedError, no kernel decided
"""


def test_runner_counts_the_kernel_families_each_item_ran(peer: Path) -> None:
    (peer / "test_flash_attn.py").write_text(CHOICE_TESTS)
    code, summary, log = _run(peer, every=1)
    assert code == 0, log
    kernels = {name.split("::")[-1]: c for name, c in summary["kernels"].items()}
    assert kernels == {"test_logs_choices": {"fa3": 2, "none": 1, "splitkv": 2},
                       "test_refused": {"none": 1}}  # fmt: skip
    text = (peer.parent / "out" / "summary.txt").read_text()
    assert "test_logs_choices: fa3 2, none 1, splitkv 2" in text
