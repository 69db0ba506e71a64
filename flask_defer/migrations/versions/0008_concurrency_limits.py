"""Per-key concurrency limits: at most N running jobs per ``concurrency_key`` (issue 27).

Revision ID: flask_defer_0008
Revises: flask_defer_0007

``defer.schedule(..., concurrency_key="account:42", concurrency_limit=1)`` lets at most
``concurrency_limit`` jobs of one key run at once (a tenant's syncs one at a time, a
rate-limited API two at a time). This revision adds the two nullable columns and a
partial index on live keyed rows, ``(concurrency_key, status)``: the claim counts how many
of a key are running from it. Rows without a key (every row written before this
revision) never enter the index.

Locks. PostgreSQL: ``ADD COLUMN`` of a nullable column without a default is a catalogue
change (an ACCESS EXCLUSIVE lock held for milliseconds); the index is built
``CONCURRENTLY`` outside the migration's transaction, so writes go on while it is built
(it has no rows yet, so the build is one pass over the table). SQLite: the upgrade holds
the write lock for the same pass.

Downgrade drops the index and the columns: a job's key and limit are lost, and its
jobs run without a limit, as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flask_defer.migrations import on_postgresql, outside_the_transaction, table_name

revision = "flask_defer_0008"
down_revision = "flask_defer_0007"
branch_labels = None
depends_on = None

KEYED_LIVE = "status IN ('pending', 'running') AND concurrency_key IS NOT NULL"


def upgrade() -> None:
    name = table_name()
    op.add_column(name, sa.Column("concurrency_key", sa.String(255), nullable=True))
    op.add_column(name, sa.Column("concurrency_limit", sa.Integer(), nullable=True))
    with outside_the_transaction():
        op.create_index(
            f"ix_{name}_keyed_live",
            name,
            ["concurrency_key", "status"],
            sqlite_where=sa.text(KEYED_LIVE),
            postgresql_where=sa.text(KEYED_LIVE),
            if_not_exists=True,
            postgresql_concurrently=on_postgresql(),
        )


def downgrade() -> None:
    name = table_name()
    with outside_the_transaction():
        op.drop_index(
            f"ix_{name}_keyed_live",
            table_name=name,
            if_exists=True,
            postgresql_concurrently=on_postgresql(),
        )
    op.drop_column(name, "concurrency_limit")
    op.drop_column(name, "concurrency_key")
