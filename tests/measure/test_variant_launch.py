"""A variant config's launch arguments, on the CPU: the ``FaVariant`` struct against the C
header, building it from a Variant (the normalised window, a causal config's right bound 0,
the sinks pointer), its place as the last kernel argument of every launch (dense, batch
slices, packed), and the refusal of a config whose switches do not fit the variant, in the
loader and as a recorded measurement of the handler.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from codegen.families.fa2.space import seed_configs
from codegen.render import template_dir
from core.problem import Problem
from core.records import GpuInfo, MeasureStatus
from core.variant import PLAIN, Variant
from measure import loader
from measure.jobs import BenchJob
from measure.launch_args import variant_args, variant_mismatch
from measure.params import FaParams, FaVariant, FaVarlen, PackedSeqs, launch_variant
from tests.support.variant_rule import sees

CXX = shutil.which("g++") or shutil.which("clang++")
NVCC = shutil.which("nvcc")

PROBE = r"""
#include <cstdio>
#include "fa_params.cuh"
int main() {
  std::printf("%zu %zu %zu %zu %zu %zu %zu\n", sizeof(FaVariant), alignof(FaVariant),
              offsetof(FaVariant, window_left), offsetof(FaVariant, window_right),
              offsetof(FaVariant, chunk), offsetof(FaVariant, softcap),
              offsetof(FaVariant, sinks));
  return 0;
}
"""


def test_favariant_matches_the_c_struct(tmp_path: Path) -> None:
    """sizeof, alignof and every offset, from a host program built on the header itself."""
    if CXX is None and NVCC is None:
        pytest.skip("no C++ compiler (g++, clang++ or nvcc) on PATH")
    (tmp_path / "probe.cpp").write_text(PROBE)
    cmd = [CXX] if CXX is not None else [NVCC, "-x", "c++"]
    proc = subprocess.run(
        [*cmd, "-std=c++17", "-I", str(template_dir()), "probe.cpp", "-o", "probe"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True, check=True)
    size, align, *offsets = (int(x) for x in out.stdout.split())
    assert (size, align) == (ctypes.sizeof(FaVariant), ctypes.alignment(FaVariant)) == (24, 8)
    names = ("window_left", "window_right", "chunk", "softcap", "sinks")
    assert offsets == [getattr(FaVariant, n).offset for n in names] == [0, 4, 8, 12, 16]


@pytest.mark.parametrize(
    ("causal", "variant", "nq", "nk", "want"),
    [
        (False, Variant(window_left=5, window_right=3), 100, 100, (5, 3, 0)),
        (True, Variant(window_left=5), 100, 100, (5, 0, 0)),  # causal: right 0
        (True, Variant(window_left=5, window_right=7), 100, 100, (5, 0, 0)),
        (True, Variant(chunk=64), 100, 200, (-1, 0, 64)),
        (True, Variant(window_left=500), 100, 200, (-1, 0, 0)),  # reaches every key: none
        (False, Variant(window_left=199, window_right=99), 100, 200, (-1, -1, 0)),
        (False, Variant(window_right=0), 50, 50, (-1, 0, 0)),  # (-1, 0) is causal's bound
        (False, Variant(chunk=300), 100, 200, (-1, -1, 0)),  # one chunk holds every key
        (False, Variant(chunk=300), 300, 200, (-1, -1, 300)),  # rows before key 0 stay hidden
        (True, Variant(window_left=500), None, None, (500, 0, 0)),  # packed: lengths vary
        (True, Variant(softcap=30.0), 10, 10, (-1, 0, 0)),
    ],
)
def test_launch_variant_normalises_with_the_call(
    causal: bool, variant: Variant, nq: int | None, nk: int | None, want: tuple[int, int, int]
) -> None:
    got = launch_variant(causal, variant, nq, nk)
    assert (got.window_left, got.window_right, got.chunk) == want
    assert (got.softcap, got.sinks) == (variant.softcap, variant.sinks)


def test_the_launch_window_keeps_every_call_s_mask() -> None:
    """Over many calls, the kernel's mask (the config's causality plus the launch window)
    is the call's mask, key for key: normalising changes the form, never what is seen."""
    import random

    rng = random.Random(23)
    for _ in range(1500):
        nq, nk = rng.randint(1, 24), rng.randint(1, 24)
        causal = rng.random() < 0.5
        v = Variant(
            window_left=rng.choice([-1, -1, 0, 1, 3, 10, 30]),
            window_right=rng.choice([-1, -1, 0, 0, 2, 7, 30]),
            chunk=rng.choice([0, 0, 1, 3, 8, 24, 40]),
        )
        w = launch_variant(causal, v, nq, nk)
        w_packed = launch_variant(causal, v)
        for i in range(nq):
            for j in range(nk):
                want = sees(i, j, nq, nk, causal, v)
                assert sees(i, j, nq, nk, causal, w) == want, (nq, nk, causal, v, w)
                assert sees(i, j, nq, nk, causal, w_packed) == want, (nq, nk, causal, v)
        if causal:
            assert w.window_right == 0 == w_packed.window_right  # the kernels' causal form


