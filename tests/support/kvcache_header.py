"""The small header the KV-cache header tests and bench/h200/header_check.sh's kvcache stage
export: D=128 fp16 with one tuned split-KV decode winner (plain, GQA 32:8), one tuned
sliding-window split-KV decode winner (window 256 to the left) and one fa2 prefill winner, with
the KV-cache kernels of the given page sizes.

Beside them, tuned KV-cache problems (``fa2tune tune --kv-page``) at the decode shape: a
contiguous-cache winner, a 16-key-page winner and a 256-key-page one (left out of headers
without page size 256).

So a plain decode step on the tuned GPU runs the tuned cache winner of its page size, a
windowed one the window winner's twin, a causal or longer call the split-KV default's twin (no
split-KV entry answers it), and a softcap is refused (not exported); on any other GPU every
call runs a twin. ``python -m tests.support.kvcache_header OUT GPU PAGES``
writes it (the bench stage's way in).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from codegen.export import TunedPoint, render_header
from core.splitkv_config import SplitKvConfig
from core.variant import normalize
from tests.support.factories import make_config

#: The tuned plain decode winner and its shape (batch 8, 32 query heads over 8 KV heads).
WINNER = "splitkv_d128_fp16_full_r16_n32_w4_s2_k8"
#: The tuned sliding-window decode winner (window_left 256, unmasked decode).
WINDOW_WINNER = "splitkv_d128_fp16_full_r16_n32_w4_s2_k4_loc"
WINDOW_LEFT = 256
#: The tuned KV-cache problems' winners at the decode shape, by page size (0: contiguous).
CACHE_WINNERS = {
    0: "splitkv_d128_fp16_full_r32_n16_w4_s2_k4_kvc",
    16: "splitkv_d128_fp16_full_r16_n16_w2_s2_k4_kvc_pg16",
    256: "splitkv_d128_fp16_full_r16_n32_w4_s2_k2_kvc_pg256",
}
WHEN = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def probe_points() -> list[TunedPoint]:
    """The tuned problems (see the module docstring)."""
    _, window = normalize(False, WINDOW_LEFT, -1, nq=1, nk=8192)
    plain = SplitKvConfig.from_name(WINNER)
    windowed = SplitKvConfig.from_name(WINDOW_WINNER)
    prefill = make_config(128, "fp16", False, br=64, bc=64, stages=2, swizzle=True)
    decode = TunedPoint(128, "fp16", False, 1, plain, nk=8192, batch=8, heads=32, kv_heads=8)
    return [
        decode,
        replace(decode, config=windowed, variant=window, tflops=1.0),
        TunedPoint(128, "fp16", False, 1024, prefill),
        *(
            replace(decode, config=SplitKvConfig.from_name(name), kv_page=page)
            for page, name in CACHE_WINNERS.items()
        ),
    ]


def probe_header(gpu: str, pages: tuple[int, ...]) -> str:
    """The header for ``gpu`` (a made-up name keeps every device off the tuned entries)."""
    return render_header(
        gpu, probe_points(), ds=[128], dtypes=["fp16"], generated_at=WHEN, kv_pages=pages
    )


def main(argv: list[str]) -> int:
    """``OUT GPU PAGES``: write the header for GPU with page sizes PAGES (``0,16``)."""
    out, gpu, pages = argv
    Path(out).write_text(probe_header(gpu, tuple(int(p) for p in pages.split(","))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
