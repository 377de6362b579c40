"""The store's answers as plain values: what a read of the results database returns.

Holds :class:`BestResult` (``best``/``best_or_nearest``/``best_for_shape``),
:class:`GpuSummary` (``gpus``), :class:`ResultRow` and :class:`ResultPage` (``results``, at
most :data:`MAX_PAGE` rows a page) and :class:`StoredOutcome` (``outcome``).

Contract: frozen values detached from any session (safe to keep after the session closes, to
pickle, to hand to another thread); ``to_dict`` gives JSON-ready dicts (datetimes as ISO 8601,
configs nested). This module runs no SQL and imports neither SQLAlchemy nor :mod:`db.models`;
the queries that build these values are in :mod:`db.queries`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any, NamedTuple

from core.family import AnyConfig
from core.problem import VARIANT_FIELDS
from core.variant import PLAIN, Variant

MAX_PAGE = 1000
"""The most rows one :class:`ResultPage` holds (the ``limit`` a results query accepts)."""


@dataclass(frozen=True)
class BestResult:
    """The fastest correct config for a problem, with its build and measurement provenance.

    Attributes:
        config: the winning kernel configuration (of its family).
        config_key: its stable key.
        gpu: GPU name as the driver reports it (e.g. ``"NVIDIA H200"``).
        compute_capability: e.g. ``"9.0"``.
        d, n, nk, batch, heads, kv_heads, dtype, causal: the problem it was measured on.
        exact: True when the problem's N (for ``best_for_shape``: its whole shape) is the
            one asked for.
        from_n: the N the result was measured at (== n; differs from the request when
            ``exact`` is False).
        distance: :func:`core.shape.shape_distance` from the asked shape to the measured one
            (0.0 when ``exact``); for the per-N lookups the asked shape is N x N at the
            measured problem's batch and heads.
        median_ms, p10_ms, p90_ms: kernel time per launch, milliseconds.
        tflops: throughput of this median on the measured problem (derived, not the stored figure).
        max_abs_err, rel_err: accuracy against the float32 reference.
        arch, registers, spill_stores, spill_loads, stack_bytes, static_smem, source_hash,
            nvcc_version: the build.
        driver_version, cuda_version, sm_clock_mhz, mem_clock_mhz: device state when measured.
        measured_at: when the measurement was taken (UTC).
        measurement_id, build_id, problem_id: database ids (local to this database).
        variant: the attention variant of the problem it was measured on (plain unless the
            lookup asked for a variant: :func:`db.queries.best_match`).
        kv_page: the KV-cache layout of that problem (None: dense, unless the lookup asked for
            a cache layout).
        kv_lengths: the length pattern that problem was timed on
            (:attr:`core.problem.Problem.kv_lengths`: ``full`` unless the lookup asked for
            ``mixed``, or the result is a cache winner of a mixed problem).
    """

    config: AnyConfig
    config_key: str
    gpu: str
    compute_capability: str
    d: int
    n: int
    nk: int
    batch: int
    heads: int
    kv_heads: int
    dtype: str
    causal: bool
    exact: bool
    from_n: int
    median_ms: float
    p10_ms: float | None
    p90_ms: float | None
    tflops: float | None
    max_abs_err: float | None
    rel_err: float | None
    arch: str
    registers: int | None
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    static_smem: int
    source_hash: str
    nvcc_version: str
    driver_version: str
    cuda_version: str
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    measured_at: datetime
    measurement_id: int
    build_id: int
    problem_id: int
    # Last and defaulted: results built before shapes were asked for stay constructible.
    distance: float = 0.0
    variant: Variant = PLAIN
    kv_page: int | None = None
    kv_lengths: str = "full"

    @property
    def config_name(self) -> str:
        return self.config.name

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (config nested, ``measured_at`` ISO 8601, the variant's fields
        flat and only when it is not plain, ``kv_page`` only when set, ``kv_lengths`` only when
        not ``full``, so plain dense answers and full cache ones read as they always did)."""
        data = asdict(self)
        data["config"] = {"family": self.config.family, **self.config.to_dict()}
        data["config_name"] = self.config.name
        data["measured_at"] = self.measured_at.isoformat()
        _flat_variant(data, self.variant)
        _drop_cache_defaults(data)
        return data


def _flat_variant(data: dict[str, Any], variant: Variant) -> None:
    """Replace ``data["variant"]`` by the variant's fields, flat, when it is not plain."""
    del data["variant"]
    if not variant.plain:
        data.update({name: getattr(variant, name) for name in VARIANT_FIELDS})


def _drop_cache_defaults(data: dict[str, Any]) -> None:
    """Leave out a dense answer's ``kv_page`` and a ``full`` one's ``kv_lengths`` (the
    defaults), so answers of problems stored before them read as they did."""
    if data.get("kv_page") is None:
        data.pop("kv_page", None)
    if data.get("kv_lengths") == "full":
        data.pop("kv_lengths", None)


@dataclass(frozen=True)
class GpuSummary:
    """A GPU known to the database, with how many measurements it has."""

    name: str
    compute_capability: str
    sm_count: int
    driver_version: str
    cuda_version: str
    memory_bytes: int
    smem_optin_bytes: int
    l2_bytes: int
    measurements: int
    ok_measurements: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ResultRow:
    """One measurement with its problem, GPU and build, flattened for listing."""

    measurement_id: int
    gpu: str
    compute_capability: str
    d: int
    n: int
    nk: int
    batch: int
    heads: int
    kv_heads: int
    dtype: str
    causal: bool
    config_name: str
    family: str
    config_key: str
    arch: str
    source_hash: str
    registers: int | None
    spill_stores: int
    spill_loads: int
    status: str
    median_ms: float | None
    p10_ms: float | None
    p90_ms: float | None
    tflops: float | None
    max_abs_err: float | None
    rel_err: float | None
    error: str | None
    trial_number: int | None
    driver_version: str
    cuda_version: str
    measured_at: datetime
    variant: Variant = PLAIN  # the problem's attention variant
    kv_page: int | None = None  # the problem's KV-cache layout (None: dense)
    kv_lengths: str = "full"  # the length pattern a cache problem was timed on

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; the variant's fields flat and only when it is not plain,
        ``kv_page`` only when set, ``kv_lengths`` only when not ``full``."""
        # Shallow: every field but the variant is a scalar, and asdict's deep copies were half
        # the cost of a page of 1000 rows.
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["measured_at"] = self.measured_at.isoformat()
        _flat_variant(data, self.variant)
        _drop_cache_defaults(data)
        return data


@dataclass(frozen=True)
class ResultPage:
    """A page of :class:`ResultRow` plus the total count of matching rows."""

    total: int
    offset: int
    limit: int
    items: list[ResultRow]

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "offset": self.offset,
            "limit": self.limit,
            "items": [row.to_dict() for row in self.items],
        }


class StoredOutcome(NamedTuple):
    """What the store says one config did on one problem (:meth:`db.store.Store.outcome`)."""

    status: str
    median_ms: float | None
