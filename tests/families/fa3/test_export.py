"""The exported header with winners of both families (fa2 mma.sync, fa3 Hopper).

CPU: the table (each tuned shape's store winner, with its family's launcher and guard), the
instantiations, the provenance, and the fa3 parts inlined only when an fa3 config is in the
header. ``compile``: examples/fa2_example.cu against a two-family header for sm_90a and for
sm_80 + sm_90a, and a host-only probe built for sm_80 alone (the fa3 kernels are stubs there):
the dispatch never takes an fa3 config it cannot run, and the launcher's TMA views agree with
the GPU stage's (codegen/families/fa3/host.py).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from codegen.families import FA2, FA3
from codegen.families.fa2.space import fa2_default_config
from codegen.families.fa3.host import dims_and_strides
from codegen.render import template_hash
from core.fa2_config import Fa2Config
from core.fa3_config import Fa3Config
from core.family import AnyConfig
from core.problem import Problem
from core.records import MeasureStatus
from db.store import Store
from service.header import export_header
from tests.support.factories import H200, failed_result, make_config, make_report, ok_result
from tests.support.nvcc import build_host_probe

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "fa2_example.cu"
WHEN = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
ENUM = {"FA2TUNE_FP16": "fp16", "FA2TUNE_BF16": "bf16"}

FA3_FULL = Fa3Config.from_name("fa3_d128_fp16_full_m128_n128_s2_rs_ov_pp_r240")
FA3_FULL_SLOW = Fa3Config.from_name("fa3_d128_fp16_full_m128_n176_s2_rs_ov_pp_r240")
FA3_FULL_WRONG = Fa3Config.from_name("fa3_d128_fp16_full_m128_n192_s2_rs_ov_pp_r240")
# A longest-first config: the header must spell its Traits (two trailing flags) and launch it.
FA3_CAUSAL = Fa3Config.from_name("fa3_d128_bf16_causal_m128_n176_s2_rs_ov_pp_r240_lf")
FA2_SMALL = make_config(128, "fp16", False, br=64, bc=64, stages=2, swizzle=True)
FA2_D64 = make_config(64, "fp16", False, br=128, bc=64, stages=2, swizzle=True)

Key = tuple[int, str, bool, int]

#: (D, dtype, causal, N) -> [(config, median ms or None for WRONG_RESULT)], winner first.
PLAN: dict[Key, list[tuple[AnyConfig, float | None]]] = {
    (128, "fp16", False, 1024): [(FA2_SMALL, 0.10), (FA3_FULL, 0.12)],
    (128, "fp16", False, 4096): [(FA3_FULL, 0.90), (FA2_SMALL, 1.40), (FA3_FULL_SLOW, 0.95),
                                 (FA3_FULL_WRONG, None)],
    (128, "bf16", True, 4096): [(FA3_CAUSAL, 0.55)],
    (64, "fp16", False, 2048): [(FA2_D64, 0.08)],
}  # fmt: skip
WINNERS = {key: rows[0][0] for key, rows in PLAN.items()}


def fill_store(s: Store) -> None:
    """The shared module store's rows (``PLAN``)."""
    gpu_id = s.upsert_gpu(H200)
    for (d, dtype, causal, n), rows in PLAN.items():
        problem = Problem(gpu=H200.name, d=d, n=n, dtype=dtype, causal=causal)  # type: ignore[arg-type]
        pid = s.problem_id(problem, gpu_id)
        for trial, (cfg, ms) in enumerate(rows):
            arch = "sm_90a" if cfg.family == "fa3" else "sm_90"
            bid = s.record_build(make_report(cfg, arch=arch))  # type: ignore[arg-type]
            result = (
                ok_result(ms, problem)
                if ms is not None
                else failed_result(MeasureStatus.WRONG_RESULT, 0.5)
            )
            s.record_measurement(pid, bid, result, H200, trial_number=trial)


HEADER = {"gpu": "H200", "ds": [64, 128], "generated_at": WHEN}


_CHOICE = re.compile(
    r'\{\{(\d+), \1, 2, 16, 16\}, &(fa[23])::launch<fa2tune_configs::(\w+)>, "(\w+)", '
    r"(nullptr|&fa3::can_launch<fa2tune_configs::(\w+)>), "
    r"Workspace<fa2tune_configs::\3>::size, Workspace<fa2tune_configs::\3>::launch\}"
)


