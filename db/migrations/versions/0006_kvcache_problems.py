"""KV-cache problems: ``problems`` keeps the cache layout a problem was tuned for.

A new keyed column, ``kv_page``: -1 for a problem that is not a KV-cache problem (every
existing row), 0 for a contiguous cache read with each sequence's length on the device (the
split-KV ``_kvc`` kernels), P for a paged cache of P-token pages (``_kvc_pg<P>``). The
identity constraint ``uq_problems_identity`` gains it, so the cache problem of a shape and the
dense one are two rows, as are two page sizes.

As in 0004 (whose module docstring says why): SQLite copies ``problems`` and ``measurements``
by hand in an order that cascades nothing, keeping every id; PostgreSQL alters the constraint
in place.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_IDENTITY_0004 = (
    "gpu_id", "d", "n", "nk", "batch", "heads", "kv_heads", "dtype", "causal",
    "window_left", "window_right", "chunk", "softcap_on", "sinks",
)  # fmt: skip
_IDENTITY_0006 = (*_IDENTITY_0004, "kv_page")
_PROBLEM_COLUMNS_0004 = (
    "id", "gpu_id", "d", "n", "nk", "batch", "heads", "kv_heads", "dtype", "causal",
    "seqlens", "created_at", "window_left", "window_right", "chunk", "softcap_on", "softcap",
    "sinks",
)  # fmt: skip
_MEASUREMENT_COLUMNS = (
    "id", "problem_id", "build_id", "status", "median_ms", "p10_ms", "p90_ms", "reps",
    "tflops", "max_abs_err", "rel_err", "ref_err", "driver_registers", "driver_local_bytes",
    "error", "extra", "driver_version", "cuda_version", "sm_clock_mhz", "mem_clock_mhz",
    "trial_number", "created_at",
)  # fmt: skip
#: The value of a problem that is not a KV-cache problem (db.models.NO_KV_PAGE).
_NO_KV_PAGE = -1


def _kv_page_column() -> sa.Column[int]:
    return sa.Column("kv_page", sa.Integer(), nullable=False, server_default=str(_NO_KV_PAGE))


def _problems_table(name: str, *, cache: bool) -> None:
    """``problems`` as 0004 left it, with ``kv_page`` and its identity when ``cache``."""
    op.create_table(
        name,
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("d", sa.Integer(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("nk", sa.Integer(), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("heads", sa.Integer(), nullable=False),
        sa.Column("kv_heads", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.String(length=8), nullable=False),
        sa.Column("causal", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("seqlens", sa.Text(), nullable=False, server_default=""),
        sa.Column("window_left", sa.Integer(), nullable=False, server_default="-1"),
        sa.Column("window_right", sa.Integer(), nullable=False, server_default="-1"),
        sa.Column("chunk", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("softcap_on", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("softcap", sa.Float(), nullable=False, server_default="0"),
        sa.Column("sinks", sa.Boolean(), nullable=False, server_default=sa.false()),
        *([_kv_page_column()] if cache else []),
        sa.ForeignKeyConstraint(
            ["gpu_id"], ["gpus.id"], name="fk_problems_gpu_id_gpus", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_problems"),
        sa.UniqueConstraint(
            *(_IDENTITY_0006 if cache else _IDENTITY_0004), name="uq_problems_identity"
        ),
    )


def _measurements_table(name: str, problems: str) -> None:
    """``measurements`` as 0001 made it, referring to the problems table ``problems``."""
    op.create_table(
        name,
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("problem_id", sa.Integer(), nullable=False),
        sa.Column("build_id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=24), nullable=False),
        sa.Column("median_ms", sa.Float(), nullable=True),
        sa.Column("p10_ms", sa.Float(), nullable=True),
        sa.Column("p90_ms", sa.Float(), nullable=True),
        sa.Column("reps", sa.Integer(), nullable=False),
        sa.Column("tflops", sa.Float(), nullable=True),
        sa.Column("max_abs_err", sa.Float(), nullable=True),
        sa.Column("rel_err", sa.Float(), nullable=True),
        sa.Column("ref_err", sa.Float(), nullable=True),
        sa.Column("driver_registers", sa.Integer(), nullable=True),
        sa.Column("driver_local_bytes", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("extra", sa.JSON(), nullable=True),
        sa.Column("driver_version", sa.String(length=64), nullable=False),
        sa.Column("cuda_version", sa.String(length=64), nullable=False),
        sa.Column("sm_clock_mhz", sa.Integer(), nullable=True),
        sa.Column("mem_clock_mhz", sa.Integer(), nullable=True),
        sa.Column("trial_number", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["build_id"], ["builds.id"], name="fk_measurements_build_id_builds",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["problem_id"], [f"{problems}.id"], name="fk_measurements_problem_id_problems",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_measurements"),
    )  # fmt: skip


def _rebuild_sqlite(*, cache: bool) -> None:
    """Copy ``problems`` (to the schema with or without ``kv_page``) and ``measurements``
    without a cascade on the way (0004's order)."""
    _problems_table("problems_new", cache=cache)
    _measurements_table("measurements_new", "problems_new")
    columns = ", ".join(_PROBLEM_COLUMNS_0004 + (("kv_page",) if cache else ()))
    # The old table has no kv_page: every row is not a cache problem.
    source = ", ".join(_PROBLEM_COLUMNS_0004) + (f", {_NO_KV_PAGE}" if cache else "")
    op.execute(f"INSERT INTO problems_new ({columns}) SELECT {source} FROM problems")
    measurement_columns = ", ".join(_MEASUREMENT_COLUMNS)
    op.execute(
        f"INSERT INTO measurements_new ({measurement_columns}) "
        f"SELECT {measurement_columns} FROM measurements"
    )
    op.drop_index("ix_measurements_best", table_name="measurements")
    op.drop_index("ix_measurements_build_id", table_name="measurements")
    op.execute("DROP TABLE measurements")  # the child first: nothing refers to it
    op.execute("DROP TABLE problems")  # no child refers to it any more
    op.execute("ALTER TABLE problems_new RENAME TO problems")  # rewrites the new child's FK
    op.execute("ALTER TABLE measurements_new RENAME TO measurements")
    op.create_index("ix_measurements_best", "measurements", ["problem_id", "status", "median_ms"])
    op.create_index("ix_measurements_build_id", "measurements", ["build_id"])


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_sqlite(cache=True)
        return
    op.add_column("problems", _kv_page_column())
    op.drop_constraint("uq_problems_identity", "problems", type_="unique")
    op.create_unique_constraint("uq_problems_identity", "problems", list(_IDENTITY_0006))


def downgrade() -> None:
    bind = op.get_bind()
    count = bind.execute(
        sa.text(f"SELECT COUNT(*) FROM problems WHERE kv_page != {_NO_KV_PAGE}")
    ).scalar()
    if count:
        raise RuntimeError(
            f"{count} KV-cache problems are stored: the schema before 0006 cannot hold them "
            "(delete them first)"
        )
    if bind.dialect.name == "sqlite":
        _rebuild_sqlite(cache=False)
        return
    op.drop_constraint("uq_problems_identity", "problems", type_="unique")
    op.create_unique_constraint("uq_problems_identity", "problems", list(_IDENTITY_0004))
    op.drop_column("problems", "kv_page")
