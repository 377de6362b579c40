"""GPUs: ``gpus`` keeps the L2 cache size read from the device (``l2_bytes``).

Rows stored before read as 0: not read. The column only informs (a campaign logs the limits
it read; the service lists them); nothing is keyed by it. Adding a column with a default is an
ALTER TABLE in both SQLite and PostgreSQL, so no table is copied (see 0004 for why a copy of a
parent table needs care).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "gpus", sa.Column("l2_bytes", sa.BigInteger(), nullable=False, server_default="0")
    )


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite 3.35+, PostgreSQL): batch mode would copy the parent table.
    op.execute("ALTER TABLE gpus DROP COLUMN l2_bytes")
