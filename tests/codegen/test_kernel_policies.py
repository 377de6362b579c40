"""The kernels' mask policies (codegen/templates/fa_mask.cuh) against the bottom-right causal rule.

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

Marked ``compile``; skipped when nvcc is not on PATH. One nvcc call of a few seconds.
"""

from __future__ import annotations

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

PROGRAM = r"""
#include <cstdio>
#include "fa_mask.cuh"

template <class Mask>
void dump(const char* tag, int nq, int nk) {
  const Mask mask(nq, nk);
  for (int row = 0; row < nq + 128; ++row)  // rows past nq: the kernels' tile bound
    std::printf("E %s %d %d %d %d %d\n", tag, nq, nk, row, mask.key_begin(row),
                mask.key_limit(row));
  const int bms[] = {BMS}, bns[] = {BNS};
  for (int bm : bms)
    for (int bn : bns)
      for (int m0 = 0; m0 < nq; m0 += bm)
        std::printf("T %s %d %d %d %d %d %d %d %d\n", tag, nq, nk, bm, bn, m0,
                    mask.n_block_min(m0, bn), mask.n_block_max(m0 + bm, bn), mask.edge_key(m0));
  // The same policy rebuilt from (nk, diag), as a kernel re-reading nk does.
  const Mask again = Mask::of_diag(nk, mask.diag);
  if (again.nk != mask.nk || again.diag != mask.diag) std::printf("X %s %d %d\n", tag, nq, nk);
}

int main() {
  const int nqs[] = {NQS}, nks[] = {NKS};
  for (int nq : nqs)
    for (int nk : nks) {
      dump<fa::NoMask>("none", nq, nk);
      dump<fa::CausalMask>("causal", nq, nk);
    }
  return 0;
}
"""


def _visible(causal: bool, nq: int, nk: int, row: int, key: int) -> bool:
    """The rule, written from its definition (no shortcut shared with the header)."""
    if not 0 <= key < nk:
        return False
    return not causal or key <= row + nk - nq


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> list[list[str]]:
    work: Path = tmp_path_factory.mktemp("policies")
    source = PROGRAM
    for key, values in (("BMS", BM), ("BNS", BN), ("NQS", NQ), ("NKS", NK)):
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
    assert shapes == {(tag, nq, nk) for tag in ("none", "causal") for nq, nk in product(NQ, NK)}


def test_element_mask_is_the_rule(answers: list[list[str]]) -> None:
    wrong = []
    for a in (a for a in answers if a[0] == "E"):
        causal = a[1] == "causal"
        nq, nk, row, begin, limit = map(int, a[2:])
        for key in range(-1, nk + 2):
            if (begin <= key < limit) != _visible(causal, nq, nk, row, key):
                wrong.append((a[1], nq, nk, row, key))
                break
    assert not wrong, f"{len(wrong)} rows disagree with the rule, e.g. {wrong[:5]}"


def test_tile_range_and_edge_are_the_rule(answers: list[list[str]]) -> None:
    wrong = []
    for a in (a for a in answers if a[0] == "T"):
        causal = a[1] == "causal"
        nq, nk, bm, bn, m0, lo, hi, edge = map(int, a[2:])
        rows = range(m0, m0 + bm)
        tiles = -(-nk // bn)
        wanted = [
            t
            for t in range(tiles)
            if any(_visible(causal, nq, nk, r, k) for r in rows for k in range(t * bn, t * bn + bn))
        ]
        expected = (wanted[0], wanted[-1] + 1) if wanted else None
        got = (lo, hi) if hi > lo else None
        if wanted and wanted != list(range(wanted[0], wanted[-1] + 1)):
            wrong.append(("holes in the rule's tiles", *a))
        if got != expected and not (expected is None and hi <= 0):
            wrong.append(("range", *a, expected))
        for t in range(lo, hi):
            n0 = t * bn
            needs = n0 + bn > nk or n0 + bn - 1 > edge
            misses = any(
                not _visible(causal, nq, nk, r, k) for r in rows for k in range(n0, n0 + bn)
            )
            if needs != misses:
                wrong.append(("edge", *a, t, needs, misses))
    assert not wrong, f"{len(wrong)} tiles disagree with the rule, e.g. {wrong[:5]}"
