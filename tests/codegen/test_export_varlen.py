"""The exported header's packed variable-length entry, fa2tune_forward_varlen.

CPU: a store's varlen winners become the header's varlen tables (``_vl`` aliases with the
Traits' Varlen flag, varlen kernel and launcher instantiations, one entry per varlen shape);
a store without varlen results still gets the default's varlen twin per (D, dtype, causal);
the shipped H200 varlen results render to the store's best, with the Hopper family's (fa3)
shipped too its faster winners, each with its family's varlen launcher and guard.
``compile``: a host-only probe (no GPU is touched) built for sm_90 (two translation units)
and for sm_80 + sm_90a checks fa2tune_nearest_tuned_varlen and fa_shape.cuh's varlen_shape
against the store's rule (core.shape.varlen_shape, Store.best_varlen), the default twin off
the tuned GPU, and the refusals; a header with fa3 varlen winners builds for sm_90a,
sm_80 + sm_90a and plain sm_90 (fa3 kernels are stubs there, and its probe checks that no fa3
entry is ever accepted), its fa3 launcher's TMA views agree with
codegen/families/fa3/host.py's and it refuses a missing total_k.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from codegen.dispatch_table import header_varlen_families, varlen_twin
from codegen.export import TunedPoint, render_header
from codegen.families import FA2, FA3, HeaderPart
from codegen.families.fa2.space import fa2_default_config
from codegen.families.fa3.host import dims_and_strides
from core.fa2_config import Fa2Config
from core.fa3_config import Fa3Config
from core.problem import Problem
from core.shape import Shape, nearest_shape, varlen_shape
from db.shipped import load_shipped_results
from db.store import Store
from service.header import export_header
from tests.support.factories import H200, make_config, make_report, ok_result
from tests.support.nvcc import build_host_probe
from tests.support.service_data import make_store

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_VARLEN = ROOT / "db" / "data" / "h200_results_varlen.json"
SHIPPED_VARLEN_FA3 = ROOT / "db" / "data" / "h200_results_varlen_fa3.json"
WHEN = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
ENUM = {"FA2TUNE_FP16": "fp16", "FA2TUNE_BF16": "bf16"}


def vl(config: Fa2Config) -> Fa2Config:
    return replace(config, varlen=True)


FAST = vl(make_config(128, "fp16", True, br=128, bc=64, stages=2, swizzle=True))
SLOW = vl(make_config(128, "fp16", True, br=64, bc=64, stages=2))
SMALL = vl(make_config(128, "fp16", True, br=64, bc=32, stages=2, swizzle=True))
TWIN = vl(make_config(128, "fp16", True, br=128, bc=128, stages=1, pad=8))

LONG = (100, 4000, 1822, 7)  # 4 sequences, mean 1482
SHORT = tuple([3, 50, 17, 90, 1, 64, 33, 22] * 4)  # 32 sequences, mean 35
SAME = (1482, 1482, 1482, 1482)  # the varlen shape of LONG, another problem: LONG's id wins

#: (lengths, [(config, median ms)]): the fastest of each problem wins.
PLAN: list[tuple[tuple[int, ...], list[tuple[Fa2Config, float]]]] = [
    (LONG, [(SLOW, 3.0), (FAST, 2.0)]),
    (SHORT, [(SMALL, 0.05), (FAST, 0.07)]),
    (SAME, [(TWIN, 1.0)]),
]


def _record(store: Store, problem: Problem, config: Fa2Config, ms: float) -> None:
    gpu_id = store.upsert_gpu(H200)
    bid = store.record_build(make_report(config))
    store.record_measurement(store.problem_id(problem, gpu_id), bid, ok_result(ms, problem), H200)


def _varlen(lens: tuple[int, ...]) -> Problem:
    return Problem.varlen(H200.name, 128, lens, heads=32, kv_heads=8, causal=True)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    s = make_store(tmp_path_factory.mktemp("varlen_export"))
    for lens, runs in PLAN:
        for cfg, ms in runs:
            _record(s, _varlen(lens), cfg, ms)
    # A dense winner too: the dense tables are unaffected by the varlen ones.
    dense = Problem(gpu=H200.name, d=128, n=1024, causal=True)
    _record(s, dense, make_config(128, "fp16", True, br=64, bc=64, stages=2, swizzle=True), 0.5)
    yield s
    s.close()


@pytest.fixture(scope="module")
def header(store: Store) -> str:
    return export_header(store, "H200", [128], dtypes=["fp16"], generated_at=WHEN)


#: One VarlenChoice: shape, launcher, name, guard (fa3's varlen guard, or nullptr for fa2).
_VARLEN_CHOICE = re.compile(
    r"\{\{(\d+), (\d+), (\d+), (\d+), (\d+)\}, "
    r'&(fa[23])::launch_varlen<fa2tune_configs::(\w+)>, "(\w+)", '
    r"(nullptr|&fa3::can_launch_varlen<fa2tune_configs::(\w+)>)\}"
)


def varlen_table(header: str) -> dict[tuple[int, str, bool], list[tuple[Shape, str]]]:
    """(D, dtype, causal) -> [(varlen shape, config name)], read from the kVarlenTuned tables;
    every entry's launcher and guard are its family's."""
    arrays = dict(
        re.findall(
            r"static constexpr VarlenChoice (kVarlen_\w+)\[\] = \{\n(.*?)\n\};", header, re.S
        )
    )
    rows = re.findall(r"\{(\d+), (FA2TUNE_\w+), (true|false), (kVarlen_\w+), (\d+)\},", header)
    out: dict[tuple[int, str, bool], list[tuple[Shape, str]]] = {}
    for d, enum, causal, ident, count in rows:
        entries = _VARLEN_CHOICE.findall(arrays[ident])
        assert len(entries) == int(count)
        for *_, family, alias, name, guard, guarded in entries:
            assert alias == name and name.endswith("_vl") and name.startswith(family + "_")
            # fa3's entries carry their guard; fa2's run wherever the header's code does.
            assert (guard == "nullptr") == (family == "fa2") and guarded in ("", name)
        shapes = [(Shape(*map(int, e[:5])), e[7]) for e in entries]
        assert [s for s, _ in shapes] == sorted(s for s, _ in shapes)
        out[(int(d), ENUM[enum], causal == "true")] = shapes
    return out


def varlen_defaults(header: str) -> set[str]:
    block = header.split("kVarlenDefaultChoices[] = {")[1].split("};")[0]
    return set(re.findall(r'"(\w+)"', block))


# ------------------------------------------------------------------------------ CPU


def test_tuned_varlen_configs_fill_the_varlen_table(header: str, store: Store) -> None:
    table = varlen_table(header)
    assert "static constexpr int kVarlenTunedCount = 1;" in header
    # LONG and SAME share a varlen shape: the one entry is LONG's winner (the lower problem
    # id, as Store.best_varlen breaks the tie), SHORT has its own.
    assert table == {
        (128, "fp16", True): sorted(
            [(varlen_shape(LONG, 32, 8), FAST.name), (varlen_shape(SHORT, 32, 8), SMALL.name)]
        )
    }
    tie = store.best_varlen(H200.name, 128, "fp16", True, (1000, 1964, 1482, 1482), 32, 8)
    assert tie is not None and tie[1] == LONG and tie[0].config == FAST
    for cfg in (FAST, SMALL):
        alias = f"fa2tune_configs::{cfg.name}"
        assert f"using {cfg.name} = {FA2.header.traits(cfg)};" in header
        assert FA2.header.traits(cfg).endswith(", true>")  # the Traits' Varlen flag
        for line in FA2.header.instantiations(alias, varlen=True):
            assert header.count(line) == 1, line
        assert f"fa2::fwd_kernel<{alias}>" not in header  # its dense entry would not compile
    assert SLOW.name not in header and TWIN.name not in header


def test_varlen_provenance_and_api_documented(header: str) -> None:
    top = header.split("#ifndef FA2TUNE_EXPORTED_HEADER_")[0]
    assert "fa2tune_forward_varlen(const FaParams& p, const FaVarlen& v, int num_seqs," in top
    assert "fa2tune_config_name_varlen(" in top and "fa2tune_nearest_tuned_varlen(" in top
    provenance = top.split("// Packed variable-length (varlen) results")[1]
    assert (
        f"D=128 fp16 causal varlen 4 seqs, mean 1482, max 4000, total 5929 H=32/8kv: {FAST.name}"
        in provenance
    )
    assert "varlen 4 seqs, mean 1482, max 4000, total 5929 H=32/8kv: " + FAST.name in provenance
    assert "varlen 32 seqs, mean 35, max 90, total 1120 H=32/8kv: " + SMALL.name in provenance
    assert "2.0000 ms" in provenance
    assert "inline cudaError_t fa2tune_forward_varlen(" in header
    # The dense table still holds exactly the dense winner.
    assert "static constexpr int kTunedCount = 1;" in header


def test_every_default_has_its_varlen_twin(header: str) -> None:
    defaults = [fa2_default_config(128, "fp16", c) for c in (False, True)]
    assert varlen_defaults(header) == {varlen_twin(c).name for c in defaults}
    assert "static constexpr int kVarlenDefaultCount = 2;" in header
    assert "{128, FA2TUNE_FP16, true, &kVarlenDefaultChoices[1], 1}," in header


def test_store_without_varlen_results_gets_the_twins(tmp_path: Path) -> None:
    s = make_store(tmp_path)
    _record(s, Problem(gpu=H200.name, d=64, n=2048), make_config(64, swizzle=True), 0.3)
    text = export_header(s, "H200", generated_at=WHEN)
    s.close()
    assert "static constexpr int kVarlenTunedCount = 0;" in text
    assert "//   (none: packed batches run the defaults' varlen twins)" in text
    dense = set(re.findall(r'"(\w+)"', text.split("kDefaultChoices[] = {")[1].split("};")[0]))
    # The common head dims (5) x dtypes x masks, FA2's default and split-KV's for decode.
    assert len(dense) == 40
    assert sum(name.startswith("splitkv_") for name in dense) == 20
    # The packed defaults are the FA2 defaults' twins (split-KV has no varlen kernels).
    assert varlen_defaults(text) == {n + "_vl" for n in dense if n.startswith("fa2_")}
    assert not re.search(r"kVarlen_d\d+", text)


def test_shipped_varlen_results_render_to_the_stores_best(tmp_path: Path) -> None:
    s = make_store(tmp_path)
    load_shipped_results(s, [SHIPPED_VARLEN])
    table = varlen_table(export_header(s, "H200", generated_at=WHEN))
    problems = json.loads(SHIPPED_VARLEN.read_text())["problems"]
    assert len(problems) == 4 and len(table) == 4
    for p in problems:
        lens = tuple(p["seqlens"])
        best = s.best_varlen(H200.name, p["d"], p["dtype"], p["causal"], lens,
                             p["heads"], p["kv_heads"])  # fmt: skip
        assert best is not None and best[0].exact
        shape = varlen_shape(lens, p["heads"], p["kv_heads"])
        assert table[(p["d"], p["dtype"], p["causal"])] == [(shape, best[0].config.name)]
    s.close()


@pytest.fixture(scope="module")
def fa3_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """The shipped H200 varlen results of both families (fa3's are the faster)."""
    s = make_store(tmp_path_factory.mktemp("varlen_fa3"))
    load_shipped_results(s, [SHIPPED_VARLEN, SHIPPED_VARLEN_FA3])
    yield s
    s.close()


@pytest.fixture(scope="module")
def fa3_header(fa3_store: Store) -> str:
    """fp16 only: two fa3 varlen winners, and a build a third the size of both dtypes'."""
    return export_header(fa3_store, "H200", [128], dtypes=["fp16"], generated_at=WHEN)


def test_header_launches_both_families_packed() -> None:
    assert header_varlen_families() == ["fa2", "fa3"]
    alias = "fa2tune_configs::x_vl"
    assert FA3.header.instantiations(alias, varlen=True) == [
        "template __global__ void fa3::fwd_varlen_kernel<fa2tune_configs::x_vl>(const FaParams, "
        "const fa3::VarlenArgs, const __grid_constant__ CUtensorMap, "
        "const __grid_constant__ CUtensorMap, const __grid_constant__ CUtensorMap);",
        "template cudaError_t fa3::launch_varlen<fa2tune_configs::x_vl>"
        "(const FaParams&, const FaVarlen&, cudaStream_t);",
        "template bool fa3::can_launch_varlen<fa2tune_configs::x_vl>"
        "(const FaParams&, const FaVarlen&);",
    ]
    assert (
        FA2.header.varlen_guard is None and len(FA2.header.instantiations(alias, varlen=True)) == 2
    )


def test_fa3_varlen_winners_are_the_headers(fa3_store: Store) -> None:
    """With the Hopper family's varlen results shipped too (faster, so the store's answer),
    the header takes each problem's fa3 winner, with its launcher, guard and instantiations,
    and inlines the family's part even without a dense fa3 winner."""
    header = export_header(fa3_store, "H200", generated_at=WHEN)
    table = varlen_table(header)
    problems = json.loads(SHIPPED_VARLEN_FA3.read_text())["problems"]
    assert len(problems) == 4 and len(table) == 4
    for p in problems:
        lens = tuple(p["seqlens"])
        best = fa3_store.best_varlen(H200.name, p["d"], p["dtype"], p["causal"], lens,
                                     p["heads"], p["kv_heads"])  # fmt: skip
        assert best is not None and best[0].exact and best[0].config.family == "fa3"
        shape = varlen_shape(lens, p["heads"], p["kv_heads"])
        assert table[(p["d"], p["dtype"], p["causal"])] == [(shape, best[0].config.name)]
        cfg = best[0].config
        assert isinstance(cfg, Fa3Config) and cfg.varlen
        alias = f"fa2tune_configs::{cfg.name}"
        assert f"using {cfg.name} = {FA3.header.traits(cfg)};" in header
        for line in FA3.header.instantiations(alias, varlen=True):
            assert header.count(line) == 1, line
        assert f"fa3::fwd_kernel<{alias}>" not in header  # its dense kernel static_asserts
    assert "// ---- begin fa3_launch.cuh ----" in header
    assert "-gencode=arch=compute_90a,code=sm_90a" in header.split("// PUBLIC API")[0]
    assert "(family fa3)" in header.split("// PUBLIC API")[0]
    # The defaults stay fa2's: they must run wherever the header's code does.
    assert all(n.startswith("fa2_") for n in varlen_defaults(header))


def test_fa2_only_varlen_results_leave_fa3_out(tmp_path: Path) -> None:
    s = make_store(tmp_path)
    load_shipped_results(s, [SHIPPED_VARLEN])
    header = export_header(s, "H200", generated_at=WHEN)
    s.close()
    assert "// ---- begin fa3_launch.cuh ----" not in header
    assert "// (fa3: no config of this family in the header)" in header
    table = header.split("namespace fa2tune_configs {")[1].split("}  // namespace fa2tune_detail")[
        0
    ]
    assert "fa3" not in table


def test_varlen_points_are_filtered_and_checked() -> None:
    packed = TunedPoint(128, "fp16", True, 4000, FAST, batch=4, heads=32, kv_heads=8,
                        seqlens=LONG)  # fmt: skip
    assert packed.shape == varlen_shape(LONG, 32, 8)
    text = render_header("NVIDIA H200", [packed], ds=[64], dtypes=["fp16"])
    assert FAST.name not in text and "kVarlenTunedCount = 0;" in text  # D=128 not asked for
    text = render_header("NVIDIA H200", [packed], ds=[128], dtypes=["fp16"])
    assert FAST.name in text and "kVarlenTunedCount = 1;" in text
    assert "kTunedCount = 0;" in text  # a packed point is no dense entry
    with pytest.raises(ValueError, match="not a varlen"):
        replace(packed, config=make_config(128, "fp16", True))
    with pytest.raises(ValueError, match="counts the sequences"):
        replace(packed, seqlens=SHORT)
    dense_only = HeaderPart(template="t.cuh", traits=str, kernel="k", launcher="l")
    with pytest.raises(ValueError, match="no varlen kernels"):
        dense_only.instantiations("x", varlen=True)


# ------------------------------------------------------------------------------ nvcc

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
SM80 = "-gencode=arch=compute_80,code=sm_80"
SM90 = "-gencode=arch=compute_90,code=sm_90"
SM90A = "-gencode=arch=compute_90a,code=sm_90a"

PROBE = r"""
#include "fa2_tuned.cuh"
#include <cstdio>
#include <cstdlib>
// Host-only (no GPU is touched). argv: "n total ..." pairs: the tuned varlen entry for a
// batch of n sequences and `total` query rows at H=32/8kv on 132 SMs, and fa_shape.cuh's
// varlen_shape mean; then the config named off the tuned GPU and the refusals.
int main(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const int n = std::atoi(argv[i]), total = std::atoi(argv[i + 1]);
    fa2tune_tuned_choice c{};
    if (!fa2tune_nearest_tuned_varlen(128, FA2TUNE_FP16, true, n, total, 32, 8, 132, &c))
      return 1;
    const long long mean = fa2tune_shape::varlen_shape(total, n, 32, 8).nq;
    std::printf("nearest %d %d %lld %d %d %s\n", n, total, mean, c.nq, c.batch, c.name);
  }
  int32_t* cu = reinterpret_cast<int32_t*>(std::uintptr_t{1} << 20);  // never read
  FaParams p{};
  p.q = p.k = p.v = p.o = reinterpret_cast<void*>(std::uintptr_t{1} << 21);
  p.q_heads = 32; p.kv_heads = 8; p.softmax_scale = 0.1f;
  p.q_row_stride = p.o_row_stride = 128LL * 32; p.k_row_stride = p.v_row_stride = 128LL * 8;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = 128;
  p.q_batch_stride = 3;  // ignored: a packed call has none
  const FaVarlen v{cu, cu + 64, 5929, 0};
  const char* name = fa2tune_config_name_varlen(p, v, 4, 4000, 4000, 128, FA2TUNE_FP16, true);
  std::printf("default %s\n", name == nullptr ? "null" : name);
  const FaVarlen misaligned{reinterpret_cast<const int32_t*>(std::uintptr_t{1} << 20 | 2),
                            cu, 5929, 0};
  const FaVarlen null_offsets{nullptr, cu, 5929, 0};
  const FaVarlen short_total{cu, cu, 3999, 0};
  const bool refused[] = {
      fa2tune_forward_varlen(p, v, 0, 4000, 4000, 128, FA2TUNE_FP16, true) == cudaErrorInvalidValue,
      fa2tune_forward_varlen(p, v, 4, 0, 4000, 128, FA2TUNE_FP16, true) == cudaErrorInvalidValue,
      fa2tune_forward_varlen(p, v, 4, 4000, 4000, 72, FA2TUNE_FP16, true) == cudaErrorInvalidValue,
      fa2tune_forward_varlen(p, v, 4, 4000, 4000, 128, FA2TUNE_BF16, true) == cudaErrorInvalidValue,
      fa2tune_forward_varlen(p, misaligned, 4, 4000, 4000, 128, FA2TUNE_FP16, true) ==
          cudaErrorInvalidValue,
      fa2tune_forward_varlen(p, null_offsets, 4, 4000, 4000, 128, FA2TUNE_FP16, true) ==
          cudaErrorInvalidValue,
      fa2tune_forward_varlen(p, short_total, 4, 4000, 4000, 128, FA2TUNE_FP16, true) ==
          cudaErrorInvalidValue,
      fa2tune_forward_varlen(FaParams{}, v, 4, 4000, 4000, 128, FA2TUNE_FP16, true) ==
          cudaErrorInvalidValue,
      fa2tune_config_name_varlen(p, v, 0, 4000, 4000, 128, FA2TUNE_FP16, true) == nullptr,
      !fa2tune_nearest_tuned_varlen(128, FA2TUNE_FP16, false, 4, 5929, 32, 8, 132, nullptr),
      !fa2tune_nearest_tuned_varlen(128, FA2TUNE_FP16, true, 0, 5929, 32, 8, 132, nullptr),
  };
  int n_refused = 0;
  for (bool r : refused) n_refused += r;
  std::printf("refused %d of %zu\n", n_refused, sizeof(refused) / sizeof(refused[0]));
  return 0;
}
"""

#: (sequences, total query rows) asked: near each tuned batch, between them, and the mean's
#: rounding ties (5 / 2 = 2.5 -> 2, 7 / 2 = 3.5 -> 4, as Python's round).
ASKED = [(4, 5929), (4, 5928), (32, 1120), (16, 4000), (8, 12000), (64, 64), (1, 1),
         (2, 5), (2, 7), (1000, 20000), (3, 2**31 - 1)]  # fmt: skip


def lengths(n: int, total: int) -> tuple[int, ...]:
    """Some n lengths >= 1 adding up to total (the varlen shape only sees n and total)."""
    return (total - (n - 1), *([1] * (n - 1)))


def run_probe(header: str, tmp_path: Path, targets: tuple[str, ...], units: list[str]) -> None:
    assert NVCC is not None
    (tmp_path / "fa2_tuned.cuh").write_text(header)
    (tmp_path / "probe.cu").write_text(PROBE)
    (tmp_path / "other.cu").write_text('#include "fa2_tuned.cuh"\n')
    build_host_probe(tmp_path, *targets, *units, "-o", "probe")
    args = [str(x) for pair in ASKED for x in pair]
    out = subprocess.run(
        [str(tmp_path / "probe"), *args], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    tuned = {varlen_shape(LONG, 32, 8): FAST.name, varlen_shape(SHORT, 32, 8): SMALL.name}
    picked = [x.split()[1:] for x in lines if x.startswith("nearest ")]
    assert len(picked) == len(ASKED)
    for (n, total), got in zip(ASKED, picked, strict=True):
        asked = varlen_shape(lengths(n, total), 32, 8)
        near = nearest_shape(asked, sorted(tuned), 132, phased=False)
        assert near is not None
        assert [int(x) for x in got[:5]] == [n, total, asked.nq, near.nq, near.batch], (n, total)
        assert got[5] == tuned[near], (n, total)
    assert f"default {varlen_twin(fa2_default_config(128, 'fp16', True)).name}" in lines
    assert "refused 11 of 11" in lines


def test_the_probes_picks_are_the_stores(store: Store) -> None:
    """The probe's expectations (core.shape over the header's entries) are Store.best_varlen's
    answers for lengths it holds no exact match for."""
    tuned = {varlen_shape(LONG, 32, 8): FAST.name, varlen_shape(SHORT, 32, 8): SMALL.name}
    assert H200.sm_count == 132  # the probe's SM count
    for n, total in ASKED:
        lens = lengths(n, total)
        near = nearest_shape(varlen_shape(lens, 32, 8), sorted(tuned), 132, phased=False)
        assert near is not None
        best = store.best_varlen(H200.name, 128, "fp16", True, lens, 32, 8)
        assert best is not None and best[0].config.name == tuned[near], (n, total)


@pytest.mark.slow
@pytest.mark.compile
@needs_nvcc
def test_sm90_build_dispatches_packed_batches(header: str, tmp_path: Path) -> None:
    """Plain sm_90, two translation units (the header's inline tables link twice)."""
    run_probe(header, tmp_path, (SM90,), ["probe.cu", "other.cu"])


@pytest.mark.slow
@pytest.mark.compile
@needs_nvcc
def test_fat_sm80_sm90a_build_dispatches_packed_batches(header: str, tmp_path: Path) -> None:
    run_probe(header, tmp_path, (SM80, SM90A), ["probe.cu"])


# ------------------------------------------------------------------- nvcc, fa3 varlen

FA3_PROBE = r"""
#include "fa2_tuned.cuh"
#include <cstdio>
#include <cstring>
// Host-only: nothing here launches a kernel on real data (the pointers are never read).
// argv[1] == "stub": the build has no sm_90a code, so an fa3 launch must be refused.
static FaParams packed(int d, int h, int h_kv) {
  FaParams p{};
  p.q = p.k = p.v = p.o = reinterpret_cast<void*>(std::uintptr_t{1} << 21);
  p.q_heads = h; p.kv_heads = h_kv; p.softmax_scale = 0.1f;
  p.q_row_stride = p.o_row_stride = 1LL * d * h; p.k_row_stride = p.v_row_stride = 1LL * d * h_kv;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = d;
  return p;
}
int main(int argc, char** argv) {
  const bool stub = argc > 1 && std::strcmp(argv[1], "stub") == 0;
  // 1. The packed views varlen_views builds, for tensors read from stdin:
  //    d total h row head (element strides), Q's and K's alike.
  long long d, total, h, row, head;
  while (std::scanf("%lld %lld %lld %lld %lld", &d, &total, &h, &row, &head) == 5) {
    FaParams p = packed(int(d), int(h), int(h));
    p.batch = 1; p.nq = p.nk = 1;
    p.q_row_stride = p.k_row_stride = p.v_row_stride = row;
    p.q_head_stride = p.k_head_stride = p.v_head_stride = head;
    fa3::launch_detail::TensorView q, k, v;
    if (!fa3::launch_detail::varlen_views(p, int(d), int(total), int(total), &q, &k, &v)) {
      std::printf("view refused\n");
      continue;
    }
    const bool same = std::memcmp(q.dims, k.dims, sizeof q.dims) == 0 &&
                      std::memcmp(q.strides, v.strides, sizeof q.strides) == 0;
    std::printf("view %llu %llu %llu %llu %llu %llu %llu%s\n", (unsigned long long)q.dims[0],
                (unsigned long long)q.dims[1], (unsigned long long)q.dims[2],
                (unsigned long long)q.dims[3], (unsigned long long)q.strides[0],
                (unsigned long long)q.strides[1], (unsigned long long)q.strides[2],
                same ? "" : " (K, V differ)");
  }
  // 2. The shipped batch (16 sequences, 37586 rows, H=32/8kv) as varlen_params makes it.
  int32_t* cu = reinterpret_cast<int32_t*>(std::uintptr_t{1} << 20);  // never read
  FaParams s = packed(128, 32, 8);
  s.batch = 16; s.nq = s.nk = 4000;
  const FaVarlen v{cu, cu + 64, 37586, 37586};
  for (int i = 0; i < fa2tune_detail::kVarlenTunedCount; ++i)
    for (int j = 0; j < fa2tune_detail::kVarlenTuned[i].count; ++j) {
      const fa2tune_detail::VarlenChoice& c = fa2tune_detail::kVarlenTuned[i].choices[j];
      std::printf("choice %s %d %d\n", c.name, c.accepts != nullptr,
                  fa2tune_detail::accepts_varlen(c, s, v) ? 1 : 0);
    }
  // 3. What a call of that batch gets: the fa3 winner only where it can run, else the twin;
  // the device-free query names the tuned entry whatever can run.
  const char* name = fa2tune_config_name_varlen(s, v, 16, 4000, 4000, 128, FA2TUNE_FP16, true);
  std::printf("picked %s %d\n", name ? name : "(none)", fa2tune_detail::on_tuned_gpu() ? 1 : 0);
  fa2tune_tuned_choice t{};
  if (fa2tune_nearest_tuned_varlen(128, FA2TUNE_FP16, true, 16, 37586, 32, 8, 132, &t))
    std::printf("nearest %s\n", t.name);
  // 4. The fa3 launcher refuses, before touching a device, what it cannot take: total_k
  // (reserved) unset or below the longest key sequence, bad parameters or offsets.
  using Vl = fa2tune_configs::FA3_VL_NAME;
  const FaVarlen unset{cu, cu, 37586, 0}, short_k{cu, cu, 37586, 3999},
      negative{cu, cu, 37586, -1}, short_q{cu, cu, 3999, 37586}, null_k{cu, nullptr, 37586, 37586};
  const bool refused[] = {
      fa3::launch_varlen<Vl>(s, unset, 0) == cudaErrorInvalidValue,
      fa3::launch_varlen<Vl>(s, short_k, 0) == cudaErrorInvalidValue,
      fa3::launch_varlen<Vl>(s, negative, 0) == cudaErrorInvalidValue,
      fa3::launch_varlen<Vl>(s, short_q, 0) == cudaErrorInvalidValue,
      fa3::launch_varlen<Vl>(s, null_k, 0) == cudaErrorInvalidValue,
      fa3::launch_varlen<Vl>(FaParams{}, v, 0) == cudaErrorInvalidValue,
      !fa3::can_launch_varlen<Vl>(FaParams{}, v),
      // Without sm_90a code (or a GPU) even a valid call cannot launch: the stub is refused.
      !stub || fa3::launch_varlen<Vl>(s, v, 0) != cudaSuccess,
      !stub || !fa3::can_launch_varlen<Vl>(s, v),
  };
  int n_refused = 0;
  for (bool r : refused) n_refused += r;
  std::printf("refused %d of %zu\n", n_refused, sizeof(refused) / sizeof(refused[0]));
  return 0;
}
"""

#: (d, total rows, heads, row stride, head stride) of packed tensors (element strides).
PACKED_VIEWS: list[tuple[int, int, int, int, int]] = [
    (128, 37586, 32, 32 * 128, 128),  # Q of the shipped batch
    (128, 37586, 8, 8 * 128, 128),  # its K and V
    (64, 1, 1, 64, 64),  # one row of one head: every outer stride synthetic
    (96, 77, 2, 2 * 96, 96),  # D=96
    (128, 300, 4, 4 * 136, 136),  # padded heads
    (64, 10, 2, -128, 64),  # negative row stride: no TMA view
    (64, 10, 2, 128, 0),  # broadcast heads: none either
    (64, 2, 1, 1 << 39, 64),  # a 2^40-byte row stride: over TMA's limit
]


def packed_view_line(case: tuple[int, int, int, int, int]) -> tuple[str, str]:
    """The probe's stdin line and the view codegen/families/fa3/host.py's
    fa3_varlen_tensor_maps encodes (the packed tensor as [1, total, heads, D]), or the refusal."""
    d, total, h, row, head = case
    line = f"{d} {total} {h} {row} {head}"
    if any(size > 1 and (s <= 0 or 2 * s >= 1 << 40) for size, s in ((total, row), (h, head))):
        return line, "view refused"
    dims, strides = dims_and_strides((1, total, h, d), (total * row, row, head, 1), 2, "bnhd")
    return line, "view " + " ".join(map(str, dims + strides))


def run_fa3_probe(
    header: str, tmp_path: Path, targets: tuple[str, ...], units: list[str], stub: bool
) -> list[str]:
    """Build FA3_PROBE against ``header`` and run it; its output lines, views checked."""
    assert NVCC is not None
    fa3_names = re.findall(r'"(fa3_\w+_vl)"', header)
    assert fa3_names, "the header has no fa3 varlen entry"
    (tmp_path / "fa2_tuned.cuh").write_text(header)
    (tmp_path / "probe.cu").write_text(FA3_PROBE.replace("FA3_VL_NAME", fa3_names[0]))
    (tmp_path / "other.cu").write_text('#include "fa2_tuned.cuh"\n')
    build_host_probe(tmp_path, *targets, *units, "-o", "probe")
    cases = [packed_view_line(c) for c in PACKED_VIEWS]
    out = subprocess.run(
        [str(tmp_path / "probe"), *(["stub"] if stub else [])],
        input="".join(line + "\n" for line, _ in cases),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [x for x in lines if x.startswith("view")] == [want for _, want in cases]
    assert "refused 9 of 9" in lines
    return lines


def check_fa3_probe(lines: list[str], fa3_store: Store, sm90a: bool) -> None:
    """Every fa3 entry is guarded (and never accepted without sm_90a code); the shipped
    batch gets the fa3 winner only where it can run, the fa2 twin otherwise."""
    (winner,) = [
        b.config.name for b, _ in fa3_store.varlen_winners(H200.name, ["fa2", "fa3"])
        if (b.dtype, b.causal) == ("fp16", True)
    ]  # fmt: skip
    assert winner.startswith("fa3_") and winner.endswith("_vl")
    choices = [x.split()[1:] for x in lines if x.startswith("choice ")]
    assert len(choices) == 2 and all(name.startswith("fa3_") for name, *_ in choices)
    assert all(guarded == "1" for _, guarded, _ in choices)
    if not sm90a:
        assert all(accepted == "0" for *_, accepted in choices)
    picked = next(x.split() for x in lines if x.startswith("picked "))
    accepted = dict((name, ok) for name, _, ok in choices)
    twin = varlen_twin(fa2_default_config(128, "fp16", True)).name
    want = winner if picked[2] == "1" and accepted[winner] == "1" else twin
    assert picked[1] == want
    assert f"nearest {winner}" in lines


@pytest.mark.slow
@pytest.mark.compile
@needs_nvcc
@pytest.mark.parametrize("targets", [(SM90A,), (SM80, SM90A)], ids=["sm_90a", "sm_80+sm_90a"])
def test_fa3_varlen_header_builds_for_sm90a(
    fa3_header: str, fa3_store: Store, tmp_path: Path, targets: tuple[str, ...]
) -> None:
    lines = run_fa3_probe(fa3_header, tmp_path, targets, ["probe.cu"], stub=False)
    check_fa3_probe(lines, fa3_store, sm90a=True)


@pytest.mark.slow
@pytest.mark.compile
@needs_nvcc
def test_fa3_varlen_header_on_plain_sm90_falls_back_to_fa2(
    fa3_header: str, fa3_store: Store, tmp_path: Path
) -> None:
    """Plain sm_90, two translation units: the fa3 kernels are stubs, no fa3 entry is ever
    accepted, and packed batches run the fa2 twin."""
    lines = run_fa3_probe(fa3_header, tmp_path, (SM90,), ["probe.cu", "other.cu"], stub=True)
    check_fa3_probe(lines, fa3_store, sm90a=False)
