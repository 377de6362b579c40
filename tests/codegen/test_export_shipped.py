"""The header exported from the shipped H200 results dispatches to the store's best configs.

The header's dispatch table is parsed back from the text and compared, entry by entry, with
:meth:`db.store.Store.best` for every shipped problem; square B=2 H=16 calls get the configs
the per-N rule of earlier headers gave them (but in narrow bands just below the geometric
midpoints of the tuned Ns); and the template hash the header names is the build-cache digest
the shipped builds' source hashes were computed from.
"""

from __future__ import annotations

import importlib.util
import io
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from codegen.build import source_hash
from codegen.families import family, family_of
from codegen.render import template_hash
from core.shape import DECODE_MAX_NQ, Shape, nearest_shape
from db.dump_format import ConfigRecord
from db.shipped import load_shipped_results
from db.store import Store
from service.header import export_header

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "db" / "data" / "h200_results.json"
#: Template digests whose kernels are proven identical to a later one (bench/ptx/README.md).
LINEAGE = ROOT / "bench" / "ptx" / "lineage.json"
ENUM = {"FA2TUNE_FP16": "fp16", "FA2TUNE_BF16": "bf16"}


def fill_store(store: Store) -> None:
    """The shared module store: the shipped H200 results."""
    load_shipped_results(store, [SHIPPED])


def dispatch_table(header: str) -> dict[tuple[int, str, bool, int], str]:
    """(D, dtype, causal, N) -> config name, read from the header's kTuned tables."""
    arrays = dict(
        re.findall(r"static constexpr Choice (kTuned_\w+)\[\] = \{\n(.*?)\n\};", header, re.S)
    )
    rows = re.findall(r"\{(\d+), (FA2TUNE_\w+), (true|false), (kTuned_\w+), (\d+)\},", header)
    table: dict[tuple[int, str, bool, int], str] = {}
    for d, enum, causal, ident, count in rows:
        # Every shipped problem is square at B=2 H=16: the entry's shape is {N, N, 2, 16, 16}.
        choices = re.findall(
            r"\{\{(\d+), \1, 2, 16, 16\}, "
            r'&fa2::launch<fa2tune_configs::(\w+)>, "(\w+)", nullptr, '
            r"Workspace<fa2tune_configs::\2>::size, Workspace<fa2tune_configs::\2>::launch\}",
            arrays[ident],
        )
        assert len(choices) == int(count)
        assert [int(n) for n, *_ in choices] == sorted(int(n) for n, *_ in choices)
        for n, alias, name in choices:
            assert alias == name
            table[(int(d), ENUM[enum], causal == "true", int(n))] = name
    return table


def test_dispatch_table_is_the_stores_best(store: Store) -> None:
    header = export_header(store, "H200")
    table = dispatch_table(header)
    problems = json.loads(SHIPPED.read_text())["problems"]
    shipped = {(p["d"], p["dtype"], p["causal"], p["n"]) for p in problems if p["n"] == p["nk"]}
    assert set(table) == shipped and len(table) == 48
    for (d, dtype, causal, n), name in table.items():
        best = store.best("NVIDIA H200", d, n, dtype, causal)
        assert best is not None and best.exact
        assert name == best.config.name, (d, dtype, causal, n)
    # Every name the GPU goes by selects the same table.
    for gpu in ("NVIDIA H200", "nvidia-h200", "h200"):
        assert dispatch_table(export_header(store, gpu)) == table


def old_bucket(ns: list[int], n: int) -> int:
    """The tuned N earlier headers dispatched N x N calls to: nearest on a log scale, the
    boundaries at the geometric midpoints (ties to the larger)."""
    i = 0
    while i + 1 < len(ns) and n * n >= ns[i] * ns[i + 1]:
        i += 1
    return ns[i]


