"""What a ``best`` request asks for, from its parameters: a dense shape or a packed batch.

``/v1/best`` and ``fa2tune best`` take the same parameters (``n`` and ``nq``, ``nk``,
``batch``, ``heads``, ``kv_heads``) and resolve them here, by one rule, into a
:class:`core.shape.Shape`, or into None for an old-style request that gives ``n`` alone (which
keeps the nearest-N answer it always had). ``/v1/best/varlen`` and ``fa2tune best --seqlens``
add ``seqlens`` (a comma list): :func:`resolve_varlen` makes a :class:`VarlenRequest` of it,
with the same error messages on both.
A resolved varlen request gives its batch as a :class:`core.lookup.Packed` descriptor.
Both take the attention variant (``window_left``, ``window_right``, ``chunk``, ``softcap``,
``sinks``), resolved by :func:`resolve_variant` into FlashAttention's normal form
(:func:`core.variant.normalize`), with the parameter named when a value is refused.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from core.kv_lengths import describe_kv_lengths
from core.lookup import Packed
from core.problem import describe_kv_page, kv_page_error
from core.shape import MAX_DIM, Shape, ShapeError
from core.variant import Variant, VariantError, normalize

#: The campaign's batch size and head count (:class:`core.problem.Problem`'s defaults): a
#: shape that leaves them out is asked at what the shipped results were tuned on.
DEFAULT_BATCH = 2
DEFAULT_HEADS = 16


class ShapeParamError(ShapeError):
    """One parameter of a request makes no shape; ``param`` names it (e.g. ``"kv_heads"``)."""

    def __init__(self, param: str, message: str, value: float | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.value = value


def resolve_shape(
    n: int | None,
    *,
    nq: int | None = None,
    nk: int | None = None,
    batch: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
) -> Shape | None:
    """The asked shape, or None when only ``n`` is given (the per-N answer).

    With any of the shape parameters: ``nq`` is ``nq`` or ``n``, ``nk`` defaults to ``nq``,
    ``batch`` to :data:`DEFAULT_BATCH`, ``heads`` to :data:`DEFAULT_HEADS` and ``kv_heads`` to
    ``heads``.

    Raises:
        ShapeParamError: neither ``n`` nor ``nq``; ``n`` and ``nq`` differ; a value outside
            1..2^31-1; ``heads`` not a multiple of ``kv_heads``.
    """
    given = {"n": n, "nq": nq, "nk": nk, "batch": batch, "heads": heads, "kv_heads": kv_heads}
    for name, value in given.items():
        if value is not None and not 1 <= value <= MAX_DIM:
            raise ShapeParamError(name, f"must be between 1 and {MAX_DIM}", value)
    if n is None and nq is None:
        raise ShapeParamError("n", "required: give n, or nq for a whole shape")
    if n is not None and nq is not None and n != nq:
        raise ShapeParamError("nq", f"differs from n ({n}); give one of them", nq)
    if nq is None and nk is None and batch is None and heads is None and kv_heads is None:
        return None
    q = nq if nq is not None else n
    assert q is not None  # one of the two, checked above
    h = heads if heads is not None else DEFAULT_HEADS
    kv = kv_heads if kv_heads is not None else h
    if h % kv:
        raise ShapeParamError("kv_heads", f"heads ({h}) must be a multiple of kv_heads", kv)
    return Shape(
        nq=q,
        nk=nk if nk is not None else q,
        batch=batch if batch is not None else DEFAULT_BATCH,
        heads=h,
        kv_heads=kv,
    )


#: Most sequences one request may name (the query string stays a few hundred KB at most).
MAX_SEQUENCES = 65536
#: Positive integers without leading zeros, comma-separated; at most 10 digits each (the
#: int32 limit is checked after parsing).
SEQLENS_PATTERN = r"^[1-9][0-9]{0,9}(,[1-9][0-9]{0,9})*$"
_SEQLENS_RE = re.compile(SEQLENS_PATTERN)
#: Query heads when a varlen request leaves them out (the campaign's, as for dense shapes).
DEFAULT_VARLEN_HEADS = DEFAULT_HEADS


@dataclass(frozen=True)
class VarlenRequest:
    """A resolved varlen request: each sequence's length and the head counts."""

    seqlens: tuple[int, ...]
    heads: int
    kv_heads: int

    @property
    def packed(self) -> Packed:
        """The asked batch as the store's lookup takes it."""
        return Packed.of(self.seqlens)


def parse_seqlens_param(text: str) -> list[int]:
    """``"100,4000,7"`` -> ``[100, 4000, 7]``.

    Raises:
        ValueError: not a comma list of positive integers, a length or their total past
            int32, or more than :data:`MAX_SEQUENCES` of them.
    """
    if not _SEQLENS_RE.fullmatch(text):
        raise ValueError("must be positive integers separated by commas, e.g. 100,4000,7")
    lens = [int(x) for x in text.split(",")]
    if len(lens) > MAX_SEQUENCES:
        raise ValueError(f"at most {MAX_SEQUENCES} lengths, got {len(lens)}")
    too_long = next((n for n in lens if n > MAX_DIM), None)
    if too_long is not None:
        raise ValueError(f"each length must be between 1 and {MAX_DIM}, got {too_long}")
    if sum(lens) > MAX_DIM:
        raise ValueError(f"the lengths add up to {sum(lens)}, past {MAX_DIM}")
    return lens


