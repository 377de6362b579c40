"""A pure-ASGI shortcut for the happy path of ``GET /v1/best``.

FastAPI's per-request machinery (middleware stack, routing, dependency solving, validating
five query parameters) costs a few hundred microseconds of CPU, several times the work of
answering from the in-memory index. This middleware answers the requests it can answer
with certainty (every parameter plainly valid and the index has a result) and hands
everything else, untouched, to the FastAPI route, which stays the single source of truth
for validation messages, 404s and the OpenAPI documentation. ``tests/test_service.py``
checks that both paths give identical responses.
"""

from __future__ import annotations

from urllib.parse import unquote_plus

from starlette.types import ASGIApp, Receive, Scope, Send

from core.config import HEAD_DIMS
from service.index import IndexHolder, NotTunedError
from service.params import MAX_GPU_NAME, MAX_N

PATH = "/v1/best"
_HEAD_DIMS = frozenset(HEAD_DIMS)
_DTYPES = frozenset(("fp16", "bf16"))
# Only the canonical spellings; pydantic accepts more ("True", "yes", "on"), and those go to
# the FastAPI route.
_BOOLS = {"false": False, "true": True, "0": False, "1": True}
_HEADERS = [(b"content-type", b"application/json")]


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
            if key in params:
                return None  # repeated parameter: let the route apply its rules
            params[key] = value
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
            or not d_text.isdigit()
            or not n_text.isdigit()
            or len(n_text) > 10
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