def tuned_table(text: str) -> dict[Key, tuple[str, str]]:
    """(D, dtype, causal, N) -> (family, config name), from the header's kTuned tables; checks
    that each choice's launcher, name and guard belong together."""
    arrays = dict(
        re.findall(r"static constexpr Choice (kTuned_\w+)\[\] = \{\n(.*?)\n\};", text, re.S)
    )
    rows = re.findall(r"\{(\d+), (FA2TUNE_\w+), (true|false), (kTuned_\w+), (\d+)\},", text)
    table: dict[Key, tuple[str, str]] = {}
    for d, enum, causal, ident, count in rows:
        choices = _CHOICE.findall(arrays[ident])
        assert len(choices) == int(count), arrays[ident]
        for n, fam, alias, name, guard, guard_alias in choices:
            assert alias == name and name.startswith(fam + "_")
            assert (guard == "nullptr") == (fam == "fa2") and guard_alias in ("", alias)
            table[(int(d), ENUM[enum], causal == "true", int(n))] = (fam, name)
    return table


def test_table_holds_each_shapes_winner_of_either_family(header: str, store: Store) -> None:
    table = tuned_table(header)
    assert table == {k: (c.family, c.name) for k, c in WINNERS.items()}
    for (d, dtype, causal, n), (_, name) in table.items():
        best = store.best("NVIDIA H200", d, n, dtype, causal)
        assert best is not None and best.config.name == name
    # The defaults stay FlashAttention-2's, unguarded: the fallback where fa3 cannot run.
    defaults = header.split("kDefaultChoices[] = {")[1].split("};")[0]
    for d in (64, 128):
        for dtype in ("fp16", "bf16"):
            for causal in (False, True):
                name = fa2_default_config(d, dtype, causal).name
                alias = f"fa2tune_configs::{name}"
                assert f'&fa2::launch<{alias}>, "{name}", nullptr, Workspace<{alias}>' in defaults
    assert "fa3" not in defaults


def test_instantiations_of_both_families(header: str) -> None:
    instantiated = set(
        re.findall(r"template __global__ void fa[23]::fwd_kernel<\w+::(\w+)>", header)
    )
    fa3 = {FA3_FULL.name, FA3_CAUSAL.name}
    assert {n for n in instantiated if n.startswith("fa3_")} == fa3
    assert FA3_FULL_SLOW.name not in header and FA3_FULL_WRONG.name not in header
    for cfg in (FA3_FULL, FA3_CAUSAL):
        alias = f"fa2tune_configs::{cfg.name}"
        assert f"using {cfg.name} = {FA3.header.traits(cfg)};" in header
        for line in FA3.header.instantiations(alias):
            assert header.count(line) == 1, line
    assert "using fa3_d128_fp16_full_m128_n128_s2_rs_ov_pp_r240 = fa3::Traits<128, __half, " \
        "false, 128, 128, 2, true, true, true, 240>;" in header  # fmt: skip
    fa2_alias = f"fa2tune_configs::{FA2_SMALL.name}"
    assert all(header.count(line) == 1 for line in FA2.header.instantiations(fa2_alias))


def test_header_parts_instantiate_the_kernels_signature() -> None:
    kernel, launcher, guard = FA3.header.instantiations("A")
    grid_constant = "const __grid_constant__ CUtensorMap"
    assert kernel == (
        "template __global__ void fa3::fwd_kernel<A>(const FaParams, "
        f"{grid_constant}, {grid_constant}, {grid_constant});"
    )
    assert launcher == "template cudaError_t fa3::launch<A>(const FaParams&, cudaStream_t);"
    assert guard == "template bool fa3::can_launch<A>(const FaParams&);"
    assert FA3.header.template == "fa3_launch.cuh" and FA2.header.guard is None
    assert len(FA2.header.instantiations("A")) == 2


def test_provenance_names_families_templates_and_targets(header: str) -> None:
    top = header.split("// PUBLIC API")[0]
    assert f"B=2 H=16 Nq=4096 Nk=4096: {FA3_FULL.name} (family fa3)" in top
    assert f"B=2 H=16 Nq=1024 Nk=1024: {FA2_SMALL.name} (family fa2)" in top
    assert f"B=2 H=16 Nq=2048 Nk=2048: {FA2_D64.name} (family fa2)" in top
    assert top.count("(family ") == len(PLAN) and "       sm_90a, nvcc " in top
    assert f"fa2_fwd.cuh (template hash {template_hash()})" in top
    assert f"fa3_fwd.cuh (template hash {template_hash(main='fa3_fwd.cuh')})" in top
    assert "-gencode=arch=compute_90a,code=sm_90a" in top


