"""Real nvcc builds of the fa3 (sm_90a wgmma/TMA) family through the product's build.

A sample of the space built with :func:`codegen.build.build_configs` (for an sm_90 GPU, so
the registry compiles the Hopper family for sm_90a), spill-free and with the wgmma pipeline
intact; the template refusing a config outside the space; and the kernel's shared-memory
constant agreeing with :attr:`core.fa3_config.Fa3Config.smem_bytes`.

Marked ``compile``; skipped when nvcc is not on PATH. About 9 nvcc calls of 1-6 s each, run
one at a time (the development machine's cores are shared).
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from codegen.build import build_configs
from codegen.families import family
from codegen.families.fa3 import space as fa3_space
from codegen.families.fa3.space import ARCH, invalid_reasons
from codegen.ninja import LOG_SUFFIX
from core.build_report import BuildStatus
from core.fa3_config import Fa3Config
from core.settings import get_settings
from tests.support.nvcc import compile_fa3_harness

NVCC = get_settings().nvcc
pytestmark = [
    pytest.mark.compile,
    pytest.mark.skipif(shutil.which(NVCC) is None, reason=f"nvcc ({NVCC!r}) is not on PATH"),
]

#: Configs built here; every one is claimed spill-free (ptxas, CUDA 13.0).
SPILL_FREE: list[Fa3Config] = [
    Fa3Config(128, "fp16", False),  # step 1: RS, intra-WG overlap, ping-pong, 2 stages
    Fa3Config(128, "bf16", True, block_n=176),
    Fa3Config(128, "fp16", True, pv_regs=False),  # SS
    Fa3Config(128, "fp16", False, overlap=False, pingpong=False),
    Fa3Config(64, "fp16", False, block_m=192, block_n=128, pv_regs=False, pingpong=False,
              consumer_regs=160),
    Fa3Config(256, "bf16", True, block_n=80),
    Fa3Config(96, "fp16", False, block_n=128),
]  # fmt: skip


def test_sample_builds_for_sm90a_without_spills(tmp_path: Path) -> None:
    assert all(invalid_reasons(c) == [] for c in SPILL_FREE)
    reports = build_configs(SPILL_FREE, "sm_90", cache_dir=tmp_path, jobs=1)
    for config, r in zip(SPILL_FREE, reports, strict=True):
        assert r.config == config and r.arch == ARCH, r
        assert r.status == BuildStatus.OK, f"{config.name}: {r.status} {r.error}"
        assert r.registers is not None and 24 <= r.registers <= 255
        assert (r.spill_stores, r.spill_loads, r.stack_bytes) == (0, 0, 0)
        assert r.cubin is not None
        log = r.cubin.with_name(config.name + LOG_SUFFIX).read_text()
        # ptxas must not have serialised the wgmma pipeline (C7510 etc.) or ignored setmaxnreg.
        assert "serialized" not in log and "C7508" not in log, log
        data = r.cubin.read_bytes()
        assert data[:4] == b"\x7fELF" and config.name.encode() in data


def test_static_assert_rejects_invalid_config(tmp_path: Path) -> None:
    # Ping-pong needs two consumer warpgroups; 192-row blocks have three.
    bad = Fa3Config(128, "fp16", False, block_m=192, pingpong=True, consumer_regs=160)
    assert invalid_reasons(bad)
    ok, log = compile_fa3_harness(family("fa3").render(bad), "fa3_bad", tmp_path)
    assert not ok
    assert "ping-pong needs exactly 2 consumer warpgroups" in log


def test_smem_formula_matches_traits(tmp_path: Path) -> None:
    # The kernel's constexpr and the host formula must agree: compile a static_assert.
    cfgs = [
        Fa3Config(128, "fp16", False),
        Fa3Config(256, "fp16", False, block_n=80),
        Fa3Config(64, "bf16", False, block_m=192, block_n=160, pv_regs=False, pingpong=False,
                  consumer_regs=160),
    ]  # fmt: skip
    render = family("fa3").render
    body = "".join(render(c) for c in cfgs).replace('#include "fa3_fwd.cuh"\n', "")
    checks = [f"static_assert({c.name}_traits::kSmemBytes == {c.smem_bytes});" for c in cfgs]
    ok, log = compile_fa3_harness(
        '#include "fa3_fwd.cuh"\n' + body + "\n".join(checks) + "\n", "smem", tmp_path
    )
    assert ok, log[-3000:]


#: Spill bytes (stores + loads) a varlen seed may have beyond its dense twin when the twin
#: spills already: only the 192-row D=128 seeds do (128 registers for three consumer
#: warpgroups), and there ptxas moves a few words either way between the two kernels.
VARLEN_SPILL_SLACK = 16


def test_varlen_seeds_build_with_no_more_spills_than_their_dense_twins(tmp_path: Path) -> None:
    """The `_vl` seeds for D 64/128, causal/full (fp16 for one mask, bf16 for the other:
    the element type changes no register or pipeline decision of the varlen path, and the
    sample halves the compile tier's longest test): sm_90a builds whose registers and spills
    are those of the dense twin (spill-free where it is), pipeline intact."""
    pairs = [
        (c, replace(c, varlen=False))
        for d in (64, 128)
        for dtype, causal in (("fp16", True), ("bf16", False))
        for c in fa3_space.seed_configs(d, dtype, causal, varlen=True)  # type: ignore[arg-type]
    ]
    assert pairs and all(c.varlen and not twin.varlen for c, twin in pairs)
    configs = [c for pair in pairs for c in pair]
    reports = {r.config: r for r in build_configs(configs, "sm_90", cache_dir=tmp_path, jobs=2)}
    usable = (BuildStatus.OK, BuildStatus.SPILLS)
    for vl, dense in pairs:
        r, rd = reports[vl], reports[dense]
        assert r.status in usable and rd.status in usable, (r, rd)
        assert r.registers is not None and r.registers <= 255
        spills, dense_spills = r.spill_stores + r.spill_loads, rd.spill_stores + rd.spill_loads
        if dense_spills == 0:
            assert r.status == BuildStatus.OK and spills == 0, (r, rd)
        else:
            assert spills <= dense_spills + VARLEN_SPILL_SLACK, (r, rd)
        assert r.cubin is not None
        log = r.cubin.with_name(vl.name + LOG_SUFFIX).read_text()
        assert "serialized" not in log and "C7508" not in log, log
        assert vl.name.encode() in r.cubin.read_bytes()


def test_varlen_traits_agree_with_the_dense_ones(tmp_path: Path) -> None:
    # Same shared memory and thread count as the dense twin (the host uses one formula).
    vl = replace(Fa3Config(128, "bf16", True), varlen=True)
    body = family("fa3").render(vl).replace('#include "fa3_fwd.cuh"\n', "")
    checks = [
        f"static_assert({vl.name}_traits::kSmemBytes == {vl.smem_bytes});",
        f"static_assert({vl.name}_traits::kThreads == {vl.threads});",
        f"static_assert({vl.name}_traits::Varlen);",
        "static_assert(!fa3::Traits<128, __half, true, 128, 128, 2, true, true, true, 240>"
        "::Varlen);",
    ]
    ok, log = compile_fa3_harness(
        '#include "fa3_fwd.cuh"\n' + body + "\n".join(checks) + "\n", "vl", tmp_path
    )
    assert ok, log[-3000:]
