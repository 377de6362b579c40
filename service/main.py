"""The FastAPI application: ``create_app`` wires the store, the index, routers and handlers.

Start-up (the lifespan) loads the results shipped with the package into the configured
database and builds the in-memory best-config index; a background task rebuilds the index
when other writers (tuner workers, ``fa2tune ingest``) add OK measurements.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

from fastapi import Depends, FastAPI, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, RedirectResponse
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp

from core.settings import Settings, get_settings
from core.shape_request import DEFAULT_BATCH, DEFAULT_HEADS
from core.version import __version__
from db.dump_format import DumpFile
from db.shipped import load_shipped_results
from db.store import Store
from service.admission import SlowGate
from service.dbfile import DatabaseFile
from service.deps import SlowEndpoints
from service.docs_pages import DOCS_PATH, add_docs_pages
from service.fastpath import BestFastPath
from service.index import IndexHolder
from service.params import strict_query
from service.render import DATABASE_UNAVAILABLE
from service.routers import best, export, gpus, health, results
from service.schemas import ErrorOut, ValidationErrorOut

log = logging.getLogger(__name__)

# How often the background task checks the database for measurements written by others.
REFRESH_SECONDS = 60.0

DESCRIPTION = f"""\
Best FlashAttention-2 forward kernel configs measured by fa2tune, per GPU and shape.

* `GET /v1/best` — the fastest correct config for (GPU, D, N, dtype, causal), with timing
  and provenance; for an untuned N, the nearest tuned N (`exact: false`, `from_n`).
  With any of `nq`, `nk`, `batch`, `heads`, `kv_heads`, the answer is for that whole
  shape (query and key lengths, batch, query heads, key/value heads; `nq` defaults to
  `n`, `nk` to `nq`, `batch` to {DEFAULT_BATCH}, `heads` to {DEFAULT_HEADS}, `kv_heads` to
  `heads`), measured at it or at the nearest tuned shape (`shape`, `measured_problem`,
  `distance`). Give `n` or `nq`. `exact=true` refuses (404) any answer not measured at N
  or the shape itself.
* `GET /v1/gpus`, `GET /v1/results` — what the database holds.
* `GET /v1/export/header` — a self-contained CUDA header with the tuned kernels and a
  dispatch function.