def test_fa3_parts_only_with_an_fa3_config(header: str, store: Store) -> None:
    assert header.count("namespace fa3 {") >= 1 and "cuTensorMapEncodeTiled" in header
    assert header.count("#define FA3_DEFINE_KERNEL(") == 1  # fa3_fwd.cuh, inlined once
    assert header.count("struct FaParams {") == 1  # fa_params.cuh, inlined once for both
    assert not re.search(r'^\s*#\s*include\s*"', header, re.MULTILINE)
    assert "#pragma once" not in header
    # D=64 has fa2 winners only: nothing of fa3 in that header.
    fa2_only = export_header(store, "H200", [64], generated_at=WHEN)
    # (fa_params.cuh, shared by both families, names CUtensorMap in a comment.)
    assert "namespace fa3" not in fa2_only and "cuTensorMapEncodeTiled" not in fa2_only
    assert "(fa3: no config of this family in the header)" in fa2_only
    assert "compute_90a" not in fa2_only.split("// PUBLIC API")[0]
    assert "fa3_fwd.cuh (template hash" not in fa2_only


# ------------------------------------------------------------------------------ nvcc

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")


def nvcc(*args: str, cwd: Path) -> float:
    """Build with nvcc (:func:`tests.support.nvcc.build_host_probe`); the seconds it took."""
    assert NVCC is not None
    start = time.monotonic()
    build_host_probe(cwd, *args)
    return time.monotonic() - start


SM80 = "-gencode=arch=compute_80,code=sm_80"
SM90A = "-gencode=arch=compute_90a,code=sm_90a"


@pytest.mark.slow
@pytest.mark.compile
@needs_nvcc
@pytest.mark.parametrize("targets", [(SM90A,), (SM80, SM90A)], ids=["sm_90a", "sm_80+sm_90a"])
def test_example_compiles_with_two_family_header(
    header: str, tmp_path: Path, targets: tuple[str, ...]
) -> None:
    (tmp_path / "fa2_tuned.cuh").write_text(header)
    seconds = nvcc(
        "-O2", *targets, "-I", str(tmp_path), str(EXAMPLE), "-o", str(tmp_path / "fa2_example"),
        cwd=tmp_path,
    )  # fmt: skip
    assert (tmp_path / "fa2_example").is_file()
    print(f"nvcc {' '.join(targets)}: {seconds:.1f} s")


PROBE = r"""
#include "fa2_tuned.cuh"
#include <cstdio>
#include <cstdlib>
// Host-side checks of a two-family header built without sm_90a: no GPU is needed, and on a
// GPU (even an H200) the fa3 kernels are stubs here, so no fa3 config may ever be picked.
static FaParams params(int d, int n) {
  FaParams p{};
  p.q = p.k = p.v = p.o = reinterpret_cast<void*>(std::uintptr_t{1} << 20);  // never read
  p.batch = 2; p.q_heads = 4; p.kv_heads = 2; p.nq = p.nk = n; p.softmax_scale = 0.1f;
  p.q_row_stride = p.o_row_stride = 4 * d; p.k_row_stride = p.v_row_stride = 2 * d;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = d;
  p.q_batch_stride = p.o_batch_stride = 4LL * d * n;
  p.k_batch_stride = p.v_batch_stride = 2LL * d * n;
  return p;
}
int main() {
  // 1. TMA views of tensors read from stdin: d n h b row head batch (element strides).
  long long d, n, h, b, row, head, batch;
  while (std::scanf("%lld %lld %lld %lld %lld %lld %lld", &d, &n, &h, &b, &row, &head,
                    &batch) == 7) {
    fa3::launch_detail::TensorView v;
    const void* ptr = reinterpret_cast<void*>(std::uintptr_t{1} << 20);
    if (!fa3::launch_detail::tensor_view(ptr, int(d), int(n), int(h), int(b), row, head, batch,
                                         &v)) {
      std::printf("view refused\n");
      continue;
    }
    std::printf("view %llu %llu %llu %llu %llu %llu %llu\n", (unsigned long long)v.dims[0],
                (unsigned long long)v.dims[1], (unsigned long long)v.dims[2],
                (unsigned long long)v.dims[3], (unsigned long long)v.strides[0],
                (unsigned long long)v.strides[1], (unsigned long long)v.strides[2]);
  }
  // 2. Every tuned choice: its name and whether it may run here (fa3: never, in this build).
  const FaParams p = params(128, 4096);
  for (int i = 0; i < fa2tune_detail::kTunedCount; ++i)
    for (int j = 0; j < fa2tune_detail::kTuned[i].count; ++j) {
      const fa2tune_detail::Choice& c = fa2tune_detail::kTuned[i].choices[j];
      std::printf("choice %s %d\n", c.name, fa2tune_detail::accepts(c, p) ? 1 : 0);
    }
  // 3. What fa2tune_forward would launch for a shape whose nearest tuned winner is fa3: on
  // the tuned GPU the nearest tuned config that can run, elsewhere (no GPU) the default.
  const char* name = fa2tune_config_name(p, 128, FA2TUNE_FP16, false);
  std::printf("picked %s %d\n", name ? name : "(none)", fa2tune_detail::on_tuned_gpu() ? 1 : 0);
  // 4. Bad parameters: the fa3 launcher refuses them before touching a device.
  FaParams bad = p;
  bad.k_row_stride = 260;  // not a multiple of 8 elements
  using Full = fa2tune_configs::FA3_FULL_NAME;
  std::printf("invalid %d %d %d\n", fa3::launch<Full>(FaParams{}, 0) == cudaErrorInvalidValue,
              fa3::launch<Full>(bad, 0) == cudaErrorInvalidValue,
              fa3::launch<Full>(p, 0) != cudaSuccess);
  return 0;
}
"""

