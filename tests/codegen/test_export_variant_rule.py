"""The exported header's variant rule (codegen/templates/fa_variant.cuh) is the store's.

``compile``: fa_variant.cuh, built on its own with the host compiler (it is host-only
C++17), normalises a few hundred seeded random calls exactly as core.variant.normalize does
(dense, with and without lengths) and as the torch op does for packed batches
(fa2tune.ops.choice.normalize_call, effective_varlen_causal), and picks, among seeded random
tables of tuned windows, chunks and shapes, the entry core.lookup.pick picks, at the same
shape distance to the bit: exact windows, the nearest window (ties included), exact shapes,
the nearest shape, ties between entries of one shape broken by rank, dense and packed.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

from codegen.export import TEMPLATE_DIR
from core.lookup import Candidate, Packed, pick, variant_distance
from core.shape import Shape, shape_distance, varlen_shape
from core.variant import Variant, normalize
from fa2tune.ops.choice import effective_varlen_causal, normalize_call

CXX = shutil.which("g++") or shutil.which("clang++")
NVCC = shutil.which("nvcc")
SMS = 132

RULE_PROBE = r"""
#include "fa_variant.cuh"
#include <cstdio>
#include <vector>
// stdin, one request a line:
//   N causal left right chunk nq nk      -> "causal left right chunk" (normalize; -1: unknown)
//   P causal left right chunk max_q max_k -> the same (normalize_packed)
//   T count packed                        then count lines "nq nk batch heads kv left right
//                                         chunk rank accepted": the table the next asks
//                                         pick from (accepted 0: an entry that cannot run)
//   A left right chunk nq nk batch heads kv -> "index distance same" (pick)
struct Entry {
  fa2tune_shape::Shape shape;
  int window_left, window_right, chunk, rank, accepted;
};
int main() {
  std::vector<Entry> table;
  bool packed = false;
  char op[2];
  while (std::scanf("%1s", op) == 1) {
    if (op[0] == 'N' || op[0] == 'P') {
      int causal, l, r, c;
      long long nq, nk;
      if (std::scanf("%d %d %d %d %lld %lld", &causal, &l, &r, &c, &nq, &nk) != 6) return 1;
      const fa2tune_variant::Normal n =
          op[0] == 'N' ? fa2tune_variant::normalize(causal != 0, l, r, c, false, false, nq, nk)
                       : fa2tune_variant::normalize_packed(causal != 0, l, r, c, false, false,
                                                           nq, nk);
      std::printf("%d %d %d %d\n", n.causal ? 1 : 0, n.window_left, n.window_right, n.chunk);
    } else if (op[0] == 'T') {
      int count, p;
      if (std::scanf("%d %d", &count, &p) != 2) return 1;
      packed = p != 0;
      table.assign(count, Entry{});
      for (Entry& e : table)
        if (std::scanf("%lld %lld %lld %lld %lld %d %d %d %d %d", &e.shape.nq, &e.shape.nk,
                       &e.shape.batch, &e.shape.heads, &e.shape.kv_heads, &e.window_left,
                       &e.window_right, &e.chunk, &e.rank, &e.accepted) != 10)
          return 1;
    } else if (op[0] == 'A') {
      fa2tune_variant::Normal v{false, 0, 0, 0, false, false};
      fa2tune_shape::Shape s;
      if (std::scanf("%d %d %d %lld %lld %lld %lld %lld", &v.window_left, &v.window_right,
                     &v.chunk, &s.nq, &s.nk, &s.batch, &s.heads, &s.kv_heads) != 8)
        return 1;
      const fa2tune_variant::Found f = fa2tune_variant::pick(
          table.data(), static_cast<int>(table.size()), s, v, 132, packed,
          [&table](int i) { return table[i].accepted != 0; });
      std::printf("%d %.17g %d\n", f.index, f.distance, f.same_variant ? 1 : 0);
    } else {
      return 1;
    }
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def rule_probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fa_variant.cuh built on its own: with a plain C++ compiler when there is one, else
    with nvcc."""
    if CXX is None and NVCC is None:
        pytest.skip("no C++ compiler (g++, clang++ or nvcc) on PATH")
    tmp = tmp_path_factory.mktemp("variant_rule")
    (tmp / "probe.cpp").write_text(RULE_PROBE)
    cmd = [CXX] if CXX is not None else [NVCC, "-x", "c++"]
    proc = subprocess.run(
        [*cmd, "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-I", str(TEMPLATE_DIR),
         "probe.cpp", "-o", "probe"],
        cwd=tmp, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp / "probe"


def _run(probe: Path, lines: list[str]) -> list[str]:
    out = subprocess.run(
        [str(probe)], input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


BOUNDS = [-1, -1, 0, 1, 2, 3, 7, 15, 63, 64, 127, 128, 4095, 4096, 8191, 8192]
LENGTHS = [1, 1, 2, 3, 64, 100, 127, 128, 129, 4096, 4097, 8192, 16384]


def _normal_text(causal: bool, v: Variant) -> str:
    return f"{int(causal)} {v.window_left} {v.window_right} {v.chunk}"


@pytest.mark.compile
def test_cpp_normalize_is_core_variants(rule_probe: Path) -> None:
    rng = random.Random(20261203)
    asks: list[str] = []
    want: list[str] = []
    for _ in range(600):
        causal = rng.random() < 0.5
        left, right = rng.choice(BOUNDS), rng.choice(BOUNDS)
        chunk = rng.choice([0, 0, 0, 1, 2, 64, 100, 128, 4096, 8192, 16384])
        nq, nk = rng.choice(LENGTHS), rng.choice([0, *LENGTHS])
        if rng.random() < 0.15:  # dense, lengths unknown
            asks.append(f"N {int(causal)} {left} {right} {chunk} -1 -1")
            want.append(_normal_text(*normalize(causal, left, right, chunk)))
        elif rng.random() < 0.3:  # a packed batch's longest lengths, as the torch op
            asks.append(f"P {int(causal)} {left} {right} {chunk} {nq} {nk}")
            c, v = normalize_call(causal, left, right, chunk, 0.0, False, nq, nk, True)
            want.append(_normal_text(effective_varlen_causal(c, nq), v))
        else:
            asks.append(f"N {int(causal)} {left} {right} {chunk} {nq} {nk}")
            want.append(_normal_text(*normalize(causal, left, right, chunk, nq=nq, nk=nk)))
    # The cases the brief names: decode spelled as a causal sliding window, and the plain forms.
    cases = [
        ((True, 4096, 0, 0, 1, 8192), (False, 4096, -1, 0)),  # decode: unmasked, left only
        ((True, 4096, 0, 0, 8192, 8192), (True, 4096, 0, 0)),
        ((False, -1, 0, 0, 512, 512), (True, -1, -1, 0)),  # (-1, 0) is plain causal
        ((True, 8192, 0, 0, 4096, 4096), (True, -1, -1, 0)),  # past every key: plain
        ((False, -1, -1, 8192, 4096, 4096), (False, -1, -1, 0)),  # a chunk holding them all
    ]
    for (causal, left, right, chunk, nq, nk), (c, wl, wr, ch) in cases:
        asks.append(f"N {int(causal)} {left} {right} {chunk} {nq} {nk}")
        want.append(f"{int(c)} {wl} {wr} {ch}")
    assert _run(rule_probe, asks) == want


def _window(rng: random.Random) -> Variant:
    """A local variant (some bound or chunk), from few values so that windows repeat."""
    while True:
        v = Variant(rng.choice([-1, 0, 3, 7, 15, 128, 4096]), rng.choice([-1, -1, 0, 3, 5]),
                    rng.choice([0, 0, 0, 7, 100, 8192]))  # fmt: skip
        if v.local:
            return v


def _shape(rng: random.Random) -> Shape:
    kv = rng.choice([1, 8])
    heads = kv * rng.choice([1, 4])
    nq = rng.choice([1, 1024, 4096])
    return Shape(nq, rng.choice([nq, 8192]), rng.choice([1, 8]), heads, kv)


#: Windows equally far (log2 ratio 1) from a left bound 7 or a chunk 100: with these at one
#: shape, the rank decides.
TIED = [Variant(3, -1), Variant(15, -1), Variant(7, -1, 50), Variant(7, -1, 200)]
TIED_ASKS = [Variant(7, -1), Variant(7, -1, 100)]


def _table(
    rng: random.Random, packed: bool, tied: bool = False, runs: float = 0.8
) -> tuple[list[Candidate], list[bool], list[str]]:
    """Random candidates of one key (dense or packed), few shapes and windows so that exact
    hits, ties and same-shape entries occur (``tied``: the TIED windows at one shape first),
    whether each can run (with probability ``runs``: the dispatch passes the others over);
    the probe's table lines in the same order."""
    count = rng.randint(1, 12) + (len(TIED) if tied else 0)
    ranks = rng.sample(range(count), count)
    cands: list[Candidate] = []
    can_run = [rng.random() < runs for _ in range(count)]
    lines = [f"T {count} {int(packed)}"]
    common = _shape(rng)
    for i in range(count):
        v = TIED[i] if tied and i < len(TIED) else _window(rng)
        if packed:
            sh = common if tied and i < len(TIED) else _shape(rng)
            lens = tuple(sh.nq + (d if j % 2 else -d) for j, d in enumerate([0, 3, 3, 1]))
            lens = tuple(max(1, n) for n in lens[: rng.randint(1, 4)])
            sh = varlen_shape(lens, sh.heads, sh.kv_heads)
            seqlens = ",".join(map(str, lens))
        else:
            sh, seqlens = common if tied and i < len(TIED) else _shape(rng), ""
        # Packed ties go to the first tuned problem: the problem id is the entry's rank.
        pid = ranks[i] if packed else i
        cands.append(Candidate(pid, "h200", False, sh.nq, sh.nk, sh.batch, sh.heads, sh.kv_heads,
                               seqlens, (float(ranks[i]), 0.0, i), v))  # fmt: skip
        lines.append(
            f"{sh.nq} {sh.nk} {sh.batch} {sh.heads} {sh.kv_heads} "
            f"{v.window_left} {v.window_right} {v.chunk} {ranks[i]} {int(can_run[i])}"
        )
    return cands, can_run, lines


@pytest.mark.compile
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_cpp_pick_is_core_lookups(rule_probe: Path, packed: bool) -> None:
    rng = random.Random(23 + packed)
    lines: list[str] = []
    want: list[tuple[int, float, bool]] = []
    inexact = ranked = hits = none = moved = 0
    for t in range(60):
        tied = t % 3 == 0  # these run everywhere, so that the rank decides often
        every, runs, table = _table(rng, packed, tied, 1.0 if tied else 0.0 if t % 10 == 1 else 0.8)
        lines += table
        # pick over the entries that can run; the probe answers with indices of the table.
        index = [i for i, ok in enumerate(runs) if ok]
        cands = [every[i] for i in index]
        asks = [(_window(rng), _shape(rng)) for _ in range(8)]
        asks += [(c.variant, _shape_of(c)) for c in every[:3]]
        if tied:
            asks += [(v, _shape_of(every[0])) for v in TIED_ASKS]
            asks += [(v, _shape(rng)) for v in TIED_ASKS]
        for v, sh in asks:
            ask = Packed(sh.batch, sh.nq) if packed else None
            if ask is not None:
                sh = ask.shape(sh.heads, sh.kv_heads)
            got = pick(cands, "H200", False, sh, {"h200": SMS}, packed=ask, variant=v)
            anyway = pick(every, "H200", False, sh, {"h200": SMS}, packed=ask, variant=v)
            moved += anyway is not None and (got is None or index[got.index] != anyway.index)
            lines.append(
                f"A {v.window_left} {v.window_right} {v.chunk} "
                f"{sh.nq} {sh.nk} {sh.batch} {sh.heads} {sh.kv_heads}"
            )
            if got is None:  # nothing of the table can run
                want.append((-1, 0.0, False))
                none += 1
                continue
            distance = shape_distance(sh, got.measured, SMS)
            w = cands[got.index].variant
            same = (v.window_left, v.window_right, v.chunk) == (w.window_left, w.window_right,
                                                                 w.chunk)  # fmt: skip
            # How often the rank decides: several of the nearest windows at the chosen shape.
            closest = min(variant_distance(v, c.variant) for c in cands)
            rivals = [
                c for c in cands
                if variant_distance(v, c.variant) == closest and _shape_of(c) == got.measured
            ]  # fmt: skip
            ranked += len(rivals) > 1
            inexact += not same
            hits += got.measured == sh
            want.append((index[got.index], distance, same))
    out = _run(rule_probe, lines)
    assert len(out) == len(want)
    for line, (index, distance, same) in zip(out, want, strict=True):
        i, d, s = line.split()
        assert (int(i), float(d), s == "1") == (index, distance, same), line
    assert inexact >= 50 and ranked >= 10 and hits >= 100, (inexact, ranked, hits)
    assert moved >= 20 and none >= 1, (moved, none)


def _shape_of(c: Candidate) -> Shape:
    """A candidate's shape as pick compares it (a packed one's varlen shape)."""
    if c.seqlens:
        return varlen_shape([int(n) for n in c.seqlens.split(",")], c.heads, c.kv_heads)
    return Shape(c.n, c.nk, c.batch, c.heads, c.kv_heads)
