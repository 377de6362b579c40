"""The shape a ``best`` request asks for, from its optional parameters.

``/v1/best`` and ``fa2tune best`` take the same parameters (``n`` and ``nq``, ``nk``,
``batch``, ``heads``, ``kv_heads``) and resolve them here, by one rule, into a
:class:`core.shape.Shape`, or into None for an old-style request that gives ``n`` alone (which
keeps the nearest-N answer it always had).
"""

from __future__ import annotations

from core.shape import MAX_DIM, Shape, ShapeError

#: The campaign's batch size and head count (:class:`core.problem.Problem`'s defaults): a
#: shape that leaves them out is asked at what the shipped results were tuned on.
DEFAULT_BATCH = 2
DEFAULT_HEADS = 16


class ShapeParamError(ShapeError):
    """One parameter of a request makes no shape; ``param`` names it (e.g. ``"kv_heads"``)."""

    def __init__(self, param: str, message: str, value: int | None = None) -> None:
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