def _config(**switches: bool) -> Any:
    return replace(seed_configs(64, "fp16", True)[0], **switches)  # type: ignore[arg-type]


def test_variant_args_build_the_struct_for_a_switch_config() -> None:
    (arg,) = variant_args(
        _config(local=True, softcap=True), Variant(window_left=7, softcap=15.0), None,
        nq=100, nk=100, q_heads=4,
    )  # fmt: skip
    assert isinstance(arg, FaVariant)
    assert (arg.window_left, arg.window_right, arg.chunk, arg.softcap, arg.sinks) == (
        7, 0, 0, 15.0, None)  # fmt: skip
    assert variant_args(_config(), PLAIN, None, nq=10, nk=10, q_heads=2) == ()
    assert variant_args(_config(), None, None, nq=10, nk=10, q_heads=2) == ()


def test_sinks_must_fit_the_variant() -> None:
    torch = pytest.importorskip("torch")
    snk = _config(sinks=True)
    with pytest.raises(ValueError, match="needs the sinks"):
        variant_args(snk, Variant(sinks=True), None, nq=8, nk=8, q_heads=2)
    with pytest.raises(ValueError, match="CUDA"):  # a host tensor is no device pointer
        variant_args(snk, Variant(sinks=True), torch.zeros(2), nq=8, nk=8, q_heads=2)
    with pytest.raises(ValueError, match="without sinks"):
        variant_args(_config(), PLAIN, torch.zeros(2), nq=8, nk=8, q_heads=2)
    with pytest.raises(ValueError, match="without sinks"):
        variant_args(_config(local=True), Variant(window_left=2), torch.zeros(2), nq=8, nk=8,
                     q_heads=2)  # fmt: skip


@pytest.mark.parametrize(
    ("switches", "variant", "wrong"),
    [
        ({}, Variant(window_left=4), "local=False"),
        ({"local": True}, PLAIN, "local=True"),
        ({"local": True}, Variant(window_left=4, softcap=15.0), "softcap=False"),
        ({"softcap": True, "sinks": True}, Variant(softcap=15.0), "sinks=True"),
        ({}, Variant(sinks=True), "sinks=False"),
    ],
)
def test_a_config_whose_switches_do_not_fit_is_refused(
    switches: dict[str, bool], variant: Variant, wrong: str
) -> None:
    config = _config(**switches)
    why = variant_mismatch(config, variant)
    assert why is not None and wrong in why and config.name in why
    with pytest.raises(ValueError, match=wrong):
        variant_args(config, variant, None, nq=8, nk=8, q_heads=2)


def test_every_switch_alone_and_together_fits_its_variant() -> None:
    cases = [
        ({"local": True}, Variant(chunk=16)),
        ({"softcap": True}, Variant(softcap=50.0)),
        ({"sinks": True}, Variant(sinks=True)),
        ({"local": True, "softcap": True, "sinks": True},
         Variant(window_left=3, chunk=8, softcap=15.0, sinks=True)),
        ({}, PLAIN),
    ]  # fmt: skip
    for switches, variant in cases:
        assert variant_mismatch(_config(**switches), variant) is None


# ------------------------------------------------------------------------------------------
# The one place every launch goes through: LoadedKernel.bind_config


class _Captured:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, tuple[Any, ...]]] = []


@pytest.fixture
def bound(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, _Captured]:
    """A LoadedKernel without a module whose bind() records the arguments it would launch
    with; make_params and the family's extra arguments stubbed (they need a GPU), one
    sentinel extra argument standing for a family's host_prep values."""
    cap = _Captured()
    kernel = loader.LoadedKernel.__new__(loader.LoadedKernel)
    kernel._module = object()

    def bind(params: Any, grid: Any, block: Any, smem: int, stream: int, extra: Any = ()) -> Any:
        cap.calls.append((params, tuple(extra)))
        return lambda: None

    monkeypatch.setattr(kernel, "bind", bind)

    def fake_params(q: Any, *args: Any) -> FaParams:
        p = FaParams()
        p.batch, p.q_heads, p.kv_heads, p.nq, p.nk = q.shape[0], q.shape[2], 1, q.shape[1], 8
        return p

    monkeypatch.setattr(loader, "make_params", fake_params)
    monkeypatch.setattr(loader, "extra_args", lambda *a: ("HOST_PREP",))
    monkeypatch.setattr(loader, "packed_extra_args", lambda *a: ("HOST_PREP",))
    monkeypatch.setattr(
        loader, "packed_params", lambda q, *a: (fake_params(q.unsqueeze(0)), FaVarlen())
    )
    return kernel, cap


