"""KV-cache length patterns: ``problems`` keeps the lengths a cache problem was timed on.

A new keyed column, ``kv_lengths`` (String(8), NOT NULL): ``full`` for every existing row
(a cache problem timed with every sequence at the capacity, or a problem that is not a cache
problem), ``mixed`` for a cache problem timed on the seeded spread of lengths of
:mod:`core.kv_lengths`. The identity constraint ``uq_problems_identity`` gains it, so the
mixed problem of a shape and layout and the full one are two rows.

As in 0004 and 0006 (0004's module docstring says why batch mode must not be used): SQLite
copies ``problems`` and ``measurements`` by hand in an order that cascades nothing, keeping
every id; PostgreSQL alters the table and the constraint in place.

Unlike 0004 and 0006, the copies are made from the tables as the database holds them
(reflected: columns, types, server defaults, keys, indexes) plus or minus the one column,
rather than from a third spelled-out copy of both table definitions; the identity's columns
are reflected too. So this revision reads the live schema and cannot be rendered offline
(``alembic upgrade --sql``).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMN = "kv_lengths"
#: The pattern of every row stored before this revision (db.models.FULL_KV_LENGTHS).
_FULL = "full"
_IDENTITY = "uq_problems_identity"


def _kv_lengths_column() -> sa.Column[str]:
    return sa.Column(_COLUMN, sa.String(length=8), nullable=False, server_default=_FULL)


def _bind() -> sa.Connection:
    if context.is_offline_mode():
        raise RuntimeError(
            "revision 0007 reads the live schema (it copies the tables as stored): run it "
            "against a database, not with --sql"
        )
    return op.get_bind()


def _identity(bind: sa.Connection) -> list[str]:
    """The columns of ``uq_problems_identity`` as the database holds them, in order."""
    for constraint in sa.inspect(bind).get_unique_constraints("problems"):
        if constraint["name"] == _IDENTITY:
            return list(constraint["column_names"])
    raise RuntimeError(f"problems has no {_IDENTITY} constraint: not a schema of 0006")


def _new_identity(bind: sa.Connection, *, add: bool) -> list[str]:
    """The identity with ``kv_lengths`` appended (``add``) or removed, checked against the
    revision the database is at (0006's has ``kv_page`` and no ``kv_lengths``)."""
    columns = _identity(bind)
    if "kv_page" not in columns or (_COLUMN in columns) == add:
        raise RuntimeError(f"unexpected {_IDENTITY} for this revision: {', '.join(columns)}")
    return [*columns, _COLUMN] if add else [c for c in columns if c != _COLUMN]


def _column_copy(column: sa.Column[object]) -> sa.Column[object]:
    """A reflected column as a new table's column: name, type, nullability, server default."""
    default = column.server_default
    # Reflection gives a default as its SQL text ('-1', 0, ...): kept as that text.
    text = sa.text(str(default.arg)) if isinstance(default, sa.DefaultClause) else None
    return sa.Column(column.name, column.type, nullable=column.nullable, server_default=text)


def _constraints(table: sa.Table, renamed: dict[str, str]) -> list[sa.Constraint]:
    """A reflected table's primary and foreign keys, by their names, with the tables they
    refer to renamed as ``renamed`` says (a copy's child refers to the parent's copy)."""
    pk = table.primary_key
    out: list[sa.Constraint] = [
        sa.PrimaryKeyConstraint(
            *(c.name for c in pk.columns), name=pk.name if isinstance(pk.name, str) else None
        )
    ]
    for fk in sorted(table.foreign_key_constraints, key=lambda f: str(f.name)):
        target = renamed.get(fk.referred_table.name, fk.referred_table.name)
        out.append(
            sa.ForeignKeyConstraint(
                list(fk.column_keys),
                [f"{target}.{e.column.name}" for e in fk.elements],
                name=fk.name,
                ondelete=fk.ondelete,
            )
        )
    return out


def _rebuild_sqlite(bind: sa.Connection, *, add: bool) -> None:
    """Copy ``problems`` (with ``kv_lengths`` added, or removed) and ``measurements`` without
    a cascade on the way (0004's order), every row with its id."""
    identity = _new_identity(bind, add=add)
    meta = sa.MetaData()
    problems = sa.Table("problems", meta, autoload_with=bind)
    measurements = sa.Table("measurements", meta, autoload_with=bind)
    kept = [c for c in problems.columns if c.name != _COLUMN]
    op.create_table(
        "problems_new",
        *(_column_copy(c) for c in kept),
        *([_kv_lengths_column()] if add else []),
        *_constraints(problems, {}),
        sa.UniqueConstraint(*identity, name=_IDENTITY),
    )
    op.create_table(
        "measurements_new",
        *(_column_copy(c) for c in measurements.columns),
        *_constraints(measurements, {"problems": "problems_new"}),
    )
    # The new column takes its server default ("full"): every old row was timed full.
    for name, table, columns in (
        ("problems_new", problems, kept),
        ("measurements_new", measurements, list(measurements.columns)),
    ):
        listed = ", ".join(f'"{c.name}"' for c in columns)
        op.execute(f"INSERT INTO {name} ({listed}) SELECT {listed} FROM {table.name}")
    indexes = [(t.name, ix) for t in (problems, measurements) for ix in t.indexes]
    op.execute("DROP TABLE measurements")  # the child first: nothing refers to it
    op.execute("DROP TABLE problems")  # no child refers to it any more (its indexes go too)
    op.execute("ALTER TABLE problems_new RENAME TO problems")  # rewrites the new child's FK
    op.execute("ALTER TABLE measurements_new RENAME TO measurements")
    for table_name, ix in indexes:
        op.create_index(str(ix.name), table_name, [c.name for c in ix.columns],
                        unique=bool(ix.unique))  # fmt: skip


def _replace_identity(columns: list[str]) -> None:
    op.drop_constraint(_IDENTITY, "problems", type_="unique")
    op.create_unique_constraint(_IDENTITY, "problems", columns)


def upgrade() -> None:
    bind = _bind()
    if bind.dialect.name == "sqlite":
        _rebuild_sqlite(bind, add=True)
        return
    op.add_column("problems", _kv_lengths_column())
    _replace_identity(_new_identity(bind, add=True))


def downgrade() -> None:
    bind = _bind()
    count = bind.execute(
        sa.text(f"SELECT COUNT(*) FROM problems WHERE {_COLUMN} != :full"), {"full": _FULL}
    ).scalar()
    if count:
        raise RuntimeError(
            f"{count} KV-cache problems timed on mixed lengths are stored: the schema before "
            "0007 cannot hold them (delete them first)"
        )
    if bind.dialect.name == "sqlite":
        _rebuild_sqlite(bind, add=False)
        return
    _replace_identity(_new_identity(bind, add=False))
    op.drop_column("problems", _COLUMN)
