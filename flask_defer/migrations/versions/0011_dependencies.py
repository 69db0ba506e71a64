"""Dependencies: a job that runs after other jobs, and a group's ``then`` job (issue 35).

Revision ID: flask_defer_0011
Revises: flask_defer_0010

``defer.schedule(..., after=...)`` and ``defer.group(...)``. This revision adds:

* ``waiting_for`` (nullable): how many of a child's parents have not settled yet;
  NULL for every job that waits for nobody (all existing ones);
* ``dependents`` (``NOT NULL DEFAULT false``): the job has children, so settling it
  looks for them;
* the ``<table>_after`` table, one row per (child, parent) edge;
* the claim's three pending indexes again, now leaving out the rows that wait
  (``AND waiting_for IS NULL``): ``ix_<table>_pending_run_at_name``,
  ``ix_<table>_pending_priority`` and ``ix_<table>_keyed_pending``. A waiting child
  costs the claim nothing.

Locks. PostgreSQL: both columns are catalogue changes (milliseconds); each index is
built anew ``CONCURRENTLY`` under a temporary name, then the old one is dropped
``CONCURRENTLY`` and the new one renamed, so ``schedule()``, claims and
acknowledgements go on meanwhile. SQLite: the write lock, for one pass per index.

Downgrade refuses to lose a waiting child silently: it releases every waiting job (it
becomes claimable at once, its parents forgotten), restores the indexes of revision
0010, and drops the table and the columns.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flask_defer.migrations import on_postgresql, outside_the_transaction, table_name

revision = "flask_defer_0011"
down_revision = "flask_defer_0010"
branch_labels = None
depends_on = None

#: Each rebuilt index: (suffix, columns before, columns after, predicate before, after).
#: The index by time also holds ``waiting_for``: SQLite counts a partial index's own
#: predicate columns as read, so health stays an index-only read.
INDEXES = (
    (
        "pending_run_at_name",
        ["run_at", "name", "due_at", "status"],
        ["run_at", "name", "due_at", "status", "waiting_for"],
        "status = 'pending'",
        "status = 'pending' AND waiting_for IS NULL",
    ),
    (
        "pending_priority",
        ["priority", "run_at", "id"],
        ["priority", "run_at", "id"],
        "status = 'pending' AND concurrency_key IS NULL",
        "status = 'pending' AND waiting_for IS NULL AND concurrency_key IS NULL",
    ),
    (
        "keyed_pending",
        ["priority", "run_at", "id"],
        ["priority", "run_at", "id"],
        "status = 'pending' AND concurrency_key IS NOT NULL",
        "status = 'pending' AND waiting_for IS NULL AND concurrency_key IS NOT NULL",
    ),
)


def _rebuild(name: str, *, upgrade: bool) -> None:
    """Give each index its new predicate (its old one on downgrade)."""
    for suffix, old_columns, new_columns, before, after in INDEXES:
        index = f"ix_{name}_{suffix}"
        predicate = sa.text(after if upgrade else before)
        columns = new_columns if upgrade else old_columns
        if not on_postgresql():
            # One transaction: the swap is atomic, and SQLite holds the write lock anyway.
            op.drop_index(index, table_name=name, if_exists=True)
            op.create_index(index, name, columns, sqlite_where=predicate)
            continue
        # Built beside the old one, then swapped, so the claim always has an index.
        building = f"{index}_new"
        with outside_the_transaction():
            op.drop_index(building, table_name=name, if_exists=True, postgresql_concurrently=True)
            op.create_index(
                building, name, columns, postgresql_where=predicate, postgresql_concurrently=True
            )
            op.drop_index(index, table_name=name, if_exists=True, postgresql_concurrently=True)
        op.execute(f'ALTER INDEX "{building}" RENAME TO "{index}"')


def upgrade() -> None:
    name = table_name()
    op.add_column(name, sa.Column("waiting_for", sa.Integer(), nullable=True))
    op.add_column(
        name,
        sa.Column("dependents", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    id_type = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.create_table(
        f"{name}_after",
        sa.Column("child_id", id_type, primary_key=True),
        sa.Column("parent_id", id_type, primary_key=True),
        sa.Column("policy", sa.String(16), nullable=False, server_default="done"),
        sa.Column("open", sa.Boolean(), nullable=False),
    )
    op.create_index(f"ix_{name}_after_parent", f"{name}_after", ["parent_id", "child_id"])
    _rebuild(name, upgrade=True)


def downgrade() -> None:
    name = table_name()
    op.execute(f'UPDATE "{name}" SET waiting_for = NULL WHERE waiting_for IS NOT NULL')
    _rebuild(name, upgrade=False)
    op.drop_index(f"ix_{name}_after_parent", table_name=f"{name}_after")
    op.drop_table(f"{name}_after")
    op.drop_column(name, "dependents")
    op.drop_column(name, "waiting_for")
