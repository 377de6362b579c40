"""The kernels' mask and score policies (codegen/templates/fa_mask.cuh) against their rules.

A host program, built with nvcc from the template header itself, calls every question a
kernel asks a policy (``n_block_min``, ``n_block_max``, ``edge_key``, ``key_begin``,
``key_limit``; they are ``__host__ __device__``) over many (nq, nk, query tile, key tile)
shapes and prints the answers; they are checked here against a brute-force reference of the
rule: query ``i`` sees key ``j`` iff ``0 <= j < nk`` and, when causal, ``j <= i + nk - nq``.

* the element mask of every (row, key) is the rule's;
* the key-tile range of every query tile covers exactly the tiles holding a key some row of
  the tile sees (rows below ``m0 + bm``, as the kernels size it: rows past nq see as the rule
  extends to them), and is empty when none does;
* the kernels' "needs the element mask" test of a tile (``n0 + bn > nk`` or
  ``n0 + bn - 1 > edge_key(m0)``) is true exactly when some row of the query tile misses some
  key of the key tile, so no visible key is masked and no masked key is skipped.

The local policy (windows and chunks, FlashAttention's rule: with ``pos = i + nk - nq``,
query ``i`` sees key ``j`` iff ``pos - left <= j <= pos + right``, a bound of -1 being none,
and ``j`` in ``pos``'s chunk) is checked the same way over many windows, with the left edge
test ``n0 < begin_edge(q_last)`` added to the tile's "needs the mask"; the softcap policy and
the sink's starting max against their formulas.

Marked ``compile``; skipped when nvcc is not on PATH. One nvcc call of a few seconds.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from itertools import product
from pathlib import Path

import pytest

from codegen.render import template_dir
from core.settings import get_settings

NVCC = get_settings().nvcc
pytestmark = [
    pytest.mark.compile,
    pytest.mark.skipif(shutil.which(NVCC) is None, reason=f"nvcc ({NVCC!r}) is not on PATH"),
]

NQ = (1, 2, 3, 7, 16, 63, 64, 65, 128, 130, 200)
NK = (1, 2, 5, 64, 100, 128, 129, 257)
BM = (16, 64, 128)
BN = (16, 64, 80, 128)
# (left, right, chunk): causal as a window, sliding windows, two-sided, chunks alone and with
# windows, windows wider than the keys.
WINDOWS = (
    (-1, 0, 0), (0, 0, 0), (3, 0, 0), (16, 0, 0), (5, 7, 0), (-1, 3, 0), (3, -1, 0),
    (-1, -1, 4), (-1, -1, 64), (-1, 0, 16), (10, 0, 32), (2, 2, 5), (100, 100, 0),
    (0, -1, 0), (-1, 0, 1),
)  # fmt: skip
NQ_LOCAL = (1, 7, 64, 65, 130)
NK_LOCAL = (1, 5, 100, 129, 257)

PROGRAM = r"""
#include <cstdio>
#include "fa_mask.cuh"

// Lines: E tag nq nk row key_begin key_limit; T tag nq nk bm bn m0 n_min n_max edge
// begin_edge(m0 + bm - 1). A tag is none, causal or local:left:right:chunk.
template <class Mask>
void dump(const char* tag, const Mask& mask, int nq, int nk) {
  for (int row = 0; row < nq + 128; ++row)  // rows past nq: the kernels' tile bound
    std::printf("E %s %d %d %d %d %d\n", tag, nq, nk, row, mask.key_begin(row),
                mask.key_limit(row));
  const int bms[] = {BMS}, bns[] = {BNS};
  for (int bm : bms)
    for (int bn : bns)
      for (int m0 = 0; m0 < nq; m0 += bm)
        std::printf("T %s %d %d %d %d %d %d %d %d %d\n", tag, nq, nk, bm, bn, m0,
                    mask.n_block_min(m0, bn), mask.n_block_max(m0 + bm, bn), mask.edge_key(m0),
                    mask.begin_edge(m0 + bm - 1));
  // The same policy rebuilt from (nk, diag), as a kernel re-reading nk does.
  const Mask again = mask.again(nk, mask.diag);
  if (again.nk != mask.nk || again.diag != mask.diag) std::printf("X %s %d %d\n", tag, nq, nk);
}

