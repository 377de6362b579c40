"""The exported header dispatches on the whole call shape (issue 13).

CPU: the table holds one entry per tuned problem with its whole shape (Nq, Nk, batch, heads,
KV heads), sorted by shape, and the provenance names each shape. ``compile``: the C++ twin of
core.shape (codegen/templates/fa_shape.cuh, built on its own with the host compiler) picks
the same tuned shape at the same distance, to the last bit, as core.shape.nearest_shape for
a few hundred seeded random calls (decode, GQA/MQA, Nq != Nk, ties); and a whole exported
header's fa2tune_nearest_tuned agrees with the store's winners at Python's nearest shape.
"""

from __future__ import annotations

import random
import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from codegen.export import TEMPLATE_DIR, TunedPoint, render_header
from core.fa2_config import Fa2Config
from core.problem import Problem
from core.shape import Shape, nearest_shape, shape_distance
from db.store import Store
from service.header import tuned_shape_results
from tests.support.factories import H200, make_config, make_report, ok_result

WHEN = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
CXX = shutil.which("g++") or shutil.which("clang++")
NVCC = shutil.which("nvcc")

CFG_A = make_config(64, "fp16", False, br=128, bc=64, stages=2, swizzle=True)
CFG_B = make_config(64, "fp16", False, br=64, bc=64, stages=2, swizzle=True)

#: Tuned problems of D=64 fp16 full: (shape, winner, median ms). Shapes differing only in
#: batch, heads, KV heads or Nk each keep an entry, even with the same winner.
PLAN: list[tuple[Shape, Fa2Config, float]] = [
    (Shape(4096, 4096, 2, 16, 16), CFG_A, 0.50),
    (Shape(4096, 4096, 8, 32, 8), CFG_B, 1.60),  # GQA group 4
    (Shape(1, 8192, 16, 32, 4), CFG_B, 0.02),  # decode
    (Shape(1024, 4096, 2, 16, 16), CFG_A, 0.20),  # Nq != Nk
    (Shape(1024, 1024, 2, 16, 16), CFG_B, 0.05),
    (Shape(1024, 1024, 4, 16, 16), CFG_A, 0.09),  # same but batch
]


def fill_store(s: Store) -> None:
    """The shared module store's rows (``PLAN``)."""
    gpu_id = s.upsert_gpu(H200)
    for trial, (sh, cfg, ms) in enumerate(PLAN):
        problem = Problem(
            gpu=H200.name, d=64, n=sh.nq, nk=sh.nk, batch=sh.batch, heads=sh.heads,
            kv_heads=sh.kv_heads, dtype="fp16", causal=False,
        )  # fmt: skip
        pid = s.problem_id(problem, gpu_id)
        bid = s.record_build(make_report(cfg))  # type: ignore[arg-type]
        s.record_measurement(pid, bid, ok_result(ms, problem), H200, trial_number=trial)


HEADER = {"gpu": "H200", "ds": [64], "dtypes": ["fp16"], "generated_at": WHEN}


_ENTRY = re.compile(
    r'\{\{(\d+), (\d+), (\d+), (\d+), (\d+)\}, &fa2::launch<fa2tune_configs::(\w+)>, "(\w+)", '
)


def entries(header: str, ident: str) -> list[tuple[Shape, str]]:
    """The (shape, config name) entries of one kTuned table, in the header's order."""
    body = header.split(f"static constexpr Choice {ident}[] = {{\n")[1].split("\n};")[0]
    out = []
    for *dims, alias, name in _ENTRY.findall(body):
        assert alias == name
        out.append((Shape(*map(int, dims)), name))
    return out


