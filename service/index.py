"""The in-memory index behind ``/v1/best``: winners per (GPU, D, dtype, causal), sorted by N.

Built from the store once at start-up and again after every ingest (and when a periodic
check sees new OK measurements from other writers), so a request is a dict lookup and a
bisect, never a scan of the measurements. Each entry keeps its response body pre-rendered;
only the requested ``n`` and ``exact`` are spliced in per request.

Requests for a whole shape (``nq``, ``nk``, ``batch``, ``heads``, ``kv_heads``) are answered
from a second table per key, every tuned shape with its winner (:meth:`Store.shape_winners`),
searched with :func:`core.shape.nearest_shape` as :meth:`Store.best_for_shape` does; a key
holds tens of shapes, so a linear scan is a few microseconds.
"""

from __future__ import annotations

import bisect
import json
import logging
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache

from core.gpu_name import normalize_gpu_name
from core.shape import (
    PHASE_RULE,
    Shape,
    effective_causal,
    nearest_shape,
    phase_of,
    shape_distance,
)
from db.results import BestResult
from db.store import Store
from service.header import tuned_results
from service.schemas import BestOut, ShapeOut, TunedSetOut

log = logging.getLogger(__name__)

Key = tuple[str, int, str, bool]  # (normalised GPU, D, dtype, causal)
Fingerprint = tuple[tuple[str, str, int, int], ...]


class NotTunedError(LookupError):
    """Nothing in the index answers the request; the message says what is there instead."""


@lru_cache(maxsize=4096)
def gpu_key(name: str) -> str:
    """:func:`core.gpu_name.normalize_gpu_name`, memoised: it runs on every request."""
    return normalize_gpu_name(name)


@dataclass(frozen=True)
class Entry:
    """The winner at one tuned N, with its response body minus ``n`` and ``exact``."""

    n: int
    result: BestResult
    body_tail: bytes  # the JSON object without its opening brace and the two per-request keys

    def body(self, n: int) -> bytes:
        """The ``/v1/best`` response body for a request for ``n``."""
        exact = b"true" if n == self.n else b"false"
        return b'{"n":%d,"exact":%s,%s' % (n, exact, self.body_tail)


def _entry(best: BestResult) -> Entry:
    rendered = BestOut.of(best, best.n).model_dump_json(exclude={"n", "exact"}).encode()
    return Entry(n=best.n, result=best, body_tail=rendered[1:])


@dataclass(frozen=True)
class Table:
    """The tuned Ns of one key, ascending, and their entries."""

    ns: list[int]
    entries: list[Entry]

    def nearest(self, n: int) -> Entry:
        """The entry at ``n``, else at the nearest N on a log scale (a tie goes to the larger).

        ``hi`` is at least as near as ``lo`` iff ``hi / n <= n / lo``, i.e. ``lo * hi <= n^2``:
        the boundary is the geometric midpoint, as in :meth:`db.store.Store.best_or_nearest`
        and the exported header's dispatch.
        """
        i = bisect.bisect_left(self.ns, n)
        if i == len(self.ns):
            return self.entries[-1]
        if self.ns[i] == n or i == 0:
            return self.entries[i]
        lo, hi = self.ns[i - 1], self.ns[i]
        return self.entries[i] if lo * hi <= n * n else self.entries[i - 1]


@dataclass(frozen=True)
class ShapeEntry:
    """The winner at one tuned shape, with its response body minus the per-request keys."""

    shape: Shape
    result: BestResult
    body_tail: bytes  # as Entry.body_tail

    def body(self, asked: Shape, distance: float) -> bytes:
        """The ``/v1/best`` response body for a request for the shape ``asked``."""
        exact = b"true" if asked == self.shape else b"false"
        shape = ShapeOut.of(asked).model_dump_json().encode()
        return b'{"n":%d,"exact":%s,"shape":%s,"distance":%s,%s' % (
            asked.nq,
            exact,
            shape,
            json.dumps(distance).encode(),
            self.body_tail,
        )


@dataclass(frozen=True)
class ShapeAnswer:
    """A shape request's answer: the asked shape, the entry that answers it, how far it is."""

    asked: Shape
    entry: ShapeEntry
    distance: float

    @property
    def exact(self) -> bool:
        return self.entry.shape == self.asked

    def body(self) -> bytes:
        return self.entry.body(self.asked, self.distance)


