"""``/v1/best`` and ``/v1/best/varlen``: the fastest correct config for a shape or a packed batch.

A dense shape is answered from the in-memory index; a packed batch of sequences from the
store (varlen problems are few and their lengths are part of the question, so they are not in
the index), by the one lookup both modes share (:mod:`db.queries`), in a worker thread.

An attention variant (``window_left``, ``window_right``, ``chunk``, ``softcap``, ``sinks``) is
resolved to FlashAttention's normal form with the call's lengths
(:func:`core.shape_request.resolve_variant`); what is plain then (no parameter, or a window
past every key) takes the plain paths above, unchanged. A variant's dense answer comes from
the store too (the index holds plain winners only), in a worker thread, and is cached by its
whole question and the index generation (which changes whenever the store does); the fast
path (:mod:`service.fastpath`) never answers a request that names a variant parameter.

A call over a KV cache (``kv_page``: 0 a contiguous cache, P a paged one; absent: a dense
call) takes the variant's way: a shape answer from the store, by the problems tuned on the
split-KV cache kernels of that very layout (``fa2tune tune --kv-page``), cached alike; no
dense result answers it and it answers no dense request (the index holds dense winners only).

A cache call's lengths live on the device, so the problems that answer it may be of either
length pattern (``kv_lengths``, :mod:`core.kv_lengths`): asked with none, the op's and the
exported header's rule (:func:`core.kv_lengths.answering_pattern`: the nearest problem of
either, a tie going to ``mixed``), so a client sees what a decode call would run; asked with
one, only that pattern, so the two can be compared. ``kv_lengths`` without ``kv_page`` is a
422 (a dense call has no length pattern).
"""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import APIRouter, HTTPException, Query, Response, status
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool

from core.kv_lengths import KvLengths
from core.shape import Shape
from core.shape_request import (
    SEQLENS_PATTERN,
    ShapeParamError,
    no_cache_results,
    no_variant_results,
    no_varlen_results,
    resolve_kv_page,
    resolve_shape,
    resolve_variant,
    resolve_varlen,
)
from core.variant import Variant
from db.store import Store
from service.deps import IndexDep, IndexHolderDep, SlowDep, StoreDep
from service.index import NotTunedError, gpu_key
from service.params import (
    BatchQuery,
    CausalQuery,
    ChunkQuery,
    DtypeQuery,
    GpuQuery,
    HeadDimQuery,
    HeadsQuery,
    KvHeadsQuery,
    KvLengthsQuery,
    KvPageQuery,
    NkQuery,
    NqQuery,
    OptionalSeqLenQuery,
    PlainBool,
    SinksQuery,
    SoftcapQuery,
    WindowLeftQuery,
    WindowRightQuery,
)
from service.schemas import BestOut, ErrorOut, ValidationErrorOut, VarlenBestOut

router = APIRouter(prefix="/v1", tags=["best"])

#: Why ``kv_lengths`` without ``kv_page`` is refused (a dense call has no length pattern, and
#: ``full`` alone must not be a second spelling of the dense request).
KV_LENGTHS_NEED_A_PAGE = (
    "a length pattern is a KV-cache call's: give kv_page too (0 for a contiguous cache, P "
    "for pages of P tokens), or leave kv_lengths out for a dense call"
)


