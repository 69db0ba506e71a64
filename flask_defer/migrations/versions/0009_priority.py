"""Priorities: the claim takes due jobs by ``priority`` (lower first), then ``run_at``.

Revision ID: flask_defer_0009
Revises: flask_defer_0008

Adds ``priority`` (``NOT NULL DEFAULT 0``: every existing job gets the default) and the
two indexes the claim reads in that order, both partial on pending rows:

* ``ix_<table>_pending_priority`` on (``priority``, ``run_at``, ``id``: the claim's
  order, so PostgreSQL never sorts the due rows) for rows without a
  ``concurrency_key`` (the usual job);
* ``ix_<table>_keyed_pending`` on the same columns for rows with one.

Within one priority the rows are in ``run_at`` order, so the claim finds the due rows of
a priority at the front of its range and never walks that priority's future rows.

Locks. PostgreSQL: ``ADD COLUMN ... DEFAULT 0 NOT NULL`` is a catalogue change since
PostgreSQL 11 (no table rewrite; an ACCESS EXCLUSIVE lock held for milliseconds); the
indexes are built ``CONCURRENTLY`` outside the migration's transaction, so
``schedule()``, claims and acknowledgements go on meanwhile (one pass over the table
each). An interrupted concurrent build leaves an INVALID index: drop it
(``DROP INDEX CONCURRENTLY ix_...``) and upgrade again. SQLite: the upgrade holds the
write lock while it builds them (about a second per million rows).

Downgrade drops both indexes and the column; every job then runs in ``run_at`` order.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flask_defer.migrations import on_postgresql, outside_the_transaction, table_name

revision = "flask_defer_0009"
down_revision = "flask_defer_0008"
branch_labels = None
depends_on = None

PREDICATES = {
    "pending_priority": "status = 'pending' AND concurrency_key IS NULL",
    "keyed_pending": "status = 'pending' AND concurrency_key IS NOT NULL",
}


def upgrade() -> None:
    name = table_name()
    op.add_column(
        name, sa.Column("priority", sa.Integer(), nullable=False, server_default="0")
    )
    with outside_the_transaction():
        for suffix, predicate in PREDICATES.items():
            op.create_index(
                f"ix_{name}_{suffix}",
                name,
                ["priority", "run_at", "id"],
                sqlite_where=sa.text(predicate),
                postgresql_where=sa.text(predicate),
                if_not_exists=True,
                postgresql_concurrently=on_postgresql(),
            )


def downgrade() -> None:
    name = table_name()
    with outside_the_transaction():
        for suffix in PREDICATES:
            op.drop_index(
                f"ix_{name}_{suffix}",
                table_name=name,
                if_exists=True,
                postgresql_concurrently=on_postgresql(),
            )
    op.drop_column(name, "priority")