def test_table_has_one_entry_per_tuned_shape(header: str) -> None:
    table = entries(header, "kTuned_d64_fp16_full")
    assert table == sorted((sh, cfg.name) for sh, cfg, _ in PLAN)
    assert "{64, FA2TUNE_FP16, false, kTuned_d64_fp16_full, 6}," in header
    # The defaults carry no shape.
    defaults = header.split("kDefaultChoices[] = {")[1].split("};")[0]
    assert defaults.count("{{0, 0, 0, 0, 0}, &fa2::launch<") == 2
    # The provenance names every shape, in the table's order (an entry's index is its rank).
    top = header.split("#ifndef FA2TUNE_EXPORTED_HEADER_")[0]
    described = re.findall(r"//   D=64 fp16 full (B=.*?): (\w+) \(family", top)
    assert described == [(sh.describe(), name) for sh, name in table]
    assert "B=16 H=32/4kv Nq=1 Nk=8192" in top
    # The shape distance is inlined, and the lookup without launching is public.
    assert "namespace fa2tune_shape {" in header and "#pragma once" not in header
    assert "inline bool fa2tune_nearest_tuned(" in header
    assert "cudaDevAttrMultiProcessorCount" in header


def test_tuned_shape_results_keep_shapes_apart(store: Store) -> None:
    results = tuned_shape_results(store, "nvidia-h200")
    got = [(Shape(r.n, r.nk, r.batch, r.heads, r.kv_heads), r.config.name) for r in results]
    assert got == sorted((sh, cfg.name) for sh, cfg, _ in PLAN)
    assert tuned_shape_results(store, "H200", ds=[128]) == []
    assert tuned_shape_results(store, "H200", dtypes=["bf16"]) == []


def test_render_keeps_shapes_that_differ_only_in_batch_heads_kv_nk() -> None:
    base = dict(d=64, dtype="fp16", causal=False, n=2048, config=CFG_A)
    pts = [
        TunedPoint(**base),  # type: ignore[arg-type]
        TunedPoint(**base, batch=1),  # type: ignore[arg-type]
        TunedPoint(**base, heads=32),  # type: ignore[arg-type]
        TunedPoint(**base, kv_heads=4),  # type: ignore[arg-type]
        TunedPoint(**base, nk=512),  # type: ignore[arg-type]
        TunedPoint(**base),  # a duplicate of the first: dropped  # type: ignore[arg-type]
    ]
    text = render_header("NVIDIA H200", pts, ds=[64], dtypes=["fp16"], generated_at=WHEN)
    table = entries(text, "kTuned_d64_fp16_full")
    assert [sh for sh, _ in table] == sorted({p.shape for p in pts})
    assert len(table) == 5 and Shape(2048, 2048, 2, 16, 16) in {sh for sh, _ in table}


# ------------------------------------------------------------------------------ compile

