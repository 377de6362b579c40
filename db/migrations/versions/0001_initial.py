"""Initial schema: gpus, builds, problems, measurements, ingested_files.

Revision ID: 0001
Revises:
Create Date: 2024-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gpus",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("name_key", sa.String(length=128), nullable=False),
        sa.Column("compute_capability", sa.String(length=16), nullable=False),
        sa.Column("sm_count", sa.Integer(), nullable=False),
        sa.Column("driver_version", sa.String(length=64), nullable=False),
        sa.Column("cuda_version", sa.String(length=64), nullable=False),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=False),
        sa.Column("smem_optin_bytes", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpus")),
        sa.UniqueConstraint("name_key", "compute_capability", name="uq_gpus_identity"),
    )
    op.create_table(
        "builds",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("config_key", sa.String(length=16), nullable=False),
        sa.Column("config_name", sa.String(length=128), nullable=False),
        sa.Column("d", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.String(length=8), nullable=False),
        sa.Column("causal", sa.Boolean(), nullable=False),
        sa.Column("br", sa.Integer(), nullable=False),
        sa.Column("bc", sa.Integer(), nullable=False),
        sa.Column("warps", sa.Integer(), nullable=False),
        sa.Column("stages", sa.Integer(), nullable=False),
        sa.Column("pad", sa.Integer(), nullable=False),
        sa.Column("swizzle", sa.Boolean(), nullable=False),
        sa.Column("arch", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=24), nullable=False),
        sa.Column("registers", sa.Integer(), nullable=True),
        sa.Column("spill_stores", sa.Integer(), nullable=False),
        sa.Column("spill_loads", sa.Integer(), nullable=False),
        sa.Column("stack_bytes", sa.Integer(), nullable=False),
        sa.Column("static_smem", sa.Integer(), nullable=False),
        sa.Column("compile_seconds", sa.Float(), nullable=False),
        sa.Column("source_hash", sa.String(length=64), nullable=False),
        sa.Column("nvcc_version", sa.String(length=256), nullable=False),
        sa.Column("flags", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_builds")),
        sa.UniqueConstraint("config_key", "arch", "source_hash", name="uq_builds_identity"),
    )
    op.create_table(
        "problems",
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
        sa.ForeignKeyConstraint(
            ["gpu_id"], ["gpus.id"], name=op.f("fk_problems_gpu_id_gpus"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_problems")),
        sa.UniqueConstraint(
            "gpu_id",
            "d",
            "n",
            "nk",
            "batch",
            "heads",
            "kv_heads",
            "dtype",
            "causal",
            name="uq_problems_identity",
        ),
    )
    op.create_table(
        "measurements",
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
            ["build_id"],
            ["builds.id"],
            name=op.f("fk_measurements_build_id_builds"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["problem_id"],
            ["problems.id"],
            name=op.f("fk_measurements_problem_id_problems"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_measurements")),
    )
    # "Best for a problem" is a range scan of this index, ordered by median.
    op.create_index("ix_measurements_best", "measurements", ["problem_id", "status", "median_ms"])
    op.create_index("ix_measurements_build_id", "measurements", ["build_id"])
    op.create_table(
        "ingested_files",
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("measurements_added", sa.Integer(), nullable=False),
        sa.Column("ingested_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("sha256", name=op.f("pk_ingested_files")),
    )


def downgrade() -> None:
    op.drop_table("ingested_files")
    op.drop_index("ix_measurements_build_id", table_name="measurements")
    op.drop_index("ix_measurements_best", table_name="measurements")
    op.drop_table("measurements")
    op.drop_table("problems")
    op.drop_table("builds")
    op.drop_table("gpus")