Case = tuple[str, tuple[int, int, int, int], tuple[int, int, int, int]]

# (layout, shape, element strides) of tensors the launcher may see; D's stride is 1.
VIEW_CASES: list[Case] = [
    ("bnhd", (2, 100, 4, 128), (100 * 512, 512, 128, 1)),
    ("bhnd", (2, 4, 77, 64), (4 * 77 * 64, 77 * 64, 64, 1)),
    ("bnhd", (1, 1, 1, 128), (128, 128, 128, 1)),  # every outer extent 1: synthetic strides
    ("bnhd", (3, 333, 1, 96), (333 * 96, 96, 96, 1)),  # MQA, D=96
    ("bhnd", (2, 8, 300, 128), (8 * 300 * 136, 300 * 136, 136, 1)),  # padded rows
    ("bnhd", (2, 5, 2, 64), (0, 128, 64, 1)),  # batch stride 0 with 2 batches: no TMA view
    ("bnhd", (2, 5, 2, 64), (640, 128, -64, 1)),  # negative head stride
    ("bnhd", (2, 5, 2, 64), (1 << 39, 128, 64, 1)),  # 2^40 bytes: over TMA's limit
]


def view_line(case: Case) -> tuple[str, str]:
    """The probe's stdin line for a case and the line it should print."""
    layout, shape, strides = case
    if layout == "bnhd":
        b, n, h, d = shape
        sb, sn, sh, _ = strides
    else:
        b, h, n, d = shape
        sb, sh, sn, _ = strides
    line = f"{d} {n} {h} {b} {sn} {sh} {sb}"
    outer = list(zip((n, h, b), (sn, sh, sb), strict=True))
    if any(size > 1 and (s <= 0 or 2 * s >= 1 << 40) for size, s in outer):
        return line, "view refused"
    dims, byte_strides = dims_and_strides(shape, strides, 2, layout)  # type: ignore[arg-type]
    return line, "view " + " ".join(map(str, dims + byte_strides))


@pytest.mark.slow
@pytest.mark.compile
@needs_nvcc
def test_sm80_only_build_never_dispatches_to_fa3(header: str, tmp_path: Path) -> None:
    """Built for sm_80 alone (fa3 kernels are stubs), in two translation units: fa3 choices are
    passed over for the nearest fa2 one (the default off the tuned GPU); TMA views agree with
    codegen/families/fa3/host.py's."""
    (tmp_path / "fa2_tuned.cuh").write_text(header)
    (tmp_path / "probe.cu").write_text(PROBE.replace("FA3_FULL_NAME", FA3_FULL.name))
    (tmp_path / "other.cu").write_text('#include "fa2_tuned.cuh"\n')
    nvcc(SM80, "probe.cu", "other.cu", "-o", "probe", cwd=tmp_path)
    cases = [view_line(c) for c in VIEW_CASES]
    out = subprocess.run(
        [str(tmp_path / "probe")],
        input="".join(line + "\n" for line, _ in cases),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [x for x in lines if x.startswith("view")] == [want for _, want in cases]
    choices = dict(x.split()[1:] for x in lines if x.startswith("choice "))
    assert choices == {c.name: str(int(c.family == "fa2")) for c in WINNERS.values()}
    picked = next(x.split() for x in lines if x.startswith("picked "))
    # The fa3 winner at N=4096 cannot run here: the nearest that can is fa2's at N=1024.
    want = FA2_SMALL if picked[2] == "1" else fa2_default_config(128, "fp16", False)
    assert picked[1] == want.name
    assert "invalid 1 1 1" in lines


def test_winners_cover_both_families() -> None:
    families = {c.family for c in WINNERS.values()}
    assert families == {"fa2", "fa3"}
    assert all(isinstance(c, Fa2Config | Fa3Config) for c in WINNERS.values())


def test_longest_first_winner_keeps_its_order_in_the_header(header: str) -> None:
    """An `_lf` winner's alias carries LongestFirst (after Varlen = false), so the header
    launches the order that was measured."""
    alias = "fa3::Traits<128, __nv_bfloat16, true, 128, 176, 2, true, true, true, 240, false, true>"
    assert f"using {FA3_CAUSAL.name} = {alias};" in header
