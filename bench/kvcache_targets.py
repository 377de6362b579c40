"""Issue 24's speed targets in one run: paged decode per page size against the contiguous
cache, a mixed batch's bandwidth, FlexAttention's paged attention on the same cache, and
chunked prefill over a cached prefix against the dense kernel on the same work.

Rows (GQA 32:8, D = 128, bf16; every call on the configs the shipped results give it, so
the cache problems tuned in db/data/h200_results_kvcache.json are re-timed here):

* decode (Nq = 1), every sequence at its cache's capacity: ``cache`` (contiguous cache,
  lengths on the device), ``paged16`` / ``paged64`` / ``paged256`` (the same keys in pages
  of that size in a random order), ``dense`` (``fa2tune.torch.attention``), ``flex256``
  (FlexAttention under ``torch.compile``, default options, over the 256-key pages through a
  block mask built from the page table: one KV block per page), ``flash`` / ``cudnn`` (SDPA
  on the dense K/V, ``enable_gqa``);
* ``mixed``: 32 sequences of lengths spread over 100..32k in one 32k-capacity cache, the
  same columns where they apply (``flex16`` too); bandwidth counts the keys the lengths
  cover;
* ``chunked``: 2,048 new queries over a 32k cached prefix (34,816 keys, causal bottom-right)
  from the cache against ``dense`` and SDPA with ``causal_lower_right`` on the same keys;
  ``cache``/``paged16``/``paged256`` on split-KV's cache kernels (``FA2TUNE_FA3_CACHE`` off
  for them), ``hopper0``/``hopper16``/``hopper256``: the same cache calls on the Hopper
  family's cache kernels (the op's default for a chunked prefill on an H100/H200).

GPU time per call: CUDA events around one call after an L2 flush, median of ``--reps``.
Every output is checked first (poisoned allocator, fresh random inputs) against a float32
reference per sequence (decode, mixed) or SDPA efficient (chunked); a wrong or refused call
is recorded with its reason, not timed. Writes ``kvcache_targets.json`` and a log table::

    PYTHONPATH=$PWD python bench/kvcache_targets.py --out docs/measurements/kvcache-targets
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
from pathlib import Path
from typing import Any

from kvcache_bench import H200_PEAK_BYTES_PER_S, _gpu_us

log = logging.getLogger("kvcache_targets")
HQ, HKV, D = 32, 8, 128
DECODE = [(8, 8192), (8, 32768), (32, 32768), (1, 131072), (128, 8192)]  # (batch, capacity)
PAGES = (16, 64, 256)
CHUNK_NEW, CHUNK_KEYS = 2048, 34816


class Cache:
    """One set of K/V values as a dense tensor pair and as shuffled pages of each size."""

    def __init__(self, torch: Any, batch: int, capacity: int, lens: list[int]) -> None:
        self.torch, self.batch, self.capacity = torch, batch, capacity
        bf16 = torch.bfloat16
        self.k = torch.randn(batch, capacity, HKV, D, device="cuda", dtype=bf16)
        self.v = torch.randn(batch, capacity, HKV, D, device="cuda", dtype=bf16)
        self.lens_list = lens
        self.lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        self.pages: dict[int, tuple[Any, Any, Any]] = {}

    def paged(self, page: int) -> tuple[Any, Any, Any]:
        """(k pages, v pages, block table) with the i-th block of ``page`` keys (batch-major)
        at page ``order[i]`` of a random permutation."""
        if page not in self.pages:
            torch, per = self.torch, self.capacity // page
            order = torch.randperm(self.batch * per, device="cuda")
            shape = (self.batch * per, page, HKV, D)
            kp = torch.empty(shape, device="cuda", dtype=self.k.dtype)
            vp = torch.empty_like(kp)
            kp[order] = self.k.reshape(shape)
            vp[order] = self.v.reshape(shape)
            self.pages[page] = (kp, vp, order.view(self.batch, per).to(torch.int32))
        return self.pages[page]

    def visible_bytes(self) -> int:
        return 2 * sum(self.lens_list) * HKV * D * 2


def reference(torch: Any, q: Any, cache: Cache) -> Any:
    """float32 decode output per sequence over its first ``lens[b]`` keys."""
    out = torch.empty(q.shape, device="cuda", dtype=torch.float32)
    for b, n in enumerate(cache.lens_list):
        qb = q[b].float().transpose(0, 1)  # [H, 1, D]
        kb = cache.k[b, :n].float().transpose(0, 1).repeat_interleave(HQ // HKV, 0)
        vb = cache.v[b, :n].float().transpose(0, 1).repeat_interleave(HQ // HKV, 0)
        out[b] = torch.nn.functional.scaled_dot_product_attention(qb, kb, vb).transpose(0, 1)
    return out


def flex_paged(torch: Any, q: Any, cache: Cache, page: int) -> Any:
    """FlexAttention over the shuffled pages: the K/V pages as one physical sequence (batch 1,
    broadcast over the queries' batch) and a block mask whose KV blocks are the pages each
    sequence's table lists; the last page's tail past the length masked by ``mask_mod``."""
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    kp, vp, table = cache.paged(page)
    pages_total = kp.shape[0]
    k_phys = kp.view(1, pages_total * page, HKV, D).transpose(1, 2)
    v_phys = vp.view(1, pages_total * page, HKV, D).transpose(1, 2)
    used = (cache.lens + page - 1) // page
    kv_num = used.view(-1, 1, 1).to(torch.int32)
    # Indices over every physical block (torch transposes them into per-block query lists,
    # indexed by block number): each row's pages first, the rest never read (kv_num).
    kv_idx = torch.zeros(cache.batch, 1, 1, pages_total, dtype=torch.int32, device="cuda")
    kv_idx[:, 0, 0, : table.shape[1]] = table
    slot = torch.empty(pages_total, dtype=torch.int32, device="cuda")  # page -> logical index
    slot[table.flatten().long()] = torch.arange(table.shape[1], device="cuda",
                                                dtype=torch.int32).repeat(cache.batch)  # fmt: skip
    owner = torch.empty(pages_total, dtype=torch.int32, device="cuda")  # page -> its sequence
    rows = torch.arange(cache.batch, device="cuda", dtype=torch.int32)
    owner[table.flatten().long()] = rows.repeat_interleave(table.shape[1])
    lens = cache.lens

    def mask_mod(b, h, qi, kj):  # type: ignore[no-untyped-def]
        # The block mask visits each sequence's own pages only; the mask says so too (what
        # an unfused evaluation reads) and cuts the last page at the length.
        return (owner[kj // page] == b) & (slot[kj // page] * page + kj % page < lens[b])

    block_mask = BlockMask.from_kv_blocks(kv_num, kv_idx, BLOCK_SIZE=(128, page),
                                          mask_mod=mask_mod,
                                          seq_lengths=(q.shape[1], pages_total * page))  # fmt: skip
    torch._dynamo.reset()  # a fresh compile per row: no recompile limit, no unfused fallback
    flex = torch.compile(flex_attention)
    qh = q.transpose(1, 2)
    return lambda: flex(qh, k_phys, v_phys, block_mask=block_mask, enable_gqa=True).transpose(
        1, 2)  # fmt: skip


def sdpa_dense(torch: Any, q: Any, cache: Cache, backend: Any) -> Any:
    from torch.nn.attention import sdpa_kernel

    qh, kh, vh = q.transpose(1, 2), cache.k.transpose(1, 2), cache.v.transpose(1, 2)

    def call() -> Any:
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(
                qh, kh, vh, enable_gqa=True).transpose(1, 2)  # fmt: skip

    return call


def measure(torch: Any, calls: dict[str, Any], ref: Any, reps: int, flush: Any,
            work: float, unit: str, tol: float = 2e-2) -> dict[str, Any]:  # fmt: skip
    """Each call checked against ``ref`` then timed; ``work`` bytes or FLOPs per call."""
    row: dict[str, Any] = {}
    for name, make in calls.items():
        torch.cuda.empty_cache()
        try:
            fn = make()
            junk = torch.full((ref.numel() * 2,), float("nan"), device="cuda", dtype=torch.bfloat16)
            del junk  # poisons the allocator's next block
            err = (fn().float() - ref.float()).abs().max().item()
            if not math.isfinite(err) or err > tol:
                row[name] = {"error": f"wrong result: max |O - ref| = {err:.3g}"}
                continue
            us = _gpu_us(torch, fn, reps, flush)
        except Exception as exc:  # a refused call is a result, not a stop
            row[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
            log.warning("%s: %s", name, row[name]["error"])
            continue
        rate = work / us / 1e6  # TB/s or TFLOP/s
        row[name] = {"us": round(us, 2), unit: round(rate, 3), "max_err": err}
        if unit == "tb_s":
            row[name]["of_peak"] = round(rate * 1e12 / H200_PEAK_BYTES_PER_S, 3)
    return row


def decode_calls(torch: Any, q: Any, cache: Cache, flex_pages: tuple[int, ...],
                 dense: bool) -> dict[str, Any]:  # fmt: skip
    from torch.nn.attention import SDPBackend

    from fa2tune.torch import attention, attention_with_kvcache

    lens = cache.lens
    calls: dict[str, Any] = {
        "cache": lambda: (
            lambda: attention_with_kvcache(q, cache.k, cache.v, cache_seqlens=lens, fallback=False)
        ),
    }
    for page in PAGES:

        def paged(page: int = page) -> Any:
            kp, vp, table = cache.paged(page)
            return lambda: attention_with_kvcache(q, kp, vp, cache_seqlens=lens,
                                                  page_table=table, fallback=False)  # fmt: skip

        calls[f"paged{page}"] = paged
    if dense:  # every sequence at the capacity: the dense calls compute the same thing
        calls["dense"] = lambda: lambda: attention(q, cache.k, cache.v, fallback=False)
        calls["flash"] = lambda: sdpa_dense(torch, q, cache, SDPBackend.FLASH_ATTENTION)
        calls["cudnn"] = lambda: sdpa_dense(torch, q, cache, SDPBackend.CUDNN_ATTENTION)
    for page in flex_pages:  # last: a device-side fault there would spoil what follows
        calls[f"flex{page}"] = lambda page=page: flex_paged(torch, q, cache, page)
    return calls


def decode_row(torch: Any, batch: int, lens: list[int], capacity: int, reps: int, flush: Any,
               flex_pages: tuple[int, ...]) -> dict[str, Any]:  # fmt: skip
    cache = Cache(torch, batch, capacity, lens)
    q = torch.randn(batch, 1, HQ, D, device="cuda", dtype=torch.bfloat16)
    ref = reference(torch, q, cache)
    dense = all(n == capacity for n in lens)
    row = measure(torch, decode_calls(torch, q, cache, flex_pages, dense), ref, reps, flush,
                  cache.visible_bytes(), "tb_s")  # fmt: skip
    row["shape"] = {"batch": batch, "capacity": capacity, "keys": sum(lens),
                    "min_len": min(lens), "max_len": max(lens)}  # fmt: skip
    for name, cell in row.items():
        if name.startswith(("paged", "flex")) and "us" in cell and "us" in row.get("cache", {}):
            cell["vs_cache"] = round(row["cache"]["us"] / cell["us"], 3)
    return row


def chunked_row(torch: Any, reps: int, flush: Any) -> dict[str, Any]:
    """2,048 new queries (already appended) over 32k cached keys, causal bottom-right."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    from core.settings import get_settings, override_settings
    from fa2tune.torch import attention, attention_with_kvcache, clear_caches

    cache = Cache(torch, 1, CHUNK_KEYS, [CHUNK_KEYS])
    q = torch.randn(1, CHUNK_NEW, HQ, D, device="cuda", dtype=torch.bfloat16)
    # SDPA's efficient and flash kernels take a lower-right causal mask but not with
    # enable_gqa: the KV heads repeated for them.
    group = HQ // HKV
    qh = q.transpose(1, 2)
    kh = cache.k.transpose(1, 2).repeat_interleave(group, 1)
    vh = cache.v.transpose(1, 2).repeat_interleave(group, 1)
    mask = causal_lower_right(CHUNK_NEW, CHUNK_KEYS)

    def sdpa(backend: Any) -> Any:
        def call() -> Any:
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(
                    qh, kh, vh, attn_mask=mask).transpose(1, 2)  # fmt: skip

        return call

    ref = sdpa(SDPBackend.EFFICIENT_ATTENTION)()
    lens = cache.lens
    default_route = get_settings().fa3_cache

    def split_kv() -> None:
        # The split-KV columns: the Hopper family's cache kernels are the op's default for a
        # chunked prefill on this GPU (Settings.fa3_cache), so they are switched off first.
        override_settings(fa3_cache=False)
        clear_caches()

    def contiguous() -> Any:
        split_kv()
        return lambda: attention_with_kvcache(q, cache.k, cache.v, cache_seqlens=lens,
                                              causal=True, fallback=False)  # fmt: skip

    calls: dict[str, Any] = {
        "cache": contiguous,
        "dense": lambda: lambda: attention(q, cache.k, cache.v, causal=True, fallback=False),
        "efficient": lambda: sdpa(SDPBackend.EFFICIENT_ATTENTION),
        "flash": lambda: sdpa(SDPBackend.FLASH_ATTENTION),
    }
    for page in (16, 256):

        def paged(page: int = page) -> Any:
            split_kv()
            kp, vp, table = cache.paged(page)
            return lambda: attention_with_kvcache(q, kp, vp, cache_seqlens=lens, causal=True,
                                                  page_table=table, fallback=False)  # fmt: skip

        calls[f"paged{page}"] = paged
    # Then the same calls with FA2TUNE_FA3_CACHE, on the Hopper family's cache kernels (each
    # column re-decides: the setting is read when a cache shape is first decided).
    for page in (0, 16, 256):

        def hopper(page: int = page) -> Any:
            override_settings(fa3_cache=True)
            clear_caches()  # the setting is read when a cache shape is first decided
            if page == 0:
                return lambda: attention_with_kvcache(q, cache.k, cache.v, cache_seqlens=lens,
                                                      causal=True, fallback=False)  # fmt: skip
            kp, vp, table = cache.paged(page)
            return lambda: attention_with_kvcache(q, kp, vp, cache_seqlens=lens, causal=True,
                                                  page_table=table, fallback=False)  # fmt: skip

        calls[f"hopper{page}"] = hopper
    pairs = CHUNK_NEW * (CHUNK_KEYS - CHUNK_NEW) + CHUNK_NEW * (CHUNK_NEW + 1) / 2
    try:
        row = measure(torch, calls, ref, reps, flush, 4.0 * HQ * D * pairs, "tflops")
    finally:
        override_settings(fa3_cache=default_route)  # the route the process had before the row
        clear_caches()
    row["shape"] = {"batch": 1, "new": CHUNK_NEW, "keys": CHUNK_KEYS}
    for cell in row.values():
        if "us" in cell and "us" in row.get("dense", {}):
            cell["vs_dense"] = round(row["dense"]["us"] / cell["us"], 3)
    return row


def mixed_lens(torch: Any) -> list[int]:
    """32 lengths spread log-uniformly over 100..32768 (fixed by the seed)."""
    u = torch.rand(32, generator=torch.Generator().manual_seed(24))
    return sorted(int(100 * (32768 / 100) ** float(x)) for x in u)


def log_table(rows: dict[str, dict[str, Any]]) -> None:
    for label, row in rows.items():
        cells = []
        for name, cell in row.items():
            if name == "shape":
                continue
            if "us" not in cell:
                cells.append(f"{name}=err")
                continue
            rate = cell.get("tb_s", cell.get("tflops"))
            ratio = cell.get("vs_cache", cell.get("vs_dense"))
            cells.append(f"{name}={cell['us']:.1f}us/{rate:.2f}" + (f"/{ratio}x" if ratio else ""))
        log.info("%-16s %s", label, "  ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--rows", default="decode,mixed,chunked",
                        help="which rows: decode, mixed, chunked (comma-separated)")  # fmt: skip
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    import torch

    from fa2tune.torch import autotune

    autotune("cached")  # the shipped results, the cache problems' tuned picks among them
    torch.manual_seed(0)
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device="cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "rows": {},
    }  # fmt: skip
    rows: dict[str, dict[str, Any]] = report["rows"]
    path = args.out / "kvcache_targets.json"
    wanted = set(args.rows.split(","))
    for batch, capacity in DECODE if "decode" in wanted else ():
        rows[f"decode B{batch} N{capacity}"] = decode_row(
            torch, batch, [capacity] * batch, capacity, args.reps, flush, (256,))  # fmt: skip
        path.write_text(json.dumps(report, indent=1) + "\n")
    if "mixed" in wanted:
        rows["mixed B32 100..32k"] = decode_row(torch, 32, mixed_lens(torch), 32768, args.reps,
                                                flush, (16, 256))  # fmt: skip
        path.write_text(json.dumps(report, indent=1) + "\n")
    if "chunked" in wanted:
        rows["chunked 2k/34816"] = chunked_row(torch, args.reps, flush)
        path.write_text(json.dumps(report, indent=1) + "\n")
    log_table(rows)


if __name__ == "__main__":
    main()
