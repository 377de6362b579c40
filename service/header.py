"""The tuned header from the store: query the winners, hand them to the exporter as plain values.

:mod:`codegen.export` renders a header from :class:`~codegen.export.TunedPoint` values and
reads no database; this module is the store side that both ``fa2tune export`` and
``/v1/export/header`` use. The header holds one entry per tuned problem
(:func:`tuned_shape_results`) and picks among them by :mod:`core.shape`'s rule, the one the
store and the service use, and one entry per tuned attention-variant problem
(:meth:`db.store.Store.variant_winners`), picked among by :func:`core.lookup.pick`'s rule;
:func:`tuned_results` (square problems, one per N) feeds the service's per-N index. With page
sizes it also holds the tuned KV-cache problems' winners (:meth:`db.store.Store.cache_winners`,
each with its length pattern), both patterns, the mixed-length winner where both were tuned
at a shape (:func:`codegen.export.cache_points`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from codegen.dispatch_kvcache import check_kv_pages, header_cache_families
from codegen.dispatch_table import header_varlen_families
from codegen.dispatch_variants import header_variant_families
from codegen.export import TunedPoint, render_header
from core.config import DTYPES, HEAD_DIMS, HEAD_DIMS_RULE, Dtype
from core.gpu_name import normalize_gpu_name
from core.records import MeasureStatus
from core.shape import Shape, ShapeError
from db.results import MAX_PAGE, BestResult
from db.store import Store

log = logging.getLogger(__name__)


class UnknownGpuError(LookupError):
    """The store holds no results for the requested GPU."""


def tuned_results(
    store: Store,
    gpu: str | None = None,
    *,
    ds: Sequence[int] | None = None,
    dtypes: Sequence[str] | None = None,
) -> list[BestResult]:
    """The winner of every square problem (N == Nk) with an OK measurement.

    The distinct problems are collected by paging through the OK measurements once, then
    :meth:`db.store.Store.best` ranks each, so the answers are exactly the store's.

    Args:
        store: the results database.
        gpu: only this GPU (matched like users write it); None for every GPU.
        ds: only these head dims; None for all.
        dtypes: only these dtypes; None for all.

    Returns:
        One result per (GPU, D, dtype, causal, N), sorted by those.
    """
    problems: dict[tuple[str, int, str, bool, int], str] = {}
    for d in sorted(set(ds)) if ds else [None]:
        offset = 0
        while True:
            page = store.results(
                gpu, d, status=MeasureStatus.OK.value, offset=offset, limit=MAX_PAGE
            )
            for row in page.items:
                if row.nk != row.n or (dtypes is not None and row.dtype not in dtypes):
                    continue
                key = (normalize_gpu_name(row.gpu), row.d, row.dtype, row.causal, row.n)
                problems.setdefault(key, row.gpu)
            offset += len(page.items)
            if not page.items or offset >= page.total:
                break
    results: list[BestResult] = []
    for (_, d_, dtype, causal, n), name in sorted(problems.items()):
        best = store.best(name, d_, n, dtype, causal)
        if best is not None:
            results.append(best)
    return results


def tuned_shape_results(
    store: Store,
    gpu: str,
    *,
    ds: Sequence[int] | None = None,
    dtypes: Sequence[str] | None = None,
) -> list[BestResult]:
    """The winner of every tuned problem of one GPU, whatever its shape: one per (D, dtype,
    causal, Nq, Nk, batch, heads, KV heads) with an OK measurement, of any family.

    As :func:`tuned_results`, but problems that differ only in Nk, batch, heads or KV heads
    stay apart (each is :meth:`db.store.Store.best` of exactly its shape), since the header
    dispatches on the whole call shape.

    Args:
        store: the results database.
        gpu: the GPU, matched like users write it.
        ds: only these head dims; None for all.
        dtypes: only these dtypes; None for all.

    Returns:
        The winners sorted by (D, dtype, causal, shape).
    """
    problems: dict[tuple[int, str, bool, Shape], str] = {}
    for d in sorted(set(ds)) if ds else [None]:
        offset = 0
        while True:
            page = store.results(
                gpu, d, status=MeasureStatus.OK.value, offset=offset, limit=MAX_PAGE
            )
            for row in page.items:
                if dtypes is not None and row.dtype not in dtypes:
                    continue
                try:
                    shape = Shape(row.n, row.nk, row.batch, row.heads, row.kv_heads)
                except ShapeError:  # no kernel runs it; the store should not hold it
                    log.warning("skipping measurement %d: no valid shape", row.measurement_id)
                    continue
                problems.setdefault((row.d, row.dtype, row.causal, shape), row.gpu)
            offset += len(page.items)
            if not page.items or offset >= page.total:
                break
    results: list[BestResult] = []
    for (d_, dtype, causal, sh), name in sorted(problems.items()):
        best = store.best(
            name,
            d_,
            sh.nq,
            dtype,
            causal,
            nk=sh.nk,
            batch=sh.batch,
            heads=sh.heads,
            kv_heads=sh.kv_heads,
        )
        if best is not None:
            results.append(best)
    return results


def point_from_best(best: BestResult, seqlens: tuple[int, ...] | None = None) -> TunedPoint:
    """A :class:`~codegen.export.TunedPoint` from the store's :class:`~db.store.BestResult`;
    with ``seqlens``, of the packed problem measured on those lengths."""
    return TunedPoint(
        d=best.d,
        dtype=best.config.dtype,
        causal=best.causal,
        n=best.n,
        nk=best.nk,
        batch=best.batch if seqlens is None else len(seqlens),
        seqlens=seqlens,
        heads=best.heads,
        kv_heads=best.kv_heads,
        config=best.config,
        median_ms=best.median_ms,
        tflops=best.tflops,
        arch=best.arch,
        source_hash=best.source_hash,
        nvcc_version=best.nvcc_version,
        driver_version=best.driver_version,
        cuda_version=best.cuda_version,
        measured_at=best.measured_at,
        variant=best.variant,
        kv_page=best.kv_page,
        kv_lengths=best.kv_lengths,
    )


def export_header(
    store: Store,
    gpu: str,
    ds: Sequence[int] | None = None,
    *,
    dtypes: Sequence[Dtype] | None = None,
    generated_at: datetime | None = None,
    filename: str = "fa2_tuned.cuh",
    kv_pages: Sequence[int] = (),
) -> str:
    """The tuned header for one GPU: template inlined, tuned configs plus defaults, dispatch.

    Args:
        store: the results database.
        gpu: the GPU, as users write it (``"H200"``, ``"NVIDIA H200"``).
        ds: head dims to support (each gets FA2's default config, tuned ones their winners);
            None for :data:`~core.config.COMMON_HEAD_DIMS` plus every head dim with tuned
            results for ``gpu`` (each default config is compiled into the user's program,
            so not every supported head dim unless asked for).
        dtypes: element types to support; None for both.
        generated_at: timestamp for the header comment (now when None).
        filename: the header's file name, for the comment.
        kv_pages: page sizes of the header's KV-cache kernels (``fa2tune_forward_kvcache``;
            0 for contiguous caches); none: no KV-cache code.

    Returns:
        The header text; it compiles with nvcc alone.

    Raises:
        UnknownGpuError: the store has no OK measurement for ``gpu``.
        ValueError: unsupported head dim, dtype or page size.
        codegen.export.ExportError: the templates cannot be inlined.
    """
    ds = None if ds is None else tuple(ds)
    dtypes = tuple(DTYPES if dtypes is None else dtypes)
    for d in ds or ():
        if d not in HEAD_DIMS:
            raise ValueError(f"unsupported head dim {d}: not {HEAD_DIMS_RULE}")
    for t in dtypes:
        if t not in DTYPES:
            raise ValueError(f"unsupported dtype {t!r}; supported: {', '.join(DTYPES)}")
    kv_pages = check_kv_pages(kv_pages)  # before the store is asked anything
    key = normalize_gpu_name(gpu)
    known = [g for g in store.gpus() if normalize_gpu_name(g.name) == key]
    if not any(g.ok_measurements for g in known):
        names = sorted({g.name for g in store.gpus() if g.ok_measurements})
        raise UnknownGpuError(
            f"no results for GPU {gpu!r}; GPUs with results: {', '.join(names) or 'none'}"
        )
    results = tuned_shape_results(store, gpu, ds=ds, dtypes=dtypes)
    # The varlen winners among the families the header launches packed (fa2, fa3: a winner
    # of a family it could not launch must not hide one it can), in problem-id order (the
    # exporter keeps the first of equal shapes, as Store.best_varlen breaks ties);
    # render_header filters them by ds and dtypes.
    packed = [
        point_from_best(b, lens) for b, lens in store.varlen_winners(gpu, header_varlen_families())
    ]
    # The attention-variant winners (dense and packed), by the families the header launches
    # variants of, in problem-id order (the order the store breaks packed ties in).
    variants = [
        point_from_best(b, lens)
        for b, lens in store.variant_winners(
            gpu, header_variant_families(), header_variant_families(packed=True)
        )
    ]
    # The tuned KV-cache problems' winners (of the family with cache kernels in the header),
    # of both length patterns, only when the header has cache kernels; render_header keeps
    # those of its page sizes, and of one pattern per key, page size and phase.
    caches = (
        [point_from_best(b) for b in store.cache_winners(gpu, header_cache_families())]
        if kv_pages
        else []
    )
    name = results[0].gpu if results else known[0].name
    log.info(
        "exporting %d tuned configs, %d varlen, %d attention-variant and %d KV-cache ones for "
        "%s (D=%s, %s)",
        len(results),
        len(packed),
        len(variants),
        len(caches),
        name,
        ",".join(map(str, ds)) if ds else "common and tuned",
        ",".join(dtypes),
    )
    return render_header(
        name,
        [*(point_from_best(b) for b in results), *packed, *variants, *caches],
        ds=ds,
        dtypes=dtypes,
        generated_at=generated_at,
        filename=filename,
        kv_pages=kv_pages,
    )
