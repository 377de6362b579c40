"""A small least-recently-used map, for the GPU handler's loaded kernels and input sets."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Lru(Generic[K, V]):
    """A small least-recently-used map calling ``on_evict`` for dropped values."""

    def __init__(self, capacity: int, on_evict: Callable[[V], None] | None = None) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._on_evict = on_evict
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        old = self._items.pop(key, None)
        if old is not None and old is not value and self._on_evict is not None:
            self._on_evict(old)
        self._items[key] = value
        while len(self._items) > self.capacity:
            _, dropped = self._items.popitem(last=False)
            if self._on_evict is not None:
                self._on_evict(dropped)

    def clear(self) -> None:
        while self._items:
            _, dropped = self._items.popitem(last=False)
            if self._on_evict is not None:
                self._on_evict(dropped)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items
