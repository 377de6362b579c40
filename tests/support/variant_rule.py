"""core.variant's masking rule for one (row, key), written the obvious way: what the tests
hold the reference, the dead-row count, the FLOPs and the launch normalisation to."""

from __future__ import annotations

from core.variant import Variant


def sees(i: int, j: int, nq: int, nk: int, causal: bool, v: Variant) -> bool:
    """Whether query row ``i`` sees key ``j`` (bottom-right aligned, ``pos = i + nk - nq``)."""
    pos = i + nk - nq
    if causal and j > pos:
        return False
    if v.window_left >= 0 and j < pos - v.window_left:
        return False
    if v.window_right >= 0 and j > pos + v.window_right:
        return False
    if v.chunk > 0:
        start = (pos // v.chunk) * v.chunk  # floor division: rounds down for negative pos
        if not start <= j < start + v.chunk:
            return False
    return True
