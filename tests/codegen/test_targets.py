"""The GPU targets (codegen/targets.py): the facts table, the compute capability -> target rule,
which families each target gets, defaults that fit each target, and a Blackwell GPU treated
like any other by the choice, the store, the service and the header.

The compile tier builds the portable defaults for every target with ptxas reports, and the
exported header for sm_100 + sm_120 + sm_90a in one fat build.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest

from codegen.build import build_batch
from codegen.families import FAMILIES, families_for, family
from codegen.targets import (
    ARCH_SMEM_LIMIT,
    KIB,
    SUPPORTED_ARCHS,
    TARGETS,
    _target_for,
    check_arch,
    compute_capability_of,
    runs_on,
    target_for,
)
from core.build_report import BuildStatus
from core.problem import Problem
from core.records import GpuInfo
from core.shape import Shape
from db.store import Store
from fa2tune.ops.choice import Unsupported, choose_config, smem_limit_of
from service.header import export_header
from tests.support.factories import make_config, make_report, ok_result

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")

RTX_5090 = GpuInfo(
    name="NVIDIA GeForce RTX 5090",
    compute_capability="12.0",
    sm_count=170,
    driver_version="580.95.05",
    cuda_version="13.0",
    memory_bytes=34_190_917_632,
    smem_optin_bytes=101_376,
    l2_bytes=100_663_296,
)
PREFILL = Shape(4096, 4096, 2, 16, 16)
DECODE = Shape(1, 8192, 2, 32, 8)  # 64 query blocks: fewer than the SMs, a decode call


def test_every_target_has_the_guides_shape() -> None:
    """Per block: the SM's shared memory less the 1 KB the driver reserves; the 99 KB parts are
    exactly the ones with 1536 resident threads (sm_87, Orin, has both 163 KB and 1536)."""
    assert SUPPORTED_ARCHS == tuple(TARGETS) == tuple(ARCH_SMEM_LIMIT)
    for arch, t in TARGETS.items():
        assert t.arch == arch and t.smem_per_block == t.smem_per_sm - KIB
        assert t.registers_per_sm == 64 * KIB and t.threads_per_sm in (1536, 2048)
    small = {a for a, t in TARGETS.items() if t.smem_per_block == 99 * KIB}
    assert small == {"sm_86", "sm_89", "sm_120", "sm_121"}
    assert {a for a, t in TARGETS.items() if t.threads_per_sm == 1536} == small | {"sm_87"}
    assert [compute_capability_of(a) for a in ("sm_90a", "sm_100", "sm_121")] == [
        "9.0", "10.0", "12.1",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("arch", "cc", "runs"),
    [
        ("sm_86", "8.9", True),  # same major, newer minor
        ("sm_89", "8.6", False),
        ("sm_100", "10.3", True),
        ("sm_100", "11.0", False),  # another major: cubins never cross it
        ("sm_90", "10.0", False),
        ("sm_90a", "9.0", True),
        ("sm_90a", "9.1", False),  # architecture-specific: exactly its compute capability
        ("sm_120", "12.1", True),
        ("sm_121", "12.0", False),
    ],
)
def test_which_machine_code_runs_where(arch: str, cc: str, runs: bool) -> None:
    assert runs_on(arch, cc) is runs


def test_a_gpu_without_its_own_target_gets_the_nearest_lower_one_with_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _target_for.cache_clear()
    with caplog.at_level(logging.WARNING, logger="codegen.targets"):
        assert target_for("9.0") == "sm_90" and target_for("12.0") == "sm_120"
        assert not caplog.records  # its own target: nothing to say
        assert [target_for("12.9") for _ in range(3)] == ["sm_121"] * 3
        assert target_for("8.8") == "sm_87"
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said  # once per compute capability, however often asked
    assert "no sm_129 target" in said[0] and "runs its sm_121 code" in said[0]
    assert target_for("13.0") is None and target_for("7.5") is None


@pytest.mark.parametrize("bad", ["", "9", "nine.zero", "9.0.1"])
def test_a_malformed_compute_capability_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match=r"is not <major>\.<minor>"):
        target_for(bad)


def test_an_unknown_arch_is_refused_with_the_targets() -> None:
    with pytest.raises(ValueError, match="expected one of sm_80, sm_86, sm_87") as info:
        check_arch("sm_95")
    assert "sm_120, sm_121" in str(info.value)


@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
def test_each_target_gets_the_portable_families_and_only_sm_90_the_hopper_one(arch: str) -> None:
    cc = compute_capability_of(arch)
    names = [f.name for f in families_for(cc)]
    assert names == (["fa2", "fa3", "splitkv"] if arch == "sm_90" else ["fa2", "splitkv"])
    assert family("fa2").arch_for(cc) == family("splitkv").arch_for(cc) == arch
    assert family("fa3").arch_for(cc) == ("sm_90a" if arch == "sm_90" else None)


@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
def test_every_default_fits_every_target(arch: str) -> None:
    """What an untuned call runs must launch there: split-KV's default (sized for sm_90's
    227 KB) is fitted to the 99 KB parts; FlashAttention-2's fits everywhere as it is."""
    limit = ARCH_SMEM_LIMIT[arch]
    for fam in (family("fa2"), family("splitkv")):
        for d in fam.head_dims:
            for dtype, causal in (("fp16", False), ("bf16", True)):
                fitted = fam.default_within(d, dtype, causal, limit)
                assert fitted is not None, (arch, fam.name, d)
                assert fam.check(fitted, limit)[0], (arch, fitted.name)
                if fam.check(fam.default(d, dtype, causal), limit)[0]:
                    assert fitted == fam.default(d, dtype, causal)  # never shrunk needlessly


