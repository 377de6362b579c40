"""A pure-ASGI shortcut for the happy path of ``GET /v1/best``.

FastAPI's per-request machinery (middleware stack, routing, dependency solving, validating
five query parameters) costs a few hundred microseconds of CPU, several times the work of
answering from the in-memory index. This middleware answers the requests it can answer
with certainty (every parameter plainly valid and the index has a result) and hands
everything else, untouched, to the FastAPI route, which stays the single source of truth
for validation messages, 404s and the OpenAPI documentation. ``tests/service/test_service.py``
checks that both paths give identical responses.

A request with ``n`` alone takes the per-N path it always took; one with any shape parameter
(:data:`SHAPE_PARAMS`) is resolved by :func:`core.shape_request.resolve_shape`, as the route
does, and answered from the index's shape tables.

A request naming an attention variant's parameter (:data:`service.params.VARIANT_PARAMS`,
even at its plain value) is always the route's: it normalises the variant and answers it
from the store, and the index holds plain winners only. So is one naming a KV-cache parameter
(:data:`service.params.CACHE_PARAMS`: ``kv_page``, ``kv_lengths``): the store answers it from
cache problems, and only the route refuses ``kv_lengths`` without ``kv_page``.
"""

from __future__ import annotations

from urllib.parse import unquote_plus

from starlette.types import ASGIApp, Receive, Scope, Send

from core.config import HEAD_DIMS
from core.shape import ShapeError
from core.shape_request import resolve_shape
from service.index import IndexHolder, NotTunedError
from service.params import CACHE_PARAMS, CONTROL_CHARS, MAX_GPU_NAME, MAX_N, VARIANT_PARAMS

PATH = "/v1/best"
_HEAD_DIMS = frozenset(HEAD_DIMS)
_DTYPES = frozenset(("fp16", "bf16"))
# Only the canonical spellings; pydantic accepts more ("True", "yes", "on"), and those go to
# the FastAPI route.
_BOOLS = {"false": False, "true": True, "0": False, "1": True}
_HEADERS = [(b"content-type", b"application/json")]
SHAPE_PARAMS = ("nq", "nk", "batch", "heads", "kv_heads")  # any of them asks for a shape


class BestFastPath:
    """ASGI middleware answering plainly valid ``GET /v1/best`` requests from the index.

    Args:
        app: the wrapped application (the FastAPI stack).
        holder: the index holder the FastAPI route also reads.
    """

    def __init__(self, app: ASGIApp, holder: IndexHolder) -> None:
        self.app = app
        self.holder = holder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == PATH and scope["method"] == "GET":
            body = self.answer(scope.get("query_string", b""))
            if body is not None:
                headers = [*_HEADERS, (b"content-length", str(len(body)).encode())]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

    def answer(self, query_string: bytes) -> bytes | None:
        """The 200 body for a query string, or None to let the FastAPI route decide."""
        if not query_string.isascii():
            return None  # percent-decoding and charset questions: the route's business
        # urllib.parse.parse_qsl(..., keep_blank_values=True), as Starlette parses, but
        # without its overhead for the common case of nothing to unquote.
        params: dict[str, str] = {}
        for part in query_string.decode("ascii").split("&"):
            if not part:
                continue
            key, _, value = part.partition("=")
            if "%" in part or "+" in part:
                key, value = unquote_plus(key), unquote_plus(value)
                if CONTROL_CHARS.search(key) or CONTROL_CHARS.search(value):
                    return None  # a NUL or other control character: the route refuses it
            if key in params:
                return None  # repeated parameter: let the route apply its rules
            params[key] = value
        if not params.keys().isdisjoint(VARIANT_PARAMS):
            return None  # the route normalises a variant; the index holds plain winners only
        if not params.keys().isdisjoint(CACHE_PARAMS):
            return None  # a KV-cache call: the route asks the store (the index is dense)
        if not params.keys().isdisjoint(SHAPE_PARAMS):
            return self._answer_shape(params)
        gpu = params.get("gpu")
        d_text = params.get("d", "")
        n_text = params.get("n", "")
        dtype = params.get("dtype", "fp16")
        causal = _BOOLS.get(params.get("causal", "false"))
        exact = _BOOLS.get(params.get("exact", "false"))
        if (
            gpu is None
            or not 1 <= len(gpu) <= MAX_GPU_NAME
            or not gpu.strip()
            or _int(d_text) is None
            or _int(n_text) is None
            or dtype not in _DTYPES
            or causal is None
            or exact is None
        ):
            return None
        d, n = int(d_text), int(n_text)
        if d not in _HEAD_DIMS or not 1 <= n <= MAX_N:
            return None
        try:
            entry = self.holder.current().lookup(gpu.strip(), d, n, dtype, causal)
        except NotTunedError:
            return None  # the route words the 404
        if exact and entry.n != n:
            return None  # likewise
        return entry.body(n)

    def _answer_shape(self, params: dict[str, str]) -> bytes | None:
        """:meth:`answer` for a request with shape parameters."""
        gpu = params.get("gpu")
        dtype = params.get("dtype", "fp16")
        causal = _BOOLS.get(params.get("causal", "false"))
        exact = _BOOLS.get(params.get("exact", "false"))
        d = _int(params.get("d", ""))
        if (
            gpu is None
            or not 1 <= len(gpu) <= MAX_GPU_NAME
            or not gpu.strip()
            or d not in _HEAD_DIMS
            or dtype not in _DTYPES
            or causal is None
            or exact is None
        ):
            return None
        dims: dict[str, int | None] = {}
        for name in ("n", *SHAPE_PARAMS):
            text = params.get(name)
            value = None if text is None else _int(text)
            if text is not None and (value is None or not 1 <= value <= MAX_N):
                return None
            dims[name] = value
        try:
            shape = resolve_shape(
                dims["n"],
                nq=dims["nq"],
                nk=dims["nk"],
                batch=dims["batch"],
                heads=dims["heads"],
                kv_heads=dims["kv_heads"],
            )
            if shape is None:
                return None  # not reached: a shape parameter is present
            answer = self.holder.current().lookup_shape(
                gpu.strip(), d, dtype, causal, shape, exact=exact
            )
        except (ShapeError, NotTunedError):
            return None  # the route words the 422 or 404
        return answer.body()


def _int(text: str) -> int | None:
    """A plain decimal of at most 10 digits (anything else is the route's to judge).

    ASCII only: percent-decoding can yield digits such as "²" that ``str.isdigit`` accepts
    and ``int`` rejects.
    """
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 10 else None
