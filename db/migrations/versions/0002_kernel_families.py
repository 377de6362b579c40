"""Kernel families: builds keep their family and the family's own parameters.

The mma.sync template's six columns (br, bc, warps, stages, pad, swizzle) become one JSON
``params`` object next to a ``family`` column, so builds of other families (other parameters)
share the table. Every existing build is family ``fa2``; its parameters are copied into
``params`` before the columns go, so nothing is lost, and the downgrade copies them back
(it refuses while builds of another family exist: the old schema cannot hold them).

The same revision recomputes ``gpus.name_key`` under the one GPU-name rule the store, the
service and the exported header now share (core.gpu_name: punctuation counts as a
separator, so "NVIDIA-H200" is found as "H200" too; "NVIDIA H200" keeps its key "h200").
Where two rows would fall on one key (the same GPU stored under two spellings), both keep
their old keys and a warning names them: merging their problems is a decision for a person.

SQLite: batch mode (copy the table, drop the old one) must not be used here: with foreign
keys on, dropping ``builds`` deletes every measurement through ON DELETE CASCADE, and the
pragma cannot be switched off inside the migration's transaction. So columns are added with a
default and dropped with ``ALTER TABLE ... DROP COLUMN`` (SQLite 3.35+), which touch no row.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

from core.gpu_name import normalize_gpu_name

logger = logging.getLogger("alembic.runtime.migration")

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The fa2 family's parameters, in its config's field order (core.config.Fa2Config).
FA2_COLUMNS: tuple[tuple[str, type[sa.types.TypeEngine[Any]]], ...] = (
    ("br", sa.Integer),
    ("bc", sa.Integer),
    ("warps", sa.Integer),
    ("stages", sa.Integer),
    ("pad", sa.Integer),
    ("swizzle", sa.Boolean),
)
_BATCH = 1000


def _is_sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"


def _require_drop_column() -> None:
    if _is_sqlite() and sqlite3.sqlite_version_info < (3, 35, 0):
        raise RuntimeError(
            f"this migration needs SQLite 3.35 or newer (ALTER TABLE DROP COLUMN); "
            f"Python's sqlite3 module has {sqlite3.sqlite_version}"
        )


def _drop_column(table: str, column: str) -> None:
    if _is_sqlite():
        op.execute(sa.text(f'ALTER TABLE "{table}" DROP COLUMN "{column}"'))
    else:
        op.drop_column(table, column)


def _rekey_gpus() -> None:
    gpus = sa.table(
        "gpus",
        sa.column("id", sa.Integer),
        sa.column("name", sa.String),
        sa.column("name_key", sa.String),
        sa.column("compute_capability", sa.String),
    )
    bind = op.get_bind()
    rows = bind.execute(sa.select(gpus)).all()
    wanted: dict[tuple[str, str], list[int]] = {}
    for row in rows:
        wanted.setdefault((normalize_gpu_name(row.name), row.compute_capability), []).append(row.id)
    final: dict[int, str] = {}
    for (key, cc), ids in wanted.items():
        if len(ids) > 1:
            logger.warning(
                "gpus %s would share the name key %r (cc %s); their keys are left as they were",
                ids, key, cc,
            )  # fmt: skip
            continue
        final[ids[0]] = key
    # Two passes, so that no row takes a key another row still holds until its own update.
    old = {row.id: row.name_key for row in rows}
    changed = {gpu_id: key for gpu_id, key in final.items() if old[gpu_id] != key}
    for gpu_id in changed:
        bind.execute(sa.update(gpus).where(gpus.c.id == gpu_id).values(name_key=f"#{gpu_id}"))
    for gpu_id, key in changed.items():
        bind.execute(sa.update(gpus).where(gpus.c.id == gpu_id).values(name_key=key))


def upgrade() -> None:
    _require_drop_column()
    _rekey_gpus()
    op.add_column(
        "builds", sa.Column("family", sa.String(16), nullable=False, server_default="fa2")
    )
    op.add_column("builds", sa.Column("params", sa.JSON(), nullable=False, server_default="{}"))
    builds = sa.table(
        "builds",
        sa.column("id", sa.Integer),
        sa.column("params", sa.JSON),
        *(sa.column(name, kind) for name, kind in FA2_COLUMNS),
    )
    bind = op.get_bind()
    rows = bind.execute(sa.select(builds.c.id, *(builds.c[n] for n, _ in FA2_COLUMNS))).all()
    update = (
        sa.update(builds)
        .where(builds.c.id == sa.bindparam("build_id"))
        .values(params=sa.bindparam("new_params", type_=sa.JSON))
    )
    for start in range(0, len(rows), _BATCH):
        chunk = rows[start : start + _BATCH]
        bind.execute(
            update,
            [
                {
                    "build_id": row.id,
                    "new_params": {
                        name: (bool(row[name]) if kind is sa.Boolean else int(row[name]))
                        for name, kind in FA2_COLUMNS
                    },
                }
                for row in (r._mapping for r in chunk)
            ],
        )
    for name, _ in FA2_COLUMNS:
        _drop_column("builds", name)
    if not _is_sqlite():  # SQLite cannot drop a default without copying the table
        op.alter_column("builds", "family", server_default=None)
        op.alter_column("builds", "params", server_default=None)


def downgrade() -> None:
    _require_drop_column()
    bind = op.get_bind()
    builds = sa.table(
        "builds",
        sa.column("id", sa.Integer),
        sa.column("family", sa.String),
        sa.column("params", sa.JSON),
        *(sa.column(name, kind) for name, kind in FA2_COLUMNS),
    )
    others = bind.execute(
        sa.select(sa.func.count()).select_from(builds).where(builds.c.family != "fa2")
    ).scalar_one()
    if others:
        raise RuntimeError(
            f"cannot downgrade below 0002: {others} build(s) of kernel families other than "
            "fa2 exist, and the 0001 schema has no place for them; delete them first"
        )
    for name, kind in FA2_COLUMNS:
        default = sa.text("0" if kind is sa.Integer else "false")
        op.add_column("builds", sa.Column(name, kind(), nullable=False, server_default=default))
    rows = bind.execute(sa.select(builds.c.id, builds.c.params)).all()
    update = (
        sa.update(builds)
        .where(builds.c.id == sa.bindparam("build_id"))
        .values({name: sa.bindparam(f"new_{name}") for name, _ in FA2_COLUMNS})
    )
    for start in range(0, len(rows), _BATCH):
        values = []
        for row in rows[start : start + _BATCH]:
            params = row.params if isinstance(row.params, dict) else json.loads(row.params)
            values.append(
                {"build_id": row.id, **{f"new_{n}": params.get(n, 0) for n, _ in FA2_COLUMNS}}
            )
        if values:
            bind.execute(update, values)
    _drop_column("builds", "params")
    _drop_column("builds", "family")
    if not _is_sqlite():
        for name, _ in FA2_COLUMNS:
            op.alter_column("builds", name, server_default=None)
