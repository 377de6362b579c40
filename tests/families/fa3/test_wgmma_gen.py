"""codegen/fa3_wgmma_gen.py reproduces the committed codegen/templates/fa3_wgmma.cuh.

The header is generated, then committed (nvcc and the exporter read it); an edit to either side
alone would leave them disagreeing, and this CPU test says so.
"""

from __future__ import annotations

import re

from codegen import fa3_wgmma_gen
from codegen.render import template_dir


def test_generator_reproduces_the_committed_header_byte_for_byte() -> None:
    committed = (template_dir() / "fa3_wgmma.cuh").read_bytes()
    assert fa3_wgmma_gen.render().encode("utf-8") == committed
    assert fa3_wgmma_gen.OUT.resolve() == (template_dir() / "fa3_wgmma.cuh").resolve()


def test_every_size_has_both_operand_kinds_for_both_types() -> None:
    text = fa3_wgmma_gen.render()
    sizes = [int(n) for n in re.findall(r"struct Wgmma<(\d+)> \{", text)]
    assert sizes == list(range(16, 257, 16))
    for n in sizes:
        for t in ("f16", "bf16"):
            assert text.count(f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} ") == 2
    # A size's accumulator is n/2 registers, the asm's operands %0 .. %(n/2 - 1).
    assert "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, %11;" in text