int main() {
  const int nqs[] = {NQS}, nks[] = {NKS};
  for (int nq : nqs)
    for (int nk : nks) {
      dump("none", fa::NoMask(nq, nk), nq, nk);
      dump("causal", fa::CausalMask(nq, nk, 7, 7, 7), nq, nk);  // plain: the window is ignored
    }
  const int windows[][3] = {WINDOWS};
  const int nqls[] = {NQLS}, nkls[] = {NKLS};
  for (const auto& w : windows)
    for (int nq : nqls)
      for (int nk : nkls) {
        char tag[64];
        std::snprintf(tag, sizeof tag, "local:%d:%d:%d", w[0], w[1], w[2]);
        dump(tag, fa::LocalMask(nq, nk, w[0], w[1], w[2]), nq, nk);
      }
  // Softcap: tanh(s * scale / cap), softmax scale cap; identity: s, scale. Sink's max.
  const float ss[] = {-300.f, -20.f, -1.f, 0.f, 0.5f, 3.f, 40.f, 1000.f};
  for (float s : ss) {
    float frag[2][2] = {{s, s}, {s, s}};
    const fa::SoftcapScore cap(0.125f, 15.f);
    cap.apply(frag);
    fa::ScoreIdentity::apply(frag);
    std::printf("S %.9g %.9g %.9g %.9g\n", s, frag[1][1], cap.softmax_scale(0.125f),
                fa::ScoreIdentity::softmax_scale(0.125f));
  }
  std::printf("K %.9g\n", fa::sink_row_max(2.5f, 0.125f));
  return 0;
}
"""


def _visible(tag: str, nq: int, nk: int, row: int, key: int) -> bool:
    """The rule, written from its definition (no shortcut shared with the header)."""
    if not 0 <= key < nk:
        return False
    pos = row + nk - nq
    if tag == "causal":
        return key <= pos
    if tag.startswith("local:"):
        left, right, chunk = (int(x) for x in tag.split(":")[1:])
        if left >= 0 and key < pos - left:
            return False
        if right >= 0 and key > pos + right:
            return False
        return chunk <= 0 or key // chunk == pos // chunk  # Python's // rounds down
    return True


def _local_tag(window: tuple[int, int, int]) -> str:
    return "local:" + ":".join(map(str, window))


def _sees(rows: list[range], n0: int, n1: int) -> bool:
    """Whether some row's keys meet the key tile ``[n0, n1)``."""
    return any(r and r.start < n1 and n0 < r.stop for r in rows)


def _span(tag: str, nq: int, nk: int, row: int) -> range:
    """The keys ``row`` sees: one interval under every rule here (found by brute force)."""
    seen = [k for k in range(nk) if _visible(tag, nq, nk, row, k)]
    assert seen == list(range(seen[0], seen[-1] + 1)) if seen else True
    return range(seen[0], seen[-1] + 1) if seen else range(0)


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> list[list[str]]:
    work: Path = tmp_path_factory.mktemp("policies")
    source = PROGRAM
    windows = ", ".join("{" + ", ".join(map(str, w)) + "}" for w in WINDOWS)
    source = source.replace("{WINDOWS}", "{" + windows + "}")
    for key, values in (
        ("BMS", BM), ("BNS", BN), ("NQLS", NQ_LOCAL), ("NKLS", NK_LOCAL), ("NQS", NQ), ("NKS", NK),
    ):  # fmt: skip
        source = source.replace(key, ", ".join(map(str, values)))
    (work / "policies.cu").write_text(source, encoding="utf-8")
    exe = work / "policies"
    subprocess.run(
        [NVCC, "-std=c++17", "-O1", "-I", str(template_dir()), "-o", str(exe), "policies.cu"],
        cwd=work,
        check=True,
        capture_output=True,
    )
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return [line.split() for line in out.splitlines()]


