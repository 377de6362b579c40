"""FastAPI dependencies: the store, the best-config index, settings and the ingest token.

The dependencies are ``async`` on purpose: they only read ``app.state``, and sync
dependencies would each cost a thread-pool hop on the hot ``/v1/best`` path.
"""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from db.store import Store
from fa2tune.settings import Settings, get_settings
from service.index import BestIndex, IndexHolder


async def get_store(request: Request) -> Store:
    """The app's :class:`~db.store.Store`."""
    store: Store = request.app.state.store
    return store


async def get_index_holder(request: Request) -> IndexHolder:
    """The app's :class:`~service.index.IndexHolder` (for refreshing after writes)."""
    holder: IndexHolder = request.app.state.index
    return holder


async def get_index(holder: Annotated[IndexHolder, Depends(get_index_holder)]) -> BestIndex:
    """The current best-config index snapshot."""
    return holder.current()


async def get_app_settings() -> Settings:
    """Settings; a separate dependency so tests can override them."""
    return get_settings()


StoreDep = Annotated[Store, Depends(get_store)]
IndexHolderDep = Annotated[IndexHolder, Depends(get_index_holder)]
IndexDep = Annotated[BestIndex, Depends(get_index)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]

_bearer = HTTPBearer(
    auto_error=False,
    description="FA2TUNE_INGEST_TOKEN of the server; writes are refused when it is unset.",
)


async def require_ingest_token(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Allow a write only with ``Authorization: Bearer <FA2TUNE_INGEST_TOKEN>``.

    Raises:
        HTTPException: 403 when no token is configured (writes disabled) or the token is
            wrong; 401 when the request carries no bearer token.
    """
    expected = settings.ingest_token
    if not expected:  # unset or empty (compose passes "" when the variable is not set)
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "writes disabled: this server has no ingest token configured "
            "(set FA2TUNE_INGEST_TOKEN to enable POST /v1/results)",
        )
    if credentials is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing credentials: send 'Authorization: Bearer <ingest token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    # Constant-time comparison: the token must not leak through response timing.
    if not secrets.compare_digest(credentials.credentials.encode(), expected.encode()):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "invalid ingest token")


IngestAuth = Depends(require_ingest_token)
