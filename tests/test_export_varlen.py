"""The exported header's packed variable-length entry, fa2tune_forward_varlen.

CPU: a store's varlen winners become the header's varlen tables (``_vl`` aliases with the
Traits' Varlen flag, varlen kernel and launcher instantiations, one entry per varlen shape);
a store without varlen results still gets the default's varlen twin per (D, dtype, causal);
the shipped H200 varlen results render to the store's best. ``compile``: a host-only probe
(no GPU is touched) built for sm_90 (two translation units) and for sm_80 + sm_90a checks
fa2tune_nearest_tuned_varlen and fa_shape.cuh's varlen_shape against the store's rule
(db.queries.varlen_shape, Store.best_varlen), the default twin off the tuned GPU, and the
refusals.
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
from factories import H200, make_config, make_report, ok_result
from test_service_data import make_store

from codegen.export import TunedPoint, render_header
from codegen.export_varlen import VarlenPoint, varlen_twin
from codegen.families import FA2, HeaderPart
from codegen.space import fa2_default_config
from core.config import KernelConfig
from core.problem import Problem
from core.shape import Shape, nearest_shape
from db.queries import varlen_shape
from db.shipped import load_shipped_results
from db.store import Store
from service.header import export_header

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_VARLEN = ROOT / "db" / "data" / "h200_results_varlen.json"
SHIPPED_VARLEN_FA3 = ROOT / "db" / "data" / "h200_results_varlen_fa3.json"
WHEN = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
ENUM = {"FA2TUNE_FP16": "fp16", "FA2TUNE_BF16": "bf16"}


def vl(config: KernelConfig) -> KernelConfig:
    return replace(config, varlen=True)


FAST = vl(make_config(128, "fp16", True, br=128, bc=64, stages=2, swizzle=True))
SLOW = vl(make_config(128, "fp16", True, br=64, bc=64, stages=2))
SMALL = vl(make_config(128, "fp16", True, br=64, bc=32, stages=2, swizzle=True))
TWIN = vl(make_config(128, "fp16", True, br=128, bc=128, stages=1, pad=8))

LONG = (100, 4000, 1822, 7)  # 4 sequences, mean 1482
SHORT = tuple([3, 50, 17, 90, 1, 64, 33, 22] * 4)  # 32 sequences, mean 35
SAME = (1482, 1482, 1482, 1482)  # the varlen shape of LONG, another problem: LONG's id wins

#: (lengths, [(config, median ms)]): the fastest of each problem wins.
PLAN: list[tuple[tuple[int, ...], list[tuple[KernelConfig, float]]]] = [
    (LONG, [(SLOW, 3.0), (FAST, 2.0)]),
    (SHORT, [(SMALL, 0.05), (FAST, 0.07)]),
    (SAME, [(TWIN, 1.0)]),
]


def _record(store: Store, problem: Problem, config: KernelConfig, ms: float) -> None:
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


def varlen_table(header: str) -> dict[tuple[int, str, bool], list[tuple[Shape, str]]]:
    """(D, dtype, causal) -> [(varlen shape, config name)], read from the kVarlenTuned tables."""
    arrays = dict(
        re.findall(
            r"inline constexpr VarlenChoice (kVarlen_\w+)\[\] = \{\n(.*?)\n\};", header, re.S
        )
    )
    rows = re.findall(r"\{(\d+), (FA2TUNE_\w+), (true|false), (kVarlen_\w+), (\d+)\},", header)
    out: dict[tuple[int, str, bool], list[tuple[Shape, str]]] = {}
    for d, enum, causal, ident, count in rows:
        entries = re.findall(
            r"\{\{(\d+), (\d+), (\d+), (\d+), (\d+)\}, "
            r'&fa2::launch_varlen<fa2tune_configs::(\w+)>, "(\w+)"\}',
            arrays[ident],
        )
        assert len(entries) == int(count)
        for *_, alias, name in entries:
            assert alias == name and name.endswith("_vl")
        shapes = [(Shape(*map(int, dims)), name) for *dims, _, name in entries]
        assert [s for s, _ in shapes] == sorted(s for s, _ in shapes)
        out[(int(d), ENUM[enum], causal == "true")] = shapes
    return out


def varlen_defaults(header: str) -> set[str]:
    block = header.split("kVarlenDefaultChoices[] = {")[1].split("};")[0]
    return set(re.findall(r'"(\w+)"', block))


# ------------------------------------------------------------------------------ CPU


def test_tuned_varlen_configs_fill_the_varlen_table(header: str, store: Store) -> None:
    table = varlen_table(header)
    assert "inline constexpr int kVarlenTunedCount = 1;" in header
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
    assert "fa2tune_forward_varlen(const Fa2Params& p, const FaVarlen& v, int num_seqs," in top
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
    assert "inline constexpr int kTunedCount = 1;" in header


def test_every_default_has_its_varlen_twin(header: str) -> None:
    defaults = [fa2_default_config(128, "fp16", c) for c in (False, True)]
    assert varlen_defaults(header) == {varlen_twin(c).name for c in defaults}
    assert "inline constexpr int kVarlenDefaultCount = 2;" in header
    assert "{128, FA2TUNE_FP16, true, &kVarlenDefaultChoices[1], 1}," in header


def test_store_without_varlen_results_gets_the_twins(tmp_path: Path) -> None:
    s = make_store(tmp_path)
    _record(s, Problem(gpu=H200.name, d=64, n=2048), make_config(64, swizzle=True), 0.3)
    text = export_header(s, "H200", generated_at=WHEN)
    s.close()
    assert "inline constexpr int kVarlenTunedCount = 0;" in text
    assert "//   (none: packed batches run the defaults' varlen twins)" in text
    dense = set(re.findall(r'"(\w+)"', text.split("kDefaultChoices[] = {")[1].split("};")[0]))
    assert len(dense) == 20  # the common head dims (5) x dtypes x masks
    assert varlen_defaults(text) == {n + "_vl" for n in dense}
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


def test_fa3_varlen_winners_leave_the_header_the_fa2_winners(tmp_path: Path) -> None:
    """With the Hopper family's varlen results shipped too (faster, so the store's answer),
    the header, which launches only fa2 packed, still gets each problem's fa2 winner."""
    s = make_store(tmp_path)
    load_shipped_results(s, [SHIPPED_VARLEN, SHIPPED_VARLEN_FA3])
    table = varlen_table(export_header(s, "H200", generated_at=WHEN))
    problems = json.loads(SHIPPED_VARLEN.read_text())["problems"]
    assert len(table) == 4
    for p in problems:
        lens = tuple(p["seqlens"])
        best = s.best_varlen(H200.name, p["d"], p["dtype"], p["causal"], lens,
                             p["heads"], p["kv_heads"])  # fmt: skip
        assert best is not None and best[0].config.name.startswith("fa3_")
        ((_, name),) = table[(p["d"], p["dtype"], p["causal"])]
        assert name.startswith("fa2_") and name.endswith("_vl")
        (fa2_best,) = [
            b for b, held in s.varlen_winners(H200.name, ["fa2"]) if held == lens
            and (b.dtype, b.causal) == (p["dtype"], p["causal"])
        ]  # fmt: skip
        assert name == fa2_best.config.name
    s.close()