def test_the_program_covers_every_shape(answers: list[list[str]]) -> None:
    assert not [a for a in answers if a[0] == "X"], "of_diag rebuilt another policy"
    shapes = {(a[1], int(a[2]), int(a[3])) for a in answers if a[0] == "T"}
    plain = {(tag, nq, nk) for tag in ("none", "causal") for nq, nk in product(NQ, NK)}
    local = {(_local_tag(w), nq, nk) for w in WINDOWS for nq, nk in product(NQ_LOCAL, NK_LOCAL)}
    assert shapes == plain | local


@pytest.fixture(scope="module")
def spans(answers: list[list[str]]) -> dict[tuple[str, int, int], list[range]]:
    """The rule's visible keys of every row (up to the kernels' tile bound) of every policy
    and shape the program answered for, computed once for both tests below."""
    shapes = {(a[1], int(a[2]), int(a[3])) for a in answers if a[0] in ("E", "T")}
    return {
        (tag, nq, nk): [_span(tag, nq, nk, r) for r in range(nq + 128)] for tag, nq, nk in shapes
    }


def test_element_mask_is_the_rule(
    answers: list[list[str]], spans: dict[tuple[str, int, int], list[range]]
) -> None:
    wrong = []
    for a in (a for a in answers if a[0] == "E"):
        tag = a[1]
        nq, nk, row, begin, limit = map(int, a[2:])
        # The element mask shows keys [begin, limit): exactly the row's visible keys.
        if range(begin, limit) != spans[tag, nq, nk][row]:
            wrong.append((a[1], nq, nk, row, begin, limit))
    assert not wrong, f"{len(wrong)} rows disagree with the rule, e.g. {wrong[:5]}"


def test_tile_range_and_edge_are_the_rule(
    answers: list[list[str]], spans: dict[tuple[str, int, int], list[range]]
) -> None:
    wrong = []
    for a in (a for a in answers if a[0] == "T"):
        tag = a[1]
        nq, nk, bm, bn, m0, lo, hi, edge, begin_edge = map(int, a[2:])
        rows = spans[tag, nq, nk][m0 : m0 + bm]
        tiles = -(-nk // bn)

        wanted = [t for t in range(tiles) if _sees(rows, t * bn, t * bn + bn)]
        expected = (wanted[0], wanted[-1] + 1) if wanted else None
        got = (lo, hi) if hi > lo else None
        if wanted and wanted != list(range(wanted[0], wanted[-1] + 1)):
            wrong.append(("holes in the rule's tiles", *a))
        if got != expected and not (expected is None and hi <= 0):
            wrong.append(("range", *a, expected))
        for t in range(lo, hi):
            n0 = t * bn
            needs = n0 + bn > nk or n0 + bn - 1 > edge or n0 < begin_edge
            misses = any(not (r.start <= n0 and n0 + bn <= r.stop) for r in rows)
            if needs != misses:
                wrong.append(("edge", *a, t, needs, misses))
    assert not wrong, f"{len(wrong)} tiles disagree with the rule, e.g. {wrong[:5]}"


def test_plain_policies_have_no_left_edge(answers: list[list[str]]) -> None:
    """The plain policies' begin_edge is 0 (kernels never ask it: kLeftBound is false)."""
    plain = [a for a in answers if a[0] == "T" and not a[1].startswith("local")]
    assert plain and {a[-1] for a in plain} == {"0"}


def test_softcap_and_sink_start(answers: list[list[str]]) -> None:
    rows = [list(map(float, a[1:])) for a in answers if a[0] == "S"]
    assert len(rows) == 8
    for s, capped, cap_scale, plain_scale in rows:
        # What the softmax sees is softmax_scale(.) * stored: cap * tanh(0.125 s / cap).
        assert cap_scale * capped == pytest.approx(15.0 * math.tanh(0.125 * s / 15.0), abs=1e-5)
        assert plain_scale == 0.125
        assert abs(cap_scale * capped) <= 15.0
    (sink,) = [float(a[1]) for a in answers if a[0] == "K"]
    assert sink * 0.125 == pytest.approx(2.5)