def resolve_varlen(seqlens: str, heads: int | None, kv_heads: int | None) -> VarlenRequest:
    """The asked packed batch: ``seqlens`` parsed (:func:`parse_seqlens_param`), ``heads``
    defaulting to :data:`DEFAULT_VARLEN_HEADS` and ``kv_heads`` to ``heads``.

    Raises:
        ShapeParamError: ``param`` ``"seqlens"`` for bad lengths; ``"heads"`` or
            ``"kv_heads"`` outside 1..2^31-1; ``"kv_heads"`` when ``heads`` is not a
            multiple of it.
    """
    for name, value in (("heads", heads), ("kv_heads", kv_heads)):
        if value is not None and not 1 <= value <= MAX_DIM:
            raise ShapeParamError(name, f"must be between 1 and {MAX_DIM}", value)
    try:
        lens = parse_seqlens_param(seqlens)
    except ValueError as exc:
        raise ShapeParamError("seqlens", str(exc)) from None
    q_heads = heads if heads is not None else DEFAULT_VARLEN_HEADS
    kv = kv_heads if kv_heads is not None else q_heads
    if q_heads % kv:
        raise ShapeParamError(
            "kv_heads", f"heads ({q_heads}) must be a multiple of kv_heads ({kv})", kv
        )
    return VarlenRequest(tuple(lens), q_heads, kv)


def no_varlen_results(gpu: str, d: int, dtype: str, causal: bool) -> str:
    """Why a varlen request has no answer: no varlen problem of this GPU, D, dtype and mask
    has a verified, timed measurement."""
    mask = "causal" if causal else "full"
    return f"no varlen results for {gpu!r}, D={d}, {dtype}, {mask}"


def resolve_variant(
    causal: bool,
    *,
    window_left: int = -1,
    window_right: int = -1,
    chunk: int = 0,
    softcap: float = 0.0,
    sinks: bool = False,
    nq: int | None = None,
    nk: int | None = None,
) -> tuple[bool, Variant]:
    """A request's ``(causal, variant)`` in the store's form (:func:`core.variant.normalize`,
    given the call's lengths: a window past every key is none, ``(-1, 0)`` is causal, ...).

    Raises:
        ShapeParamError: ``param`` names the argument: a window bound below -1 or past
            2^31-1, a chunk below 0 or past it, a softcap that is negative or not finite.
    """
    for name, value in (("window_left", window_left), ("window_right", window_right)):
        if not -1 <= value <= MAX_DIM:
            raise ShapeParamError(name, f"must be between -1 (no bound) and {MAX_DIM}", value)
    if not 0 <= chunk <= MAX_DIM:
        raise ShapeParamError("chunk", f"must be between 0 (none) and {MAX_DIM}", chunk)
    if not math.isfinite(softcap) or softcap < 0:
        raise ShapeParamError("softcap", "must be finite and >= 0 (0: none)", softcap)
    try:
        return normalize(causal, window_left, window_right, chunk, nq=nq, nk=nk,
                         softcap=softcap, sinks=sinks)  # fmt: skip
    except VariantError as exc:  # not reached after the checks above; named all the same
        raise ShapeParamError("window_left", str(exc)) from None


def no_variant_results(gpu: str, d: int, dtype: str, causal: bool, variant: Variant) -> str:
    """Why a variant request has no answer: nothing of its switches is tuned for this GPU,
    D, dtype and mask (or, with exact, not at its window and shape)."""
    mask = "causal" if causal else "full"
    return f"no results for {gpu!r}, D={d}, {dtype}, {mask} with {variant.describe()}"


def resolve_kv_page(page: int | None) -> int | None:
    """A request's KV-cache layout (``kv_page``: None for a dense call, 0 a contiguous cache,
    P a paged cache of P-token pages, :data:`core.problem.KV_PAGE_RULE`).

    Raises:
        ShapeParamError: ``param`` ``kv_page``: not 0 or a power of two up to the largest page.
    """
    if page is None:
        return None
    why = kv_page_error(page)
    if why is not None:
        raise ShapeParamError("kv_page", why.removeprefix("kv_page "), page)
    return page


def no_cache_results(
    gpu: str,
    d: int,
    dtype: str,
    causal: bool,
    kv_page: int,
    variant: Variant,
    kv_lengths: str | None = None,
) -> str:
    """Why a KV-cache request has no answer: no cache problem of its layout (and variant
    switches; of the length pattern ``kv_lengths`` when one was asked) is tuned for this
    GPU, D, dtype and mask, in its phase."""
    mask = "causal" if causal else "full"
    tail = "" if variant.plain else f" with {variant.describe()}"
    if kv_lengths is not None:
        tail += f", {describe_kv_lengths(kv_lengths)}"
    flag = "" if kv_lengths is None else f" --kv-lengths {kv_lengths}"
    return (
        f"no results for {gpu!r}, D={d}, {dtype}, {mask} over {describe_kv_page(kv_page)}{tail} "
        f"(tune one: fa2tune tune --kv-page {kv_page}{flag} ...)"
    )


_WINDOW_RE = re.compile(r"-?[0-9]{1,10},-?[0-9]{1,10}")


def parse_window(text: str) -> tuple[int, int]:
    """A window given as ``"LEFT,RIGHT"`` (the CLI's ``--window 4096,0``), each -1 or more.

    Raises:
        ShapeParamError: ``param`` ``"window"``: not two integers separated by a comma, or a
            bound below -1 or past 2^31-1.
    """
    if not _WINDOW_RE.fullmatch(text.strip()):
        raise ShapeParamError(
            "window", f"must be LEFT,RIGHT (two integers, -1: none), got {text!r}"
        )
    left, right = (int(x) for x in text.split(","))
    for value in (left, right):
        if not -1 <= value <= MAX_DIM:
            raise ShapeParamError("window", f"bounds must be between -1 and {MAX_DIM}", value)
    return left, right