@dataclass(frozen=True)
class ShapeTable:
    """Every tuned shape of one key with its winner, and the SM count the distance uses."""

    sm_count: int
    entries: dict[Shape, ShapeEntry]
    # Sorted, so that shapes tied on every term of nearest_key go as in the store's query.
    shapes: list[Shape] = field(default_factory=list)

    @classmethod
    def of(cls, sm_count: int, entries: dict[Shape, ShapeEntry]) -> ShapeTable:
        return cls(sm_count=sm_count, entries=entries, shapes=sorted(entries))

    def nearest(self, asked: Shape) -> ShapeAnswer | None:
        """The entry at ``asked``, else at the nearest tuned shape of its phase
        (:func:`nearest_shape`); None when the key holds no shape of that phase."""
        hit = self.entries.get(asked)
        if hit is not None:
            return ShapeAnswer(asked=asked, entry=hit, distance=0.0)
        shape = nearest_shape(asked, self.shapes, self.sm_count)
        if shape is None:
            return None
        entry = self.entries[shape]
        return ShapeAnswer(asked, entry, shape_distance(asked, shape, self.sm_count))


@dataclass(frozen=True)
class GpuTuned:
    """A GPU's display name and what is tuned for it."""

    name: str
    tuned: dict[tuple[int, str, bool], list[int]] = field(default_factory=dict)

    def sets(self) -> list[TunedSetOut]:
        return [
            TunedSetOut(d=d, dtype=dtype, causal=causal, ns=ns)  # type: ignore[arg-type]
            for (d, dtype, causal), ns in sorted(self.tuned.items())
        ]


@dataclass(frozen=True)
class BestIndex:
    """An immutable snapshot; replaced as a whole on refresh, so readers need no lock."""

    tables: dict[Key, Table]
    gpus: dict[str, GpuTuned]
    built_at: datetime
    fingerprint: Fingerprint = ()
    shapes: dict[Key, ShapeTable] = field(default_factory=dict)

    @classmethod
    def build(cls, store: Store) -> BestIndex:
        """Read every winner from ``store`` (one pass over the OK measurements)."""
        fingerprint = _fingerprint(store)
        grouped: dict[Key, list[BestResult]] = {}
        names: dict[str, str] = {}
        for best in tuned_results(store):
            key = (gpu_key(best.gpu), best.d, best.dtype, best.causal)
            grouped.setdefault(key, []).append(best)
            names.setdefault(key[0], best.gpu)
        tables: dict[Key, Table] = {}
        gpus: dict[str, GpuTuned] = {k: GpuTuned(name=v) for k, v in names.items()}
        for key, results in grouped.items():
            results.sort(key=lambda b: b.n)
            tables[key] = Table(ns=[b.n for b in results], entries=[_entry(b) for b in results])
            gpus[key[0]].tuned[key[1:]] = tables[key].ns
        return cls(
            tables=tables,
            gpus=gpus,
            built_at=datetime.now(UTC),
            fingerprint=fingerprint,
            shapes=_shape_tables(store),
        )

    @property
    def tuned_problems(self) -> int:
        return sum(len(t.ns) for t in self.tables.values())

    def lookup(
        self, gpu: str, d: int, n: int, dtype: str, causal: bool, *, exact: bool = False
    ) -> Entry:
        """The winner for a request, exact or (unless ``exact``) at the nearest tuned N.

        Raises:
            NotTunedError: the GPU, its head dim, or the dtype/mask has no results; or, with
                ``exact``, N itself was not tuned.
        """
        key = gpu_key(gpu)
        table = self.tables.get((key, d, dtype, causal))
        if table is not None:
            entry = table.nearest(n)
            if exact and entry.n != n:
                mask = "causal" if causal else "full"
                raise NotTunedError(
                    f"N={n} not tuned for D={d} {dtype} {mask} on {entry.result.gpu} "
                    "(exact=true: no nearest-N fallback); tuned Ns: "
                    + ", ".join(map(str, table.ns))
                )
            return entry
        raise self._not_tuned(key, gpu, d, dtype, causal)

    def lookup_shape(
        self, gpu: str, d: int, dtype: str, causal: bool, shape: Shape, *, exact: bool = False
    ) -> ShapeAnswer:
        """The winner for a whole-shape request, exact or (unless ``exact``) at the nearest
        tuned shape; :meth:`db.store.Store.best_for_shape`'s answer, from memory.

        Raises:
            NotTunedError: as :meth:`lookup`; or, with ``exact``, the shape was not tuned.
        """
        key = gpu_key(gpu)
        causal = effective_causal(causal, shape.nq)  # one causal row: unmasked results
        table = self.shapes.get((key, d, dtype, causal))
        if table is None:
            raise self._not_tuned(key, gpu, d, dtype, causal)
        answer = table.nearest(shape)
        if answer is None:
            mask = "causal" if causal else "full"
            phase = phase_of(shape)
            other = "prefill" if phase == "decode" else "decode"
            raise NotTunedError(
                f"shape {shape.describe()}: no {phase} shape ({PHASE_RULE}) "
                f"tuned for D={d} {dtype} {mask} on {gpu}, only {other} shapes, which do not "
                f"answer {phase} calls"
            )
        if exact and not answer.exact:
            mask = "causal" if causal else "full"
            near = answer.entry.shape
            # The count and the nearest only: a key may hold many shapes.
            raise NotTunedError(
                f"shape {shape.describe()} not tuned for D={d} {dtype} {mask} on "
                f"{answer.entry.result.gpu} (exact=true: no nearest-shape fallback); "
                f"{len(table.entries)} tuned shapes, the nearest {near.describe()} "
                f"(distance {answer.distance:.3g})"
            )
        return answer

    def _not_tuned(self, key: str, gpu: str, d: int, dtype: str, causal: bool) -> NotTunedError:
        """Why nothing answers (GPU, D, dtype, causal), naming what is there instead."""
        tuned = self.gpus.get(key)
        if tuned is None:
            known = ", ".join(sorted(g.name for g in self.gpus.values())) or "none"
            return NotTunedError(f"no results for GPU {gpu!r}; GPUs with results: {known}")
        ds = sorted({k[0] for k in tuned.tuned})
        if d not in ds:
            return NotTunedError(
                f"no results for D={d} on {tuned.name}; tuned head dims: " + ", ".join(map(str, ds))
            )
        variants = sorted(
            f"{t} {'causal' if c else 'full'}" for (dd, t, c) in tuned.tuned if dd == d
        )
        mask = "causal" if causal else "full"
        return NotTunedError(
            f"no results for D={d} {dtype} {mask} on {tuned.name}; tuned for D={d}: "
            + ", ".join(variants)
        )


