"""Instruction mix of one kernel's SASS (``cuobjdump -sass`` output), split into the main loop
and the rest: where the spills (STL/LDL) sit, and how many HMMA per LDSM/EX2 the loop issues.

Usage: python bench/h200/sass_stats.py kernel.sass
The main loop is taken as the widest range closed by a backward branch.
"""

from __future__ import annotations

import re
import sys
from collections import Counter

LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
WATCH = (
    "HMMA",
    "LDSM",
    "MUFU",
    "STL",
    "LDL",
    "LDGSTS",
    "BAR",
    "SHFL",
    "FMNMX",
    "FFMA",
    "FMUL",
    "F2FP",
    "LDS",
    "STS",
    "STG",
    "BRA",
)


def main(path: str) -> None:
    insts = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = LINE.search(line)
            if m:
                insts.append((int(m.group(1), 16), m.group(2), m.group(3)))
    loop = (0, -1)
    for addr, op, args in insts:
        if op == "BRA":
            t = re.search(r"0x([0-9a-f]+)", args)
            if t and int(t.group(1), 16) < addr and addr - int(t.group(1), 16) > loop[1] - loop[0]:
                loop = (int(t.group(1), 16), addr)
    inside = Counter(op.split(".")[0] for a, op, _ in insts if loop[0] <= a <= loop[1])
    outside = Counter(op.split(".")[0] for a, op, _ in insts if not loop[0] <= a <= loop[1])
    print(
        f"{path}: {len(insts)} instructions, main loop 0x{loop[0]:x}-0x{loop[1]:x} "
        f"({sum(inside.values())} instructions)"
    )
    for op in WATCH:
        print(f"  {op:7s} loop {inside.get(op, 0):5d}   rest {outside.get(op, 0):5d}")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        main(p)