* `POST /v1/results` — ingest a `fa2tune dump` file (bearer token).
"""


class Fa2TuneApp(FastAPI):
    """FastAPI with the ``/v1/best`` fast path wrapped around its whole middleware stack.

    The fast path needs none of FastAPI's middleware (error pages, telemetry, body limits:
    it reads no body and raises nothing it expects), and outside them it saves about a
    quarter of the server's CPU per request. Everything it passes on sees the normal stack,
    behind the admission of the slow endpoints (:class:`service.admission.SlowGate`).
    """

    fast_path_holder: IndexHolder | None = None

    def build_middleware_stack(self) -> ASGIApp:
        stack: ASGIApp = SlowGate(super().build_middleware_stack(), self.state.slow.admissions)
        if self.fast_path_holder is None:
            return stack
        return BestFastPath(stack, self.fast_path_holder)


def create_app(
    store: Store | None = None,
    *,
    load_shipped: bool | None = None,
    fast_path: bool = True,
    settings: Settings | None = None,
) -> FastAPI:
    """Build the application.

    Args:
        store: the results database; None opens (and migrates) ``settings.db_url``, and the
            app then closes it at shutdown.
        load_shipped: ingest the results shipped with the package at start-up; by default
            only for the configured database (an injected store is left as given).
        fast_path: answer plainly valid ``/v1/best`` requests in a pure-ASGI layer
            (:mod:`service.fastpath`); off, every request goes through the FastAPI route.
        settings: the limits of the slow endpoints (admission, render processes); None for
            :func:`core.settings.get_settings`.

    Returns:
        The app; its lifespan builds the best-config index and starts the render workers.
    """
    settings = settings or get_settings()
    owns_store = store is None
    if store is None:
        store = Store.from_url(settings.db_url)
    shipped = owns_store if load_shipped is None else load_shipped
    holder = IndexHolder(store)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        slow.renderer.start()  # the workers boot while the shipped results load
        if shipped:
            try:
                added = await run_in_threadpool(load_shipped_results, store)
                log.info("shipped results: %d measurements added", added)
            except Exception:
                # A bad bundled file must not keep the service down; what is there is served.
                log.exception("loading the shipped results failed")
        await run_in_threadpool(holder.refresh)
        await slow.renderer.ready()
        watcher = asyncio.create_task(
            _watch(holder, app.state.dbfile), name="fa2tune-index-refresh"
        )
        try:
            yield
        finally:
            watcher.cancel()
            with suppress(asyncio.CancelledError):
                await watcher
            slow.renderer.close()
            if owns_store:
                store.close()

    slow = SlowEndpoints.create(store, settings)
    app = Fa2TuneApp(
        title="fa2tune",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        dependencies=[Depends(strict_query)],
        # "/v1/results/" is a 404, not a redirect whose Location is built from the client's
        # Host header.
        redirect_slashes=False,
        # /docs and /redoc with assets the service serves itself (service.docs_pages).
        docs_url=None,
        redoc_url=None,
    )
    app.state.store = store
    app.state.dbfile = DatabaseFile(store.engine)
    app.state.index = holder
    app.state.slow = slow
    for module in (health, best, gpus, results, export):
        app.include_router(module.router)
    app.fast_path_holder = holder if fast_path else None
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    # Every database error (locked, gone, truncated: "file is not a database") is a JSON 503
    # without a traceback, not only the OperationalError family.
    app.add_exception_handler(SQLAlchemyError, _database_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]

    add_docs_pages(app)

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse(DOCS_PATH)

    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


async def _watch(holder: IndexHolder, dbfile: DatabaseFile) -> None:
    while True:
        await asyncio.sleep(REFRESH_SECONDS)
        try:
            state = dbfile.check()  # adopts a file put back at the path before the refresh
            if not state.ok:
                log.error("%s; writes are refused until a file is back", state.problem)
                continue
            if await run_in_threadpool(holder.refresh_if_changed):
                log.info("best-config index rebuilt: the database changed")
        except Exception:
            log.exception("refreshing the best-config index failed; keeping the old one")


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("query", "body", "path", "header"):
        parts = parts[1:]
    return ".".join(parts) or "request"


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 5]}...' ({len(str(value))} chars)"


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return repr(value)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 with one readable line per invalid input, e.g. ``d: must be one of ... (got 48)``."""
    messages: list[str] = []
    errors: list[dict[str, Any]] = []
    for err in exc.errors():
        field = _field(err.get("loc", ()))
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        line = f"{field}: {msg}"
        if err.get("type") != "missing" and "input" in err and "(got" not in msg:
            line += f" (got {_short(err['input'])})"
        messages.append(line)
        errors.append(
            {"loc": list(err.get("loc", ())), "msg": msg, "input": _json_safe(err.get("input"))}
        )
    return JSONResponse(
        status_code=status.HTTP_422_UNPROCESSABLE_CONTENT,
        content={"detail": "; ".join(messages) or "invalid request", "errors": errors},
    )


async def _http_error(request: Request, exc: StarletteHTTPException) -> Any:
    """FastAPI's handler, except that a 405's ``Allow`` lists what the OpenAPI document
    lists for the path.

    Starlette answers 405 from the first route whose path matches, so with ``GET`` and
    ``POST /v1/results`` as two routes, ``OPTIONS`` or ``PUT`` would be told ``Allow: GET``.
    """
    if exc.status_code == status.HTTP_405_METHOD_NOT_ALLOWED:
        paths: dict[str, dict[str, Any]] = request.app.openapi().get("paths", {})
        operations = paths.get(request.url.path)
        if operations:
            methods = sorted(m.upper() for m in operations if m.upper() in _HTTP_METHODS)
            exc.headers = {**(exc.headers or {}), "Allow": ", ".join(methods)}
    return await http_exception_handler(request, exc)


_HTTP_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"))


async def _database_error(request: Request, exc: Exception) -> JSONResponse:
    log.error("database error on %s %s: %s", request.method, request.url.path, exc)
    return JSONResponse(
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        content={"detail": DATABASE_UNAVAILABLE},
        headers={"Retry-After": "5"},
    )


def _openapi(app: FastAPI) -> dict[str, Any]:
    """The generated schema plus the results-file schema ``POST /v1/results`` reads.

    That endpoint reads its body itself (after the token check), so FastAPI does not know
    the model; its schema is added to the components here.
    """
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title,
            version=app.version,
            description=app.description,
            routes=app.routes,
        )
        dump = DumpFile.model_json_schema(ref_template="#/components/schemas/{model}")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name, definition in dump.pop("$defs", {}).items():
            components.setdefault(name, definition)
        components["DumpFile"] = dump
        # Routes that document JSON errors by reference (service.routers.json_error).
        for model in (ErrorOut, ValidationErrorOut):
            definition = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, sub in definition.pop("$defs", {}).items():
                components.setdefault(name, sub)
            components.setdefault(model.__name__, definition)
        app.openapi_schema = schema
    return app.openapi_schema