def test_a_blackwell_gpu_gets_defaults_not_a_refusal() -> None:
    """A "12.0" GPU with nothing tuned: FlashAttention-2's default for prefill, split-KV's
    (fitted to 99 KB) for decode, and the limit the choice holds them to is the table's."""
    assert smem_limit_of("12.0") == 99 * KIB and smem_limit_of("13.0") is None
    prefill = choose_config(None, RTX_5090.name, 170, PREFILL, "bf16", True, 128,
                            compute_capability="12.0")  # fmt: skip
    assert (prefill.source, prefill.config) == ("default", family("fa2").default(128, "bf16", True))
    decode = choose_config(None, RTX_5090.name, 170, DECODE, "bf16", False, 128,
                           compute_capability="12.0")  # fmt: skip
    assert decode.source == "default" and decode.config.family == "splitkv"
    assert (
        decode.config.smem_bytes
        <= 99 * KIB
        < family("splitkv").default(128, "bf16", False).smem_bytes
    )
    # On sm_90 the same call keeps the unfitted default (nothing changes for the H200).
    h200 = choose_config(None, "NVIDIA H200", 132, DECODE, "bf16", False, 128)
    assert h200.config == family("splitkv").default(128, "bf16", False)
    with pytest.raises(Unsupported, match=r"no fa2tune build runs on compute capability 13\.0"):
        choose_config(None, "Next GPU", 200, PREFILL, "bf16", True, 128, compute_capability="13.0")


def _seed_rtx_5090(store: Store) -> dict[str, object]:
    """Tuned prefill (fa2) and decode (splitkv) results of an RTX 5090, built for sm_120, as a
    campaign there or an ingest of its dump would leave them."""
    prefill = make_config(d=128, dtype="fp16", br=64, bc=64)
    decode = family("splitkv").default_within(128, "fp16", False, 99 * KIB)
    gpu_id = store.upsert_gpu(RTX_5090)
    tuned = {}
    for shape, config in ((PREFILL, prefill), (DECODE, decode)):
        problem = Problem(gpu=RTX_5090.name, d=128, n=shape.nq, nk=shape.nk, batch=shape.batch,
                          heads=shape.heads, kv_heads=shape.kv_heads, dtype="fp16")  # fmt: skip
        build_id = store.record_build(make_report(config, arch="sm_120"))  # type: ignore[arg-type]
        store.record_measurement(store.problem_id(problem, gpu_id), build_id,
                                 ok_result(0.5, problem), RTX_5090)  # fmt: skip
        tuned[shape.describe()] = config
    return tuned