def test_favariant_is_the_last_argument_of_a_dense_launch(bound: tuple[Any, _Captured]) -> None:
    torch = pytest.importorskip("torch")
    kernel, cap = bound
    q = torch.zeros(2, 100, 4, 64)
    k = torch.zeros(2, 100, 1, 64)
    config = _config(local=True)
    kernel.bind_config(config, q, k, k, q, None, 0.125, "bnhd", 0,
                       variant=Variant(window_left=9, window_right=4))  # fmt: skip
    ((_, extra),) = cap.calls
    assert extra[0] == "HOST_PREP" and isinstance(extra[-1], FaVariant) and len(extra) == 2
    assert (extra[-1].window_left, extra[-1].window_right) == (9, 0)  # causal config
    cap.calls.clear()
    kernel.bind_config(_config(), q, k, k, q, None, 0.125, "bnhd", 0)
    assert cap.calls[0][1] == ("HOST_PREP",)  # plain: arguments as they were


def test_favariant_ends_every_batch_slice(
    bound: tuple[Any, _Captured], monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    kernel, cap = bound
    monkeypatch.setattr(loader, "_batch_slice", lambda *a: 2)
    q = torch.zeros(5, 10, 2, 64)
    kernel.bind_config(_config(softcap=True), q, q, q, q, None, 0.125, "bnhd", 0,
                       variant=Variant(softcap=15.0))  # fmt: skip
    assert len(cap.calls) == 3
    for _, extra in cap.calls:
        assert extra[:-1] == ("HOST_PREP",) and extra[-1].softcap == 15.0


def test_favariant_ends_a_packed_launch(bound: tuple[Any, _Captured]) -> None:
    torch = pytest.importorskip("torch")
    kernel, cap = bound
    config = replace(_config(local=True), varlen=True)
    q = torch.zeros(30, 4, 64)
    seqs = PackedSeqs(0x1000, 0x2000, 3, 20, 20)
    kernel.bind_config(config, q, q, q, q, None, 0.125, "bnhd", 0, packed=seqs,
                       variant=Variant(window_left=25))  # fmt: skip
    ((_, extra),) = cap.calls
    assert isinstance(extra[0], FaVarlen) and extra[1] == "HOST_PREP"
    # A packed batch's window is not normalised by lengths (each sequence has its own).
    assert (extra[-1].window_left, extra[-1].window_right) == (25, 0)


def test_the_loader_refuses_a_mismatch_before_anything_is_bound(
    bound: tuple[Any, _Captured],
) -> None:
    torch = pytest.importorskip("torch")
    kernel, cap = bound
    q = torch.zeros(1, 10, 2, 64)
    with pytest.raises(ValueError, match="local=False"):
        kernel.bind_config(_config(), q, q, q, q, None, 0.125, "bnhd", 0,
                           variant=Variant(window_left=3))  # fmt: skip
    with pytest.raises(ValueError, match="local=True"):
        kernel.bind_config(_config(local=True), q, q, q, q, None, 0.125, "bnhd", 0)
    assert cap.calls == []


def test_the_handler_records_a_mismatch_as_skipped_without_running() -> None:
    """The GPU handler's refusal comes before loading anything (the handler is built
    without a GPU: the job never gets that far)."""
    from measure.handler import GpuJobHandler

    handler = GpuJobHandler.__new__(GpuJobHandler)
    handler.info = GpuInfo("none", "9.0", 1, "0", "0", smem_optin_bytes=1 << 20)
    handler.phase = "idle"
    config = _config(local=True)
    for variant, wrong in ((Variant(softcap=15.0), "softcap=False"), (PLAIN, "local=True")):
        problem = Problem(gpu="t", d=64, n=128, batch=1, heads=2, causal=True, variant=variant)
        res = handler._measure(BenchJob.make(config, "/nonexistent.cubin", problem))
        assert res.status == MeasureStatus.SKIPPED and wrong in (res.error or ""), res


def test_the_gpu_support_skips_a_family_without_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU tier's helpers, on the CPU: a family whose space lacks a switch is skipped
    with a reason naming it; once the space has it, configs are built with the switch."""
    import codegen.families.fa2.space as fa2_space
    from tests.support.gpu import variant_skip_reason, with_switches

    monkeypatch.setattr(fa2_space, "VARIANT_SWITCHES", ())
    why = variant_skip_reason("fa2", ("local", "sinks"))
    assert why is not None and "local, sinks" in why and "VARIANT_SWITCHES" in why
    assert with_switches(seed_configs(64, "fp16", False), Variant(sinks=True)) == []
    monkeypatch.setattr(fa2_space, "VARIANT_SWITCHES", ("local", "softcap", "sinks"))
    assert variant_skip_reason("fa2", ("local", "sinks")) is None
    every = Variant(window_left=4, softcap=15.0, sinks=True)
    built = with_switches(seed_configs(64, "fp16", False), every)
    assert built and all(c.variant_switches == every.needs for c in built)
