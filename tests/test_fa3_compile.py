"""Real nvcc builds of the fa3 (sm_90a wgmma/TMA) template: a sample of the space and a refusal.

Marked ``compile``; skipped when nvcc is not on PATH. About 8 nvcc calls of 1-6 s each, run one
at a time (the development machine's cores are shared).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "hopper"))

from fa3_host import (
    Fa3Config,
    compile_config,
    compile_source,
    invalid_reasons,
    render,
    smem_bytes,
)

try:
    from fa2tune.settings import get_settings

    NVCC = get_settings().nvcc
except ImportError:  # the harness alone (no product install): plain nvcc
    NVCC = "nvcc"
pytestmark = [
    pytest.mark.compile,
    pytest.mark.skipif(shutil.which(NVCC) is None, reason=f"nvcc ({NVCC!r}) is not on PATH"),
]

#: Configs built here; every one is claimed spill-free (ptxas, CUDA 13.0).
SPILL_FREE: list[Fa3Config] = [
    Fa3Config(128, "fp16"),  # step 1: RS, intra-WG overlap, ping-pong, 2 stages
    Fa3Config(128, "bf16", causal=True, block_n=176),
    Fa3Config(128, "fp16", causal=True, pv_regs=False),  # SS
    Fa3Config(128, "fp16", overlap=False, pingpong=False),
    Fa3Config(64, "fp16", block_m=192, block_n=128, pv_regs=False, pingpong=False,
              consumer_regs=160),
    Fa3Config(256, "bf16", causal=True, block_n=80),
    Fa3Config(96, "fp16", block_n=128),
]


@pytest.mark.parametrize("config", SPILL_FREE, ids=lambda c: c.name)
def test_config_builds_without_spills(config: Fa3Config, tmp_path: Path) -> None:
    assert invalid_reasons(config) == []
    r = compile_config(config, tmp_path, nvcc=NVCC)
    assert r.ok, r.log[-3000:]
    assert r.regs is not None and 24 <= r.regs <= 255
    assert (r.spill_stores, r.spill_loads, r.stack) == (0, 0, 0), r.log
    # ptxas must not have serialised the wgmma pipeline (C7510 etc.) or ignored setmaxnreg.
    assert "serialized" not in r.log and "C7508" not in r.log, r.log
    assert r.cubin is not None
    data = r.cubin.read_bytes()
    assert data[:4] == b"\x7fELF" and config.name.encode() in data


def test_static_assert_rejects_invalid_config(tmp_path: Path) -> None:
    # Ping-pong needs two consumer warpgroups; 192-row blocks have three.
    bad = Fa3Config(128, "fp16", block_m=192, pingpong=True, consumer_regs=160)
    assert invalid_reasons(bad)
    ok, _, _, log = compile_source(render(bad), "fa3_bad", tmp_path, nvcc=NVCC)
    assert not ok
    assert "ping-pong needs exactly 2 consumer warpgroups" in log


def test_smem_formula_matches_traits(tmp_path: Path) -> None:
    # The kernel's constexpr and the host formula must agree: compile a static_assert.
    cfgs = [Fa3Config(128, "fp16"), Fa3Config(256, "fp16", block_n=80),
            Fa3Config(64, "bf16", block_m=192, block_n=160, pv_regs=False, pingpong=False,
                      consumer_regs=160)]
    lines = [render(c) for c in cfgs]
    checks = [f"static_assert({c.name}_traits::kSmemBytes == {smem_bytes(c)});" for c in cfgs]
    src = "".join(lines).replace('#include "fa3_fwd.cuh"\n', "")
    src = '#include "fa3_fwd.cuh"\n' + src + "\n".join(checks) + "\n"
    ok, _, _, log = compile_source(src, "fa3_smem", tmp_path, nvcc=NVCC)
    assert ok, log[-3000:]
