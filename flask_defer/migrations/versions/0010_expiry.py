"""Expiry: a job not started by ``expires_at`` settles as ``expired`` (issue 27).

Revision ID: flask_defer_0010
Revises: flask_defer_0009

``defer.schedule(..., expires_at=...)`` or ``ttl=`` (measured from ``run_at``): a
"your code is 123456" text that is worthless ten minutes late, a price alert after the
market closed. The claim never starts a pending job past its ``expires_at``, and the
worker's sweep settles such jobs as ``expired``, with an ``expired`` history event.
This revision adds the nullable column and a partial index on it over pending rows that
have one, which the sweep reads; rows without an expiry never enter it.

Locks. PostgreSQL: ``ADD COLUMN`` of a nullable column is a catalogue change
(milliseconds); the index is built ``CONCURRENTLY`` outside the migration's transaction
(it is empty at first, one pass over the table). SQLite: the write lock, for the same
pass.

Downgrade first turns every ``expired`` job into ``cancelled`` (the status older code
knows for "settled, never ran"), then drops the index and the column.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flask_defer.migrations import on_postgresql, outside_the_transaction, table_name

revision = "flask_defer_0010"
down_revision = "flask_defer_0009"
branch_labels = None
depends_on = None

EXPIRING = "status = 'pending' AND expires_at IS NOT NULL"


def upgrade() -> None:
    name = table_name()
    op.add_column(name, sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    with outside_the_transaction():
        op.create_index(
            f"ix_{name}_pending_expiry",
            name,
            ["expires_at"],
            sqlite_where=sa.text(EXPIRING),
            postgresql_where=sa.text(EXPIRING),
            if_not_exists=True,
            postgresql_concurrently=on_postgresql(),
        )


def downgrade() -> None:
    name = table_name()
    op.execute(f"UPDATE \"{name}\" SET status = 'cancelled' WHERE status = 'expired'")
    with outside_the_transaction():
        op.drop_index(
            f"ix_{name}_pending_expiry",
            table_name=name,
            if_exists=True,
            postgresql_concurrently=on_postgresql(),
        )
    op.drop_column(name, "expires_at")