def test_square_calls_keep_their_configs(store: Store) -> None:
    """The shape dispatch (core.shape's rule; tests/codegen/test_export_shapes.py holds the header's
    C++ to it) against the old per-N buckets, for every square B=2 H=16 call up to 64K on
    the H200's 132 SMs. The grid-fill term only moves each boundary a little below the
    geometric midpoint (its block count rounds up and saturates at 8 waves): the calls in
    between now take the larger tuned N, and every other call keeps its config, but for the
    calls of at most 16 rows, decode steps, which no prefill shape answers."""
    table = dispatch_table(export_header(store, "H200"))
    keys = sorted({k[:3] for k in table})
    ns = sorted(k[3] for k in table if k[:3] == keys[0])
    assert all(sorted(k[3] for k in table if k[:3] == key) == ns for key in keys)
    tuned = [Shape(n, n, 2, 16, 16) for n in ns]
    (gpu,) = json.loads(SHIPPED.read_text())["gpus"]
    sms = gpu["sm_count"]  # the H200's 132; the header reads it from the device
    moved = 0
    for n in range(1, 2**16 + 1):
        new = nearest_shape(Shape(n, n, 2, 16, 16), tuned, sms)
        if n <= DECODE_MAX_NQ:  # a decode step's rows: no prefill shape answers, the default runs
            assert new is None, n
            continue
        assert new is not None
        old = old_bucket(ns, n)
        if new.nq != old:
            below, above = old, new.nq
            assert above == ns[ns.index(below) + 1], n
            assert 0.97 * math.sqrt(below * above) <= n < math.sqrt(below * above), n
            moved += 1
        if n in ns:
            assert new.nq == n  # a tuned N: its own entry, the store's best (test above)
    assert moved < 0.002 * 2**16, moved


def test_header_names_the_build_cache_template_hash(store: Store) -> None:
    digest = template_hash()
    assert f"(template hash {digest})" in export_header(store, "H200", [64], dtypes=["fp16"])


def _lineage_steps() -> list[dict[str, Any]]:
    return list(json.loads(LINEAGE.read_text(encoding="utf-8"))["steps"])


def _equivalent_digests(name: str) -> set[str]:
    """The family's current template digest and every earlier one that the lineage file
    shows compiling to the same kernels (each step's manifests compare equal)."""
    known = {template_hash(main=family(name).templates[0])}
    steps = [s for s in _lineage_steps() if s["family"] == name]
    grew = True
    while grew:
        grew = False
        for step in steps:
            if step["to"] in known and step["from"] not in known:
                known.add(step["from"])
                grew = True
    return known


@pytest.mark.parametrize(
    ("results", "family_name"),
    [("h200_results.json", "fa2"), ("h200_results_decode.json", "splitkv")],
)
def test_shipped_builds_were_made_from_the_current_kernels(results: str, family_name: str) -> None:
    """A shipped result was built from the current template, or from one whose kernels the
    lineage proves identical (PTX per shipped winner, bench/ptx/): its source hash recomputes
    with one of those digests. Edit a template without a new lineage step and this fails."""
    digests = _equivalent_digests(family_name)
    builds = [
        b
        for b in json.loads((ROOT / "db" / "data" / results).read_text())["builds"]
        if b["config"]["family"] == family_name
    ]
    assert builds
    for b in builds[:: max(1, len(builds) // 50)]:
        cfg = ConfigRecord.model_validate(b["config"]).to_config()
        text = family_of(cfg).render(cfg)
        recomputed = {
            source_hash(d, text, b["flags"], b["nvcc_version"], b["arch"]) for d in digests
        }
        assert b["source_hash"] in recomputed, cfg.name


def test_lineage_steps_are_backed_by_identical_manifests() -> None:
    """Each lineage step names two manifests of bench/ptx_identity.py that compare equal at
    the step's level: the evidence is in the repository, not only in a note."""
    spec = importlib.util.spec_from_file_location(
        "ptx_identity", ROOT / "bench" / "ptx_identity.py"
    )
    assert spec is not None and spec.loader is not None
    ptx_identity = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("ptx_identity", ptx_identity)  # its dataclasses look it up there
    spec.loader.exec_module(ptx_identity)
    for step in _lineage_steps():
        before, after = (ROOT / step["before"]), (ROOT / step["after"])
        out = io.StringIO()
        assert ptx_identity.compare(before, after, level=step["level"], out=out) == 0, (
            step,
            out.getvalue(),
        )
        names = json.loads(before.read_text(encoding="utf-8"))["configs"]
        assert any(n.startswith(f"{step['family']}_") for n in names), step
