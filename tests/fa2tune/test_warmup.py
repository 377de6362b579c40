"""``fa2tune warmup``: the op's decisions for a workload's calls, built ahead into the cache
the op reads (a first call then compiles nothing), with bad input as usage errors."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from codegen.build import build_batch
from core import settings as settings_module
from core.settings import override_settings
from core.shape import Shape
from fa2tune.cli import app
from fa2tune.ops import choice
from fa2tune.ops.choice import Call, choose
from fa2tune.ops.warmup import GpuTarget, call_of, plan
from tuner.workload import load_workload

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "examples" / "workloads" / "smoke.yaml"
H200 = GpuTarget("NVIDIA H200", 132, "9.0")
runner = CliRunner()


@pytest.fixture
def isolated(tmp_path: Path) -> Iterator[Path]:
    """A fresh database (the shipped results load into it) and build cache for the op."""
    saved = dict(settings_module._overrides)
    override_settings(db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", cache_dir=tmp_path / "cache")
    choice.reset_store()
    yield tmp_path / "cache"
    choice.reset_store()
    settings_module._overrides.clear()
    settings_module._overrides.update(saved)


def test_each_call_gets_the_ops_own_decision(isolated: Path) -> None:
    """The same Call the op makes (a one-row causal call is served unmasked), so the same
    choice; the smoke workload's three calls are tuned for the H200 nowhere, so defaults."""
    targets = load_workload(SMOKE).targets
    store = choice.open_store()
    planned = plan(store, targets, H200)
    assert [p.target for p in planned] == list(targets)
    for p in planned:
        call = call_of(p.target, H200)
        assert p.choice == choose(store, call)
    decode = [p for p in planned if p.target.shape.nq == 1]
    assert decode and all(call_of(p.target, H200).causal is False for p in decode)
    one_row = call_of(decode[0].target, H200)
    assert isinstance(one_row, Call) and one_row.shape == Shape(1, 512, 1, 4, 2)


def test_a_cache_entry_plans_the_cache_kernel_of_its_layout(isolated: Path) -> None:
    """An entry over a KV cache builds what attention_with_kvcache will run: the cache twin of
    its layout (contiguous, pages of 16), not the dense call's kernel."""
    from fa2tune.ops.cache_choice import cache_choice

    path = isolated.parent / "serving.json"
    entry = {"d": 128, "dtype": "bf16", "causal": False, "heads": 32, "kv_heads": 8,
             "batch": 8, "nq": 1, "nk": 8192}  # fmt: skip
    path.write_text(json.dumps([{**entry, "kv_page": [0, 16]}, entry]))
    store = choice.open_store()
    contiguous, paged, dense = plan(store, load_workload(path).targets, H200)
    for p, page in ((contiguous, 0), (paged, 16)):
        assert p.choice is not None and p.choice.config.kvcache and p.choice.config.page == page
        assert p.choice == cache_choice(store, call_of(p.target, H200), page)
    assert dense.choice is not None and not getattr(dense.choice.config, "kvcache", False)


def test_a_gpu_that_cannot_be_decided_for_is_a_usage_error(isolated: Path) -> None:
    unknown = runner.invoke(app, ["warmup", "--workload", str(SMOKE), "--gpu", "Nope 9000"])
    assert unknown.exit_code == 2
    assert "give its --arch and --sms" in " ".join(unknown.output.split())
    bad_arch = runner.invoke(
        app, ["warmup", "--workload", str(SMOKE), "--gpu", "H200", "--arch", "sm_95"]
    )
    assert bad_arch.exit_code == 2 and "sm_95" in bad_arch.output
    missing = runner.invoke(
        app, ["warmup", "--workload", str(isolated / "none.yaml"), "--gpu", "H200"]
    )
    assert missing.exit_code == 2 and "none.yaml" in missing.output


@pytest.mark.compile
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_warmup_fills_the_cache_the_op_reads(isolated: Path) -> None:
    """After warmup, the op's own first-use build (``build_configs([config], arch)`` in
    fa2tune/ops/kernels.py, the same as this) compiles nothing: every cubin is cached."""
    result = runner.invoke(
        app, ["warmup", "--workload", str(SMOKE), "--gpu", "H200", "--json", "-j", "2"]
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout[result.stdout.index("[") :])
    assert len(rows) == 3 and all(r["build"]["status"] in ("OK", "SPILLS") for r in rows)
    configs = {p.choice.config for p in plan(choice.open_store(), load_workload(SMOKE).targets,
                                             H200) if p.choice is not None}  # fmt: skip
    again = build_batch(sorted(configs, key=lambda c: c.name), arch="sm_90")
    assert (again.built, again.cached) == (0, len(configs))
    # A second warmup has nothing to do either.
    second = runner.invoke(app, ["warmup", "--workload", str(SMOKE), "--gpu", "H200"])
    assert second.exit_code == 0 and "0 built" in second.output, second.output
