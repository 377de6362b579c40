"""FastAPI dependencies: the store, the best-config index, settings, the ingest token, and
the admission limits, renderer and response caches of the slow endpoints.

The dependencies are ``async`` on purpose: they only read ``app.state``, and sync
dependencies would each cost a thread-pool hop on the hot ``/v1/best`` path.
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from core.settings import Settings, get_settings
from db.store import Store
from service.admission import Admissions
from service.index import BestIndex, IndexHolder
from service.render import Renderer


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


class ByteLRU:
    """A thread-safe LRU of rendered response bodies, bounded by their total size.

    Args:
        max_bytes: the most the cached values may add up to; a larger value is not cached.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[Hashable, bytes] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> bytes | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: Hashable, value: bytes) -> None:
        if len(value) > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._size -= len(old)
            self._items[key] = value
            self._size += len(value)
            while self._size > self.max_bytes:
                _, evicted = self._items.popitem(last=False)
                self._size -= len(evicted)

    def __len__(self) -> int:
        return len(self._items)


#: Bytes each of the two response caches (headers, result pages) may hold.
CACHE_BYTES = 16 * 1024 * 1024


@dataclass
class SlowEndpoints:
    """What keeps the expensive endpoints from starving ``/v1/best``.

    * Admission (:mod:`service.admission`): per group (header export, result pages, ingest)
      a few requests inside the app at a time, from routing to the last byte sent, a bounded
      queue at the door, and a quick 429/503 with ``Retry-After`` past it.
    * Rendering (:mod:`service.render`): database reads and rendering of pages and headers
      run in worker processes, off the server's interpreter.
    * Rendered headers and result pages are cached, keyed by their parameters and the index
      generation (:attr:`service.index.IndexHolder.generation`), which changes whenever the
      store does.
    """

    admissions: Admissions
    renderer: Renderer
    headers: ByteLRU
    pages: ByteLRU

    @classmethod
    def create(cls, store: Store, settings: Settings) -> SlowEndpoints:
        return cls(
            admissions=Admissions(
                slots=settings.service_threads,
                queue=settings.service_queue,
                wait_s=settings.service_queue_wait_s,
            ),
            renderer=Renderer(store, settings.service_render_processes),
            headers=ByteLRU(CACHE_BYTES),
            pages=ByteLRU(CACHE_BYTES),
        )


async def get_slow_endpoints(request: Request) -> SlowEndpoints:
    """The app's :class:`SlowEndpoints`."""
    slow: SlowEndpoints = request.app.state.slow
    return slow


StoreDep = Annotated[Store, Depends(get_store)]
SlowDep = Annotated[SlowEndpoints, Depends(get_slow_endpoints)]
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
