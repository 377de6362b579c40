"""Packed variable-length problems: ``problems.seqlens``.

A varlen problem (a packed batch of sequences of different lengths) keeps its lengths,
comma-separated, in the new ``seqlens`` column; dense problems have ``""``. The identity
constraint is left as it is: rebuilding it would mean copying ``problems`` in SQLite, whose
ON DELETE CASCADE would empty ``measurements`` on the way (see 0002). A varlen row stores its
longest length in ``n``, its count in ``batch`` and its total in ``nk`` instead, which tells
apart every pair of length lists that differ in any of the three; the store refuses, with a
message, a list that agrees with a stored one on all three (db.writes).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("problems", sa.Column("seqlens", sa.Text(), nullable=False, server_default=""))


def downgrade() -> None:
    bind = op.get_bind()
    count = bind.execute(sa.text("SELECT COUNT(*) FROM problems WHERE seqlens != ''")).scalar()
    if count:
        raise RuntimeError(
            f"{count} varlen problems are stored: the schema before 0003 cannot hold them "
            "(delete them first)"
        )
    op.drop_column("problems", "seqlens")
