"""SQLAlchemy 2.0 typed ORM models: GPUs, builds, problems, measurements and shipped files.

Identity choices:

* ``gpus``: one row per (normalised name, compute capability). Driver and CUDA versions change
  under a GPU's feet, so the row keeps the latest seen and every measurement keeps its own.
* ``builds``: one row per (config key, arch, source hash); the source hash already covers the
  template, flags and nvcc version, so a rebuild of the same thing is the same row. A build
  keeps its kernel family and that family's own parameters (``params``, JSON) next to the
  three every family has (d, dtype, causal); the config key is a hash of the config name,
  which starts with the family, so keys of different families never collide.
* ``problems``: one row per GPU, full shape, attention variant (window, chunk, whether a
  softcap and sinks apply: :meth:`core.variant.Variant.key_text`'s parts) and KV-cache layout
  (``kv_page``: -1 not a cache problem, 0 contiguous, P paged; migration 0006) and a cache
  problem's length pattern (``kv_lengths``: ``full`` or ``mixed``, :mod:`core.kv_lengths`;
  ``full`` for every problem that is not a cache problem; migration 0007); ``nk``,
  ``kv_heads``, ``kv_page`` and ``kv_lengths`` are stored resolved (never NULL) so the unique
  constraint works the same on SQLite and PostgreSQL, where NULLs are distinct.
* ``measurements``: append-only; the index on (problem, status, median) makes "best for a
  problem" an index range scan rather than a table scan.

Timestamps are stored as naive UTC and handed back timezone-aware (:class:`UtcDateTime`), so
SQLite (which has no time zones) and PostgreSQL behave alike.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

from core.variant import Variant

NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


#: The :class:`Build` columns that hold ptxas's report and the build's provenance, named alike
#: on a ``BuildReport``, a ``Build`` row and a dump's build record, so they are copied by name.
BUILD_REPORT_COLUMNS: tuple[str, ...] = (
    "registers", "spill_stores", "spill_loads", "stack_bytes", "static_smem",
    "compile_seconds", "source_hash", "nvcc_version", "error",
)  # fmt: skip


def build_report_values(source: object) -> dict[str, Any]:
    """:data:`BUILD_REPORT_COLUMNS` read from ``source`` (a report, row or record) by name."""
    return {name: getattr(source, name) for name in BUILD_REPORT_COLUMNS}


#: The :class:`Problem` columns of its attention variant that are part of its identity.
VARIANT_KEY_COLUMNS: tuple[str, ...] = (
    "window_left", "window_right", "chunk", "softcap_on", "sinks",
)  # fmt: skip


def variant_values(variant: Variant) -> dict[str, Any]:
    """A variant as the :class:`Problem` columns hold it (the key columns and the cap)."""
    return {
        "window_left": variant.window_left,
        "window_right": variant.window_right,
        "chunk": variant.chunk,
        "softcap_on": variant.softcap > 0,
        "softcap": variant.softcap,
        "sinks": variant.sinks,
    }


def row_variant(row: Any) -> Variant:
    """The variant a problem row (or any object with its columns) stores. A row marked
    ``softcap_on`` whose value was lost (0, written by hand) reads as cap 1.0, so the variant
    keeps its switch."""
    cap = float(row.softcap) if row.softcap_on else 0.0
    if row.softcap_on and not cap > 0:
        cap = 1.0
    return Variant(int(row.window_left), int(row.window_right), int(row.chunk), cap,
                   bool(row.sinks))  # fmt: skip


#: ``problems.kv_page`` of a problem that is not a KV-cache problem (rows before 0006 too).
NO_KV_PAGE = -1


def kv_page_value(page: int | None) -> int:
    """A problem's KV-cache layout (:attr:`core.problem.Problem.kv_page`) as the column holds
    it: :data:`NO_KV_PAGE` for None."""
    return NO_KV_PAGE if page is None else page


def row_kv_page(row: Any) -> int | None:
    """The KV-cache layout a problem row (or any object with its ``kv_page``) stores."""
    page = int(row.kv_page)
    return None if page == NO_KV_PAGE else page


#: ``problems.kv_lengths`` of a problem timed with every sequence at the capacity: every dense
#: problem and every cache problem stored before 0007.
FULL_KV_LENGTHS = "full"


def build_kv_page(params: dict[str, Any]) -> int | None:
    """The KV-cache layout a build reads (:func:`core.problem.kv_page_of`) from its stored
    parameters, where cache parameters at their defaults are left out (``config.params()``)."""
    if not params.get("kvcache", False):
        return None
    return int(params.get("page", 0))


class UtcDateTime(TypeDecorator[datetime]):
    """A timestamp stored as naive UTC and returned as timezone-aware UTC.

    Naive datetimes given to the database are taken to be UTC already.
    """

    impl = DateTime(timezone=False)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base with a naming convention so migrations name constraints stably."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {  # noqa: RUF012 - SQLAlchemy reads this class attribute as is
        datetime: UtcDateTime(),
        float: Float(),
        dict[str, Any]: JSON(),
        list[str]: JSON(),
    }


class Gpu(Base):
    """A GPU model; the latest seen driver/CUDA versions are kept for display only."""

    __tablename__ = "gpus"
    __table_args__ = (UniqueConstraint("name_key", "compute_capability", name="uq_gpus_identity"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128))  # as the driver reports it
    name_key: Mapped[str] = mapped_column(String(128))  # normalize_gpu_name(name)
    compute_capability: Mapped[str] = mapped_column(String(16))
    sm_count: Mapped[int]
    driver_version: Mapped[str] = mapped_column(String(64))
    cuda_version: Mapped[str] = mapped_column(String(64))
    memory_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    smem_optin_bytes: Mapped[int] = mapped_column(default=0)
    l2_bytes: Mapped[int] = mapped_column(BigInteger, default=0)  # 0: not read (migration 0005)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    problems: Mapped[list[Problem]] = relationship(back_populates="gpu")


class Build(Base):
    """One kernel config compiled for one architecture, with ptxas's resource report."""

    __tablename__ = "builds"
    __table_args__ = (
        UniqueConstraint("config_key", "arch", "source_hash", name="uq_builds_identity"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    config_key: Mapped[str] = mapped_column(String(16))
    config_name: Mapped[str] = mapped_column(String(128))
    family: Mapped[str] = mapped_column(String(16))
    d: Mapped[int]
    dtype: Mapped[str] = mapped_column(String(8))
    causal: Mapped[bool]
    params: Mapped[dict[str, Any]]  # the family's own compile-time parameters
    arch: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(24))
    registers: Mapped[int | None]
    spill_stores: Mapped[int]
    spill_loads: Mapped[int]
    stack_bytes: Mapped[int]
    static_smem: Mapped[int]
    compile_seconds: Mapped[float]
    source_hash: Mapped[str] = mapped_column(String(64))
    nvcc_version: Mapped[str] = mapped_column(String(256))
    flags: Mapped[list[str]]
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Problem(Base):
    """An attention shape on one GPU; ``nk`` and ``kv_heads`` are stored resolved."""

    __tablename__ = "problems"
    __table_args__ = (
        UniqueConstraint(
            "gpu_id",
            "d",
            "n",
            "nk",
            "batch",
            "heads",
            "kv_heads",
            "dtype",
            "causal",
            "window_left",
            "window_right",
            "chunk",
            "softcap_on",
            "sinks",
            "kv_page",
            "kv_lengths",
            name="uq_problems_identity",
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id", ondelete="CASCADE"))
    d: Mapped[int]
    n: Mapped[int]
    nk: Mapped[int]
    batch: Mapped[int]
    heads: Mapped[int]
    kv_heads: Mapped[int]
    dtype: Mapped[str] = mapped_column(String(8))
    causal: Mapped[bool]
    # A packed variable-length batch: its lengths, comma-separated ("" for a dense problem).
    # Such a row keeps the longest length in n, the count in batch and the total in nk, so
    # that the identity above tells most length lists apart (see db.writes).
    seqlens: Mapped[str] = mapped_column(Text, default="", server_default="")
    # The attention variant (core.variant; the defaults: plain). The identity holds whether a
    # softcap applies, not its value, which changes no cost; the value is kept for people.
    window_left: Mapped[int] = mapped_column(default=-1, server_default="-1")
    window_right: Mapped[int] = mapped_column(default=-1, server_default="-1")
    chunk: Mapped[int] = mapped_column(default=0, server_default="0")
    softcap_on: Mapped[bool] = mapped_column(default=False, server_default=false())
    softcap: Mapped[float] = mapped_column(default=0.0, server_default="0")
    sinks: Mapped[bool] = mapped_column(default=False, server_default=false())
    # The KV-cache layout (core.problem.Problem.kv_page): NO_KV_PAGE (-1) for a problem that is
    # not a cache problem, 0 a contiguous cache, P a paged cache of P-token pages.
    kv_page: Mapped[int] = mapped_column(default=NO_KV_PAGE, server_default=str(NO_KV_PAGE))
    # A cache problem's length pattern (core.problem.Problem.kv_lengths): FULL_KV_LENGTHS for
    # every sequence at the capacity (and for every problem that is not a cache problem),
    # "mixed" for the seeded spread of core.kv_lengths.
    kv_lengths: Mapped[str] = mapped_column(
        String(8), default=FULL_KV_LENGTHS, server_default=FULL_KV_LENGTHS
    )
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    gpu: Mapped[Gpu] = relationship(back_populates="problems")

    @property
    def is_varlen(self) -> bool:
        return self.seqlens != ""

    @property
    def local(self) -> bool:
        """Whether the problem's keys are masked by a window or a chunk."""
        return self.window_left >= 0 or self.window_right >= 0 or self.chunk > 0


class Measurement(Base):
    """One (build, problem) timing or failure, with the device provenance at that moment."""

    __tablename__ = "measurements"
    __table_args__ = (
        Index("ix_measurements_best", "problem_id", "status", "median_ms"),
        Index("ix_measurements_build_id", "build_id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id", ondelete="CASCADE"))
    build_id: Mapped[int] = mapped_column(ForeignKey("builds.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(24))
    median_ms: Mapped[float | None]
    p10_ms: Mapped[float | None]
    p90_ms: Mapped[float | None]
    reps: Mapped[int] = mapped_column(default=0)
    tflops: Mapped[float | None]
    max_abs_err: Mapped[float | None]
    rel_err: Mapped[float | None]
    ref_err: Mapped[float | None]
    driver_registers: Mapped[int | None]
    driver_local_bytes: Mapped[int | None]
    error: Mapped[str | None] = mapped_column(Text)
    extra: Mapped[dict[str, Any] | None]
    driver_version: Mapped[str] = mapped_column(String(64))
    cuda_version: Mapped[str] = mapped_column(String(64))
    sm_clock_mhz: Mapped[int | None]
    mem_clock_mhz: Mapped[int | None]
    trial_number: Mapped[int | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    problem: Mapped[Problem] = relationship()
    build: Mapped[Build] = relationship()


class IngestedFile(Base):
    """A results file already ingested (by content hash), so start-up loads are cheap."""

    __tablename__ = "ingested_files"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    measurements_added: Mapped[int]
    ingested_at: Mapped[datetime] = mapped_column(default=utcnow)