@router.get(
    "/best",
    response_model=BestOut,
    summary="Best config for a shape",
    responses={
        status.HTTP_404_NOT_FOUND: {
            "model": ErrorOut,
            "description": "the GPU, head dim or dtype/mask has no results; or, with "
            "`exact=true`, N (or the shape) itself was not tuned",
        },
        status.HTTP_422_UNPROCESSABLE_CONTENT: {"model": ValidationErrorOut},
    },
)
async def best(
    index: IndexDep,
    holder: IndexHolderDep,
    slow: SlowDep,
    gpu: GpuQuery,
    d: HeadDimQuery,
    n: OptionalSeqLenQuery = None,
    dtype: DtypeQuery = "fp16",
    causal: CausalQuery = False,
    exact: Annotated[
        bool,
        Query(
            description="only a result measured at N (or the shape) itself: no nearest "
            "fallback (404)"
        ),
        PlainBool,
    ] = False,
    nq: NqQuery = None,
    nk: NkQuery = None,
    batch: BatchQuery = None,
    heads: HeadsQuery = None,
    kv_heads: KvHeadsQuery = None,
    window_left: WindowLeftQuery = -1,
    window_right: WindowRightQuery = -1,
    chunk: ChunkQuery = 0,
    softcap: SoftcapQuery = 0.0,
    sinks: SinksQuery = False,
    kv_page: KvPageQuery = None,
    kv_lengths: KvLengthsQuery = None,
) -> Response:
    """The fastest correct config measured for (GPU, D, N, dtype, causal), or for a shape.

    Give ``n`` or ``nq`` (or both, equal): a request with neither is a 422 naming ``n``.
    (Both are optional parameters in this document because OpenAPI cannot state "one of
    two parameters".)

    With ``n`` alone: when N itself was not tuned, the answer is the winner at the nearest
    tuned N on a log scale (``exact`` is false and ``from_n`` says which N); the timing and
    throughput are those measured at ``from_n``.

    With any of ``nq``, ``nk``, ``batch``, ``heads``, ``kv_heads``: the answer is for that
    whole shape (``nq`` defaults to ``n``, ``nk`` to ``nq``, ``batch`` to 2 and ``heads`` to
    16, the campaign's, ``kv_heads`` to ``heads``), measured at it or else at the nearest
    tuned shape; ``shape`` echoes the asked shape, ``measured_problem`` says where the
    answer was measured and ``distance`` how far that is (the sum of |log ratio| of Nq, Nk,
    grid fill and GQA group; 0 when exact).

    The response includes the full config, the measurement and its provenance (driver,
    CUDA, nvcc, arch, source hash, time). With ``exact=true`` (the CLI's ``--exact``) an
    untuned N or shape is a 404.

    An attention variant (``window_left``/``window_right``, ``chunk``, ``softcap``,
    ``sinks``; FlashAttention's semantics, bottom-right aligned) is normalised with the
    call's lengths (a causal call's right bound is 0; a bound past every key is none) and
    answered only by configs tuned with its switches: the same window and chunk, else the
    nearest tuned ones (then ``exact`` is false; with ``exact=true``, a 404), then the shape
    rule above. Its answer is a shape answer (``n`` alone asks for the campaign's N x N
    shape), and ``variant`` (the asked one) and ``measured_problem.variant`` say what it was
    answered for; both are absent for plain attention. Nothing tuned with its switches: 404.

    ``kv_page`` asks for a call over a KV cache whose lengths live on the device (0: a
    contiguous cache; P, a power of two up to 4096: a paged cache of P-token pages; ``nk`` the
    keys the sequences hold). It is answered only by problems tuned on the split-KV cache
    kernels of that very layout (``fa2tune tune --kv-page P``), exact else the nearest of the
    call's phase, never by a dense result; ``kv_page`` and ``measured_problem.kv_page`` echo
    it (absent for a dense call). Its answer is a shape answer, as a variant's. Nothing tuned
    of that layout: 404.

    ``kv_lengths`` (only with ``kv_page``; else a 422) picks the length pattern of the cache
    problems that answer: ``full`` (every sequence at the capacity) or ``mixed`` (a fixed
    spread of lengths up to it, as a serving batch has), only that one. Without it the
    answer is what the op and the exported header run for the call, whose lengths they
    cannot see: the nearest tuned problem of either pattern, a tie (both at the call's
    shape) going to ``mixed``; with ``exact=true`` only problems at the shape count.
    ``kv_lengths`` and ``measured_problem.kv_lengths`` say which pattern answered (absent for
    a dense call).
    """
    asked_causal = causal
    variant_given = (window_left, window_right, chunk, softcap, sinks) != (-1, -1, 0, 0.0, False)
    try:
        shape = resolve_shape(n, nq=nq, nk=nk, batch=batch, heads=heads, kv_heads=kv_heads)
        q = shape.nq if shape is not None else n
        causal, variant = resolve_variant(
            causal, window_left=window_left, window_right=window_right, chunk=chunk,
            softcap=softcap, sinks=sinks, nq=q, nk=shape.nk if shape is not None else q,
        )  # fmt: skip
        kv_page = resolve_kv_page(kv_page)
    except ShapeParamError as exc:
        kind = "missing" if exc.param == "n" and n is None else "value_error"
        raise _invalid(exc.param, str(exc), exc.value, kind) from None
    if kv_lengths is not None and kv_page is None:
        raise _invalid("kv_lengths", KV_LENGTHS_NEED_A_PAGE, kv_lengths)
    if not variant.plain or kv_page is not None:
        if shape is None:
            shape = resolve_shape(n, nq=n)  # the campaign's shape at N
        assert shape is not None
        key = ("best", holder.generation, gpu_key(gpu), d, dtype, causal, shape, variant, exact,
               kv_page, kv_lengths)  # fmt: skip
        body = slow.pages.get(key)
        if body is None:
            body = await run_in_threadpool(
                _store_body, holder.store, gpu, d, dtype, causal, shape, variant, exact, kv_page,
                kv_lengths,
            )  # fmt: skip
            slow.pages.put(key, body)
        return Response(content=body, media_type="application/json")
    try:
        if shape is None:
            assert n is not None  # resolve_shape requires n or nq
            # ``n`` alone is answered from the per-N tables as it always was, and as the fast
            # path answers it: the mask asked for, not the one-row rule that resolve_variant
            # applies for shapes (effective_causal); only a variant argument changes it.
            per_n_causal = causal if variant_given else asked_causal
            entry = index.lookup(gpu, d, n, dtype, per_n_causal, exact=exact)
            # Pre-rendered body (see service.index): no per-request model validation.
            return Response(content=entry.body(n), media_type="application/json")
        answer = index.lookup_shape(gpu, d, dtype, causal, shape, exact=exact)
    except NotTunedError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from None
    return Response(content=answer.body(), media_type="application/json")