SHAPE_PROBE = r"""
#include "fa_shape.cuh"
#include <cstdio>
// stdin: "T sms" then T tuned shapes, then asked shapes (5 integers each) until EOF.
// stdout per asked shape: the index of the nearest tuned one and its distance.
int main() {
  int count = 0, sms = 0;
  if (std::scanf("%d %d", &count, &sms) != 2) return 1;
  static fa2tune_shape::Shape tuned[4096];
  for (int i = 0; i < count; ++i) {
    fa2tune_shape::Shape& s = tuned[i];
    if (std::scanf("%lld %lld %lld %lld %lld", &s.nq, &s.nk, &s.batch, &s.heads,
                   &s.kv_heads) != 5) return 1;
  }
  fa2tune_shape::Shape a;
  while (std::scanf("%lld %lld %lld %lld %lld", &a.nq, &a.nk, &a.batch, &a.heads,
                    &a.kv_heads) == 5) {
    double d = -1.0;
    const int i = fa2tune_shape::nearest(a, tuned, count, sms, &d);
    std::printf("%d %.17g\n", i, d);
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def shape_probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fa_shape.cuh's nearest(), built on its own: with a plain C++ compiler when there is
    one (the header is host-only C++17), else with nvcc."""
    if CXX is None and NVCC is None:
        pytest.skip("no C++ compiler (g++, clang++ or nvcc) on PATH")
    tmp = tmp_path_factory.mktemp("shape_probe")
    (tmp / "probe.cpp").write_text(SHAPE_PROBE)
    cmd = [CXX] if CXX is not None else [NVCC, "-x", "c++"]
    proc = subprocess.run(
        [*cmd, "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-I", str(TEMPLATE_DIR),
         "probe.cpp", "-o", "probe"],
        cwd=tmp, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp / "probe"


def _line(s: Shape) -> str:
    return f"{s.nq} {s.nk} {s.batch} {s.heads} {s.kv_heads}"


def _run(probe: Path, tuned: list[Shape], sms: int, asked: list[Shape]) -> list[tuple[int, float]]:
    stdin = "\n".join([f"{len(tuned)} {sms}", *map(_line, tuned), *map(_line, asked)]) + "\n"
    out = subprocess.run([str(probe)], input=stdin, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [(int(i), float(d)) for i, d in (line.split() for line in out.stdout.splitlines())]


def _random_shape(rng: random.Random, decode: bool) -> Shape:
    kv = rng.choice([1, 2, 4, 8, 16])
    heads = kv * rng.choice([1, 1, 2, 4, 8])
    nq = 1 if decode else rng.choice([rng.randint(1, 40000), 2 ** rng.randint(0, 15)])
    nk = rng.choice([nq, rng.randint(1, 40000), 2 ** rng.randint(0, 16)])
    batch = rng.choice([1, 2, 4, 8, rng.randint(1, 300)])
    return Shape(nq, nk, batch, heads, kv)


def _tuned_set(rng: random.Random) -> list[Shape]:
    """A table's tuned shapes: a grid of square problems (ties at geometric midpoints), GQA
    and decode problems, and pairs tied on everything but how batch and heads split."""
    ns = sorted(rng.sample([128, 256, 512, 1024, 2048, 4096, 8192, 16384], 4))
    out = {Shape(n, n, 2, 16, 16) for n in ns}
    out |= {Shape(1024, 1024, 8, 4, 1), Shape(1024, 1024, 2, 16, 1)}  # groups 4 and 16
    out |= {Shape(n, n, 8, 32, 8) for n in ns[:2]}
    out |= {Shape(1, rng.choice([4096, 32768]), rng.choice([1, 16, 64]), 32, 4)}
    out |= {_random_shape(rng, decode=False) for _ in range(rng.randint(0, 6))}
    shapes = sorted(out)  # the header's order
    return shapes


def _ties(tuned: list[Shape]) -> list[Shape]:
    """Asked shapes at exactly equal distances from two tuned ones."""
    return [
        Shape(512, 512, 2, 16, 16),  # between 256 and 1024 when both are tuned, etc.
        Shape(1024, 1024, 8, 8, 1),  # group 8: equally far from groups 4 and 16
        Shape(1024, 1024, 64, 64, 8),  # fill clamped: only lengths and group count
        Shape(2048, 2048, 256, 16, 16),
        *tuned,  # each tuned shape: distance 0, itself
    ]


@pytest.mark.compile
def test_cpp_nearest_matches_python(shape_probe: Path) -> None:
    rng = random.Random(20261130)
    checked = ties = 0
    for sms in (132, 108, 78, 1):
        for _ in range(3):
            tuned = _tuned_set(rng)
            asked = [_random_shape(rng, decode=rng.random() < 0.25) for _ in range(30)]
            asked += _ties(tuned)
            got = _run(shape_probe, tuned, sms, asked)
            assert len(got) == len(asked)
            for a, (index, distance) in zip(asked, got, strict=True):
                want = nearest_shape(a, tuned, sms)
                assert want is not None
                assert tuned[index] == want, (a, sms, tuned[index], want)
                assert distance == shape_distance(a, want, sms), (a, sms)  # bit for bit
                dists = [shape_distance(a, t, sms) for t in tuned]
                ties += dists.count(min(dists)) > 1
                checked += 1
    assert checked >= 300 and ties >= 10, (checked, ties)


@pytest.mark.compile
def test_cpp_nearest_of_nothing(shape_probe: Path) -> None:
    assert _run(shape_probe, [], 132, [Shape(1, 1, 1, 1, 1)]) == [(-1, -1.0)]


HEADER_PROBE = r"""
#include "fa2_tuned.cuh"
#include <cstdio>
// Host-only: the tuned entry for each shape on stdin ("nq nk batch heads kv_heads sms");
// no GPU is touched.
int main() {
  int nq, nk, b, h, kv, sms;
  while (std::scanf("%d %d %d %d %d %d", &nq, &nk, &b, &h, &kv, &sms) == 6) {
    fa2tune_tuned_choice c{};
    if (!fa2tune_nearest_tuned(64, FA2TUNE_FP16, false, nq, nk, b, h, kv, sms, &c)) {
      std::printf("none\n");
      continue;
    }
    std::printf("%d %s %.17g %d %d %d %d %d\n", c.index, c.name, c.distance, c.nq, c.nk,
                c.batch, c.q_heads, c.kv_heads);
  }
  std::printf("untuned %d\n", fa2tune_nearest_tuned(64, FA2TUNE_BF16, false, 1, 1, 1, 1, 1,
                                                    132, nullptr));
  // A causal call with one query row is answered by the unmasked entries (nothing causal
  // is tuned here); with two rows the mask counts and nothing answers.
  fa2tune_tuned_choice one{};
  const bool one_row = fa2tune_nearest_tuned(64, FA2TUNE_FP16, true, 1, 8192, 16, 32, 4, 132,
                                             &one);
  std::printf("causal1 %d %s\n", one_row, one_row ? one.name : "-");
  std::printf("causal2 %d\n", fa2tune_nearest_tuned(64, FA2TUNE_FP16, true, 2, 8192, 16, 32,
                                                    4, 132, nullptr));
  return 0;
}
"""


@pytest.mark.slow
@pytest.mark.compile
@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
def test_header_picks_the_stores_winner_at_pythons_nearest(
    header: str, store: Store, tmp_path: Path
) -> None:
    (tmp_path / "fa2_tuned.cuh").write_text(header)
    (tmp_path / "probe.cu").write_text(HEADER_PROBE)
    assert NVCC is not None
    proc = subprocess.run(
        [NVCC, "-std=c++17", "-gencode=arch=compute_80,code=sm_80", "probe.cu", "-o", "probe"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rng = random.Random(13)
    asked = [_random_shape(rng, decode=rng.random() < 0.3) for _ in range(60)]
    asked += [sh for sh, _, _ in PLAN]
    cases = [(_line(a), a, rng.choice([132, 108, 16])) for a in asked]
    # No keys (nk == 0, which the ABI allows) counts as one key.
    cases.append(("1 0 1 8 1", Shape(1, 1, 1, 8, 1), 132))
    stdin = "".join(f"{line} {sms}\n" for line, _, sms in cases)
    out = subprocess.run(
        [str(tmp_path / "probe")], input=stdin, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-3] == "untuned 0" and len(lines) == len(cases) + 3
    decode = store.best_for_shape("H200", 64, "fp16", True, Shape(1, 8192, 16, 32, 4))
    assert decode is not None and lines[-2] == f"causal1 1 {decode.config.name}"
    assert lines[-1] == "causal2 0"
    lines = lines[:-2]
    tuned = sorted(sh for sh, _, _ in PLAN)
    for (_, a, sms), line in zip(cases, lines, strict=False):
        index, name, distance, *dims = line.split()
        want = nearest_shape(a, tuned, sms)
        assert want is not None and Shape(*map(int, dims)) == want == tuned[int(index)]
        assert float(distance) == shape_distance(a, want, sms)
        best = store.best(
            "H200", 64, want.nq, "fp16", False, nk=want.nk, batch=want.batch,
            heads=want.heads, kv_heads=want.kv_heads,
        )  # fmt: skip
        assert best is not None and name == best.config.name