def _shape_tables(store: Store) -> dict[Key, ShapeTable]:
    """Every tuned shape's winner, grouped by key (:meth:`Store.shape_winners`)."""
    grouped: dict[Key, dict[Shape, ShapeEntry]] = {}
    sm_counts: dict[Key, int] = {}
    for best, sm_count in store.shape_winners():
        key = (gpu_key(best.gpu), best.d, best.dtype, best.causal)
        shape = Shape(best.n, best.nk, best.batch, best.heads, best.kv_heads)
        grouped.setdefault(key, {})[shape] = ShapeEntry(shape, best, _entry(best).body_tail)
        sm_counts[key] = sm_count
    return {key: ShapeTable.of(sm_counts[key], entries) for key, entries in grouped.items()}


def _fingerprint(store: Store) -> Fingerprint:
    """Cheap change detector: measurement counts per GPU, all and OK (one aggregate query).

    Failed measurements do not change the index, but they do change ``/v1/results``, whose
    cached pages are keyed by :attr:`IndexHolder.generation`.
    """
    return tuple(
        sorted(
            (g.name, g.compute_capability, g.measurements, g.ok_measurements) for g in store.gpus()
        )
    )


class IndexHolder:
    """Owns the current :class:`BestIndex` of a store and rebuilds it on demand.

    Args:
        store: the results database.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._index: BestIndex | None = None
        self._lock = threading.Lock()
        self._generation = 0

    @property
    def generation(self) -> int:
        """Bumped on every rebuild, i.e. whenever the store may have changed (an ingest
        through the service, or other writers seen by :meth:`refresh_if_changed`); caches
        of anything derived from the store key on it."""
        return self._generation

    @property
    def store(self) -> Store:
        return self._store

    def current(self) -> BestIndex:
        """The index, built on first use when the app's lifespan has not built it yet."""
        index = self._index
        return index if index is not None else self.refresh()

    def refresh(self) -> BestIndex:
        """Rebuild from the store and swap the new index in."""
        with self._lock:
            index = BestIndex.build(self._store)
            self._index = index
            self._generation += 1
        log.info(
            "best-config index: %d GPUs, %d tuned problems", len(index.gpus), index.tuned_problems
        )
        return index

    def refresh_if_changed(self) -> bool:
        """Rebuild when other writers (tuners, CLI ingests) added OK measurements.

        Returns:
            True when the index was rebuilt.
        """
        index = self._index
        if index is not None and _fingerprint(self._store) == index.fingerprint:
            return False
        self.refresh()
        return True
