"""Attention variants: ``problems`` keeps the variant a problem was tuned for.

New columns (every existing row reads as plain attention): ``window_left`` and
``window_right`` (-1: no bound), ``chunk`` (0: none), ``softcap_on`` and ``sinks`` (false),
and ``softcap``, the cap's value (0.0), kept for people only: the value changes no cost, so
the identity holds ``softcap_on`` (core.variant: a config built with the switch serves every
value). The identity constraint ``uq_problems_identity`` gains the five keyed columns, so a
windowed problem and the plain one of the same shape are two rows.

Rebuilding a constraint in SQLite means copying the table. Batch mode must not do it (see
0002: with foreign keys on, dropping ``problems`` empties ``measurements`` through ON DELETE
CASCADE, and the pragma cannot be switched off inside the migration's transaction). So the
copy is done by hand in an order that cascades nothing: new ``problems`` and ``measurements``
tables are made beside the old ones (the new measurements referring to the new problems), the
rows copied with their ids, the old child dropped before the old parent, and the new tables
renamed into place (SQLite rewrites the child's reference on the rename). PostgreSQL alters
the constraint in place.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_IDENTITY_0003 = ("gpu_id", "d", "n", "nk", "batch", "heads", "kv_heads", "dtype", "causal")
_VARIANT_KEY = ("window_left", "window_right", "chunk", "softcap_on", "sinks")
_IDENTITY_0004 = _IDENTITY_0003 + _VARIANT_KEY
_PROBLEM_COLUMNS_0003 = (
    "id", "gpu_id", "d", "n", "nk", "batch", "heads", "kv_heads", "dtype", "causal",
    "seqlens", "created_at",
)  # fmt: skip
_MEASUREMENT_COLUMNS = (
    "id", "problem_id", "build_id", "status", "median_ms", "p10_ms", "p90_ms", "reps",
    "tflops", "max_abs_err", "rel_err", "ref_err", "driver_registers", "driver_local_bytes",
    "error", "extra", "driver_version", "cuda_version", "sm_clock_mhz", "mem_clock_mhz",
    "trial_number", "created_at",
)  # fmt: skip


def _variant_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("window_left", sa.Integer(), nullable=False, server_default="-1"),
        sa.Column("window_right", sa.Integer(), nullable=False, server_default="-1"),
        sa.Column("chunk", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("softcap_on", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("softcap", sa.Float(), nullable=False, server_default="0"),
        sa.Column("sinks", sa.Boolean(), nullable=False, server_default=sa.false()),
    ]


def _problems_table(name: str, *, variant: bool) -> None:
    """``problems`` as 0003 left it, with the variant columns and identity when ``variant``."""
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
        *(_variant_columns() if variant else []),
        sa.ForeignKeyConstraint(
            ["gpu_id"], ["gpus.id"], name="fk_problems_gpu_id_gpus", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_problems"),
        sa.UniqueConstraint(
            *(_IDENTITY_0004 if variant else _IDENTITY_0003), name="uq_problems_identity"
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


def _rebuild_sqlite(*, variant: bool) -> None:
    """Copy ``problems`` (to the schema with or without the variant) and ``measurements``
    without a cascade on the way (see the module docstring)."""
    _problems_table("problems_new", variant=variant)
    _measurements_table("measurements_new", "problems_new")
    problem_columns = ", ".join(_PROBLEM_COLUMNS_0003 + (
        ("window_left", "window_right", "chunk", "softcap_on", "softcap", "sinks")
        if variant else ()
    ))  # fmt: skip
    if variant:  # the old table has no variant columns: every row is plain
        source = ", ".join(_PROBLEM_COLUMNS_0003) + ", -1, -1, 0, 0, 0.0, 0"
    else:
        source = ", ".join(_PROBLEM_COLUMNS_0003)
    op.execute(f"INSERT INTO problems_new ({problem_columns}) SELECT {source} FROM problems")
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
        _rebuild_sqlite(variant=True)
        return
    for column in _variant_columns():
        op.add_column("problems", column)
    op.drop_constraint("uq_problems_identity", "problems", type_="unique")
    op.create_unique_constraint("uq_problems_identity", "problems", list(_IDENTITY_0004))


def downgrade() -> None:
    bind = op.get_bind()
    count = bind.execute(
        sa.text(
            "SELECT COUNT(*) FROM problems WHERE window_left != -1 OR window_right != -1 "
            "OR chunk != 0 OR softcap_on OR sinks"
        )
    ).scalar()
    if count:
        raise RuntimeError(
            f"{count} problems of attention variants are stored: the schema before 0004 "
            "cannot hold them (delete them first)"
        )
    if bind.dialect.name == "sqlite":
        _rebuild_sqlite(variant=False)
        return
    op.drop_constraint("uq_problems_identity", "problems", type_="unique")
    op.create_unique_constraint("uq_problems_identity", "problems", list(_IDENTITY_0003))
    for column in _variant_columns():
        op.drop_column("problems", column.name)