def test_tuned_results_of_a_blackwell_gpu_are_chosen_listed_and_served() -> None:
    from fastapi.testclient import TestClient

    from service.main import create_app

    with Store.from_url("sqlite://") as store:
        tuned = _seed_rtx_5090(store)
        for shape in (PREFILL, DECODE):
            choice = choose_config(store, "GeForce RTX 5090", 170, shape, "fp16", False, 128,
                                   compute_capability="12.0")  # fmt: skip
            assert (choice.source, choice.config) == ("exact", tuned[shape.describe()])
        # The same results on a 9.0 GPU of another name are not this GPU's: defaults there.
        other = choose_config(store, "NVIDIA H200", 132, PREFILL, "fp16", False, 128)
        assert other.source == "default"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # starlette's httpx notice
            client = TestClient(create_app(store))
        with client:
            gpus = client.get("/v1/gpus").json()["items"]
            (row,) = [g for g in gpus if g["compute_capability"] == "12.0"]
            assert (row["l2_bytes"], row["smem_optin_bytes"]) == (100_663_296, 101_376)
            best = client.get("/v1/best", params={"gpu": "geforce-rtx-5090", "d": 128, "n": 4096})
            assert best.status_code == 200, best.text
            assert best.json()["config"]["name"] == tuned[PREFILL.describe()].name
            assert best.json()["provenance"]["arch"] == "sm_120"


FAT = (
    "-gencode=arch=compute_100,code=sm_100",
    "-gencode=arch=compute_120,code=sm_120",
    "-gencode=arch=compute_90a,code=sm_90a",
)
PROBE = r"""
#include "fa2_tuned.cuh"
#include <cstdio>
// Host-only: the tuned entries the header holds for the RTX 5090's calls (no GPU touched).
int main() {
  fa2tune_tuned_choice c{};
  if (!fa2tune_nearest_tuned(128, FA2TUNE_FP16, false, 4096, 4096, 2, 16, 16, 170, &c)) return 1;
  std::printf("%s\n", c.name);
  return 0;
}
"""


@pytest.mark.compile
@needs_nvcc
def test_defaults_build_for_every_target_with_ptxas_reports(tmp_path: Path) -> None:
    """Each portable family's default (D=128 bf16 causal, fitted) compiles for every target and
    ptxas reports its registers; none overflows the target's shared memory."""
    configs = {
        (arch, name): family(name).default_within(128, "bf16", True, ARCH_SMEM_LIMIT[arch])
        for arch in SUPPORTED_ARCHS
        for name in ("fa2", "splitkv")
    }
    for arch in SUPPORTED_ARCHS:
        ours = [c for (a, _), c in configs.items() if a == arch and c is not None]
        batch = build_batch(ours, arch=arch, cache_dir=tmp_path, jobs=2)
        for r in batch.reports:
            assert r.status in (BuildStatus.OK, BuildStatus.SPILLS), (arch, r.config.name, r.error)
            assert r.arch == arch and r.registers is not None and 0 < r.registers <= 255
            assert f"code=sm_{arch[3:]}" in " ".join(r.flags)


@pytest.mark.slow
@pytest.mark.compile
@needs_nvcc
def test_the_header_of_a_blackwell_gpu_compiles_fat_for_sm100_sm120_and_sm90a(
    tmp_path: Path,
) -> None:
    with Store.from_url("sqlite://") as store:
        tuned = _seed_rtx_5090(store)
        text = export_header(store, RTX_5090.name, [128], dtypes=["fp16"])
    (tmp_path / "fa2_tuned.cuh").write_text(text)
    (tmp_path / "probe.cu").write_text(PROBE)
    assert NVCC is not None
    proc = subprocess.run(
        [NVCC, "-std=c++17", "-Xptxas", "-v", *FAT, "probe.cu", "-o", "probe"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # ptxas compiled the kernels for each of the three targets (its -v report says so): the
    # same portable kernels for sm_100 and sm_120, and more for sm_90a (the Hopper family's).
    entries = {
        arch: sum(
            "Compiling entry" in ln and f"for '{arch}'" in ln for ln in proc.stderr.splitlines()
        )
        for arch in ("sm_100", "sm_120", "sm_90a")
    }
    assert entries["sm_100"] == entries["sm_120"] >= len(tuned), entries
    assert entries["sm_90a"] >= entries["sm_120"], entries
    out = subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == tuned[PREFILL.describe()].name


def test_every_family_is_pinned() -> None:
    """A new family must say where it builds: this list changes with it, on purpose."""
    assert {n: f.archs for n, f in FAMILIES.items()} == {
        "fa2": tuple(reversed(SUPPORTED_ARCHS)),
        "fa3": ("sm_90a",),
        "splitkv": tuple(reversed(SUPPORTED_ARCHS)),
    }