def test_varlen_points_are_filtered_and_checked() -> None:
    point = TunedPoint(128, "fp16", True, 4000, FAST, batch=4, heads=32, kv_heads=8)
    packed = VarlenPoint(point, LONG, varlen_shape(LONG, 32, 8))
    text = render_header("NVIDIA H200", [], varlen=[packed], ds=[64], dtypes=["fp16"])
    assert FAST.name not in text and "kVarlenTunedCount = 0;" in text  # D=128 not asked for
    text = render_header("NVIDIA H200", [], varlen=[packed], ds=[128], dtypes=["fp16"])
    assert FAST.name in text and "kVarlenTunedCount = 1;" in text
    dense = replace(point, config=make_config(128, "fp16", True))
    with pytest.raises(ValueError, match="not a varlen"):
        VarlenPoint(dense, LONG, varlen_shape(LONG, 32, 8))
    with pytest.raises(ValueError, match="counts the sequences"):
        VarlenPoint(point, LONG, varlen_shape(SHORT, 32, 8))
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
  Fa2Params p{};
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
      fa2tune_forward_varlen(Fa2Params{}, v, 4, 4000, 4000, 128, FA2TUNE_FP16, true) ==
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
    proc = subprocess.run(
        [NVCC, "-std=c++17", *targets, *units, "-o", "probe"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, f"nvcc failed:\n{proc.stdout}\n{proc.stderr}"
    assert "warning" not in proc.stderr.lower(), proc.stderr
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
        near = nearest_shape(asked, sorted(tuned), 132)
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
        near = nearest_shape(varlen_shape(lens, 32, 8), sorted(tuned), 132)
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
