"""The API's documentation pages, /docs (Swagger UI) and /redoc, with their JavaScript, CSS
and icon served by the service itself.

FastAPI's own pages load Swagger UI and ReDoc from a CDN, so on a machine without internet
access (a GPU node behind a firewall, where the service typically runs) they are blank. The
assets here come from the ``fastapi-offline`` package, which keeps current copies of both
(Swagger UI 5, which renders the OpenAPI 3.1 document FastAPI writes); only its files are
used, through FastAPI's documented page builders.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

#: Where the assets are mounted (outside /v1 and outside the OpenAPI document).
ASSETS_PATH = "/docs-assets"
DOCS_PATH = "/docs"
REDOC_PATH = "/redoc"
OAUTH2_REDIRECT_PATH = "/docs/oauth2-redirect"


def add_docs_pages(app: FastAPI) -> None:
    """Mount the assets and add /docs, its OAuth2 redirect and /redoc to ``app`` (built with
    ``docs_url=None, redoc_url=None``, so FastAPI adds no CDN pages of its own)."""
    static = files("fastapi_offline") / "static"
    app.mount(ASSETS_PATH, StaticFiles(directory=str(static)), name="docs-assets")
    title = f"{app.title} {app.version}"
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get(DOCS_PATH, include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{title}: API",
            swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_PATH}/favicon.png",
            oauth2_redirect_url=OAUTH2_REDIRECT_PATH,
            # No badge from the online validator (a request out of the machine).
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get(OAUTH2_REDIRECT_PATH, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(REDOC_PATH, include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{title}: API reference",
            redoc_js_url=f"{ASSETS_PATH}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS_PATH}/favicon.png",
            with_google_fonts=False,  # fonts from the internet too: the system's are used
        )
