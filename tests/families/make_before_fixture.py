"""Writes tests/families/data/families_before.json: what the per-family code gave before the
parameter declarations (issue 22), for every config of the shipped results and for a sample
of every family's space. Run once against the tree before the change (commit 1e7373b):

    PYTHONPATH=. python tests/families/make_before_fixture.py

The test test_declarations.py compares today's code against the file; it is not re-run.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from codegen.families import FAMILIES, family_of
from core.family import config_from_name
from core.shape import Shape
from db.dump_format import load_dump
from tuner import search

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "data" / "families_before.json"
SHAPES = (Shape(4096, 4096, 4, 32, 8), Shape(16, 65536, 1, 32, 8))
GROUPS = ((64, "fp16", False), (128, "bf16", True), (40, "fp16", True), (256, "fp16", False))


def describe(name: str) -> dict[str, object]:
    c = config_from_name(name)
    fam = family_of(c)
    return {
        "name": c.name,
        "key": c.key,
        "params": c.params(),
        "dict": c.to_dict(),
        "search": search.params_of(c),
        "render": fam.render(c),
        "traits": fam.header.traits(c),
        "grids": [list(fam.grid(c, s)) for s in SHAPES],
        "smem": c.smem_bytes,
        "threads": c.threads,
        "describe": c.describe(),
    }


def digest(entries: list[dict[str, object]]) -> str:
    """SHA-256 of the entries' canonical JSON (what the test recomputes)."""
    return hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()


def main() -> None:
    names: set[str] = set()
    for path in sorted((ROOT / "db" / "data").glob("*.json")):
        names |= {b.config_name for b in load_dump(path).builds}
    by_family: dict[str, list[dict[str, object]]] = {}
    for n in sorted(names):
        by_family.setdefault(n.split("_", 1)[0], []).append(describe(n))
    configs = {
        f: {"count": len(e), "digest": digest(e), "first": e[:12]} for f, e in by_family.items()
    }
    spaces = {}
    for fam in FAMILIES.values():
        for d, dtype, causal in GROUPS:
            space = fam.space(d, dtype, causal, 227 * 1024, fam.arch_for("9.0") or "")
            key = f"{fam.name}/{d}/{dtype}/{causal}"
            entry: dict[str, object] = {
                "space": digest([{"name": c.name} for c in space]),
                "count": len(space),
                "seeds": [c.name for c in fam.seeds(d, dtype, causal)],
            }
            if space:
                entry["default"] = fam.default(d, dtype, causal).name
                choices = search.SearchSpace.from_configs(space).choices
                entry["choices"] = {k: list(v) for k, v in choices.items()}
                entry["digest"] = digest([describe(c.name) for c in space])
                entry["sample"] = [describe(c.name) for c in space[:: max(1, len(space) // 4)]]
            spaces[key] = entry
    OUT.parent.mkdir(parents=True, exist_ok=True)
    data = {"configs": configs, "spaces": spaces, "added": dict(search.ADDED_PARAM_DEFAULTS)}
    OUT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
