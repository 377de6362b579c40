"""The packed batch a varlen ``best`` request asks for, from its parameters.

``/v1/best/varlen`` and ``fa2tune best --seqlens`` take the same parameters (``seqlens`` as a
comma list, optional ``heads`` and ``kv_heads``) and resolve them here, by one rule and with
the same error messages, into a :class:`VarlenRequest`; :func:`no_varlen_results` words the
answer when nothing varlen is tuned for the GPU, head dim, dtype and mask.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from core.shape import MAX_DIM
from core.shape_request import DEFAULT_HEADS, ShapeParamError

#: Most sequences one request may name (the query string stays a few hundred KB at most).
MAX_SEQUENCES = 65536
#: Positive integers without leading zeros, comma-separated; at most 10 digits each (the
#: int32 limit is checked after parsing).
SEQLENS_PATTERN = r"^[1-9][0-9]{0,9}(,[1-9][0-9]{0,9})*$"
_SEQLENS_RE = re.compile(SEQLENS_PATTERN)
#: Query heads when the request leaves them out (the campaign's, as for dense shapes).
DEFAULT_VARLEN_HEADS = DEFAULT_HEADS


@dataclass(frozen=True)
class VarlenRequest:
    """A resolved varlen request: each sequence's length and the head counts."""

    seqlens: tuple[int, ...]
    heads: int
    kv_heads: int


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