@router.get(
    "/best/varlen",
    response_model=VarlenBestOut,
    summary="Best varlen config for a packed batch",
    responses={
        status.HTTP_404_NOT_FOUND: {
            "model": ErrorOut,
            "description": "no varlen problem of this GPU, head dim, dtype and mask is tuned",
        },
        status.HTTP_422_UNPROCESSABLE_CONTENT: {"model": ValidationErrorOut},
    },
)
def best_varlen(
    store: StoreDep,
    gpu: GpuQuery,
    d: HeadDimQuery,
    seqlens: Annotated[
        str,
        Query(
            description="each sequence's length, comma-separated (the packed batch's "
            "cu_seqlens differences); each 1..2^31-1, their sum too",
            examples=["100,4000,1822"],
            # Published only: core.shape_request checks it, with the same plain message as
            # `fa2tune best --seqlens` rather than "String should match pattern".
            json_schema_extra={"pattern": SEQLENS_PATTERN},
        ),
    ],
    dtype: DtypeQuery = "fp16",
    causal: CausalQuery = False,
    heads: HeadsQuery = None,
    kv_heads: KvHeadsQuery = None,
    window_left: WindowLeftQuery = -1,
    window_right: WindowRightQuery = -1,
    chunk: ChunkQuery = 0,
    softcap: SoftcapQuery = 0.0,
    sinks: SinksQuery = False,
) -> VarlenBestOut:
    """The fastest correct varlen (``_vl``) config measured on these lengths, else on the
    nearest tuned varlen batch: each batch is compared as its count of sequences at their
    mean length, by the distance of ``/v1/best`` (``distance``; ``measured_seqlens`` says
    which batch answered). ``heads`` defaults to 16 and ``kv_heads`` to ``heads``.

    The attention variant's parameters are ``/v1/best``'s (normalised with the longest
    sequence's length); ``variant`` and ``measured_variant`` say what was answered."""
    try:
        asked = resolve_varlen(seqlens, heads, kv_heads)
        longest = max(asked.seqlens)
        causal, variant = resolve_variant(
            causal, window_left=window_left, window_right=window_right, chunk=chunk,
            softcap=softcap, sinks=sinks, nq=longest, nk=longest,
        )  # fmt: skip
    except ShapeParamError as exc:
        value = seqlens if exc.param == "seqlens" else exc.value
        raise _invalid(exc.param, str(exc), value) from None
    name = gpu.strip()
    found = store.best_varlen(name, d, dtype, causal, asked.seqlens, asked.heads, asked.kv_heads,
                              variant=variant)  # fmt: skip
    if found is None:
        why = (no_varlen_results(name, d, dtype, causal) if variant.plain
               else "varlen: " + no_variant_results(name, d, dtype, causal, variant))  # fmt: skip
        raise HTTPException(status.HTTP_404_NOT_FOUND, why)
    best, measured = found
    return VarlenBestOut.of(best, asked.seqlens, measured, variant)


def _store_body(
    store: Store,
    gpu: str,
    d: int,
    dtype: str,
    causal: bool,
    shape: Shape,
    variant: Variant,
    exact: bool,
    kv_page: int | None = None,
    kv_lengths: KvLengths | None = None,
) -> bytes:
    """A variant or KV-cache request's answer body, from the store (run in a worker thread).

    Raises:
        HTTPException: 404 when nothing tuned with the variant's switches (over a cache of
            ``kv_page``'s layout, of ``kv_lengths``' pattern when given) answers (with
            ``exact``: not at its window, chunk and shape).
    """
    name = gpu.strip()
    asked = None if variant.plain else variant
    if kv_page is None:
        found = store.best_for_shape(name, d, dtype, causal, shape, exact=exact, variant=variant)
        if found is None:
            why = no_variant_results(name, d, dtype, causal, variant)
            raise HTTPException(status.HTTP_404_NOT_FOUND, _exact_tail(why, shape, exact))
        return BestOut.of(found, shape.nq, shape, asked).model_dump_json().encode()
    found = store.best_for_cache_call(
        name, d, dtype, causal, shape, kv_page=kv_page, kv_lengths=kv_lengths, exact=exact,
        variant=variant,
    )  # fmt: skip
    if found is None:
        why = no_cache_results(name, d, dtype, causal, kv_page, variant, kv_lengths)
        raise HTTPException(status.HTTP_404_NOT_FOUND, _exact_tail(why, shape, exact))
    body = BestOut.of(found, shape.nq, shape, asked, kv_page,
                      kv_lengths=cast(KvLengths, found.kv_lengths))  # fmt: skip
    return body.model_dump_json().encode()


def _exact_tail(why: str, shape: Shape, exact: bool) -> str:
    """``why``, with the shape an ``exact`` request asked for."""
    return f"{why} at {shape.describe()} (exact=true: no nearest fallback)" if exact else why


def _invalid(
    param: str, message: str, value: object, kind: str = "value_error"
) -> RequestValidationError:
    return RequestValidationError(
        [{"type": kind, "loc": ("query", param), "msg": message, "input": value}]
    )
