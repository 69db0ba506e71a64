"""The recurring schedules table (``defer.recurring(...)``).

Revision ID: flask_defer_0002
Revises: flask_defer_0001

Creates a new, empty table and its partial index. Nothing that holds data is touched:
on PostgreSQL ``CREATE TABLE`` and a ``CREATE INDEX`` on the table just created lock
only that new table (no other session can see it yet), so neither blocks the jobs
table; on SQLite nothing needs batch mode (no existing table is altered).

Downgrade drops the table. It holds no jobs, only the schedules' progress
(``next_run_at``, ``paused``): the declarations in code recreate every row at the next
sync, so the only loss is a pause set from the dashboard or CLI and, for
``catch_up="all"``, the ticks missed meanwhile. That is recoverable, so it drops
rather than refuses.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from flask_defer.migrations import schedules_table_name

revision = "flask_defer_0002"
down_revision = "flask_defer_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    name = schedules_table_name()
    payload = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    stamp = sa.DateTime(timezone=True)
    op.create_table(
        name,
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("job_name", sa.String(200), nullable=False),
        sa.Column("cron", sa.String(200), nullable=True),
        sa.Column("every_seconds", sa.Float(), nullable=True),
        sa.Column("tz", sa.String(64), nullable=False, server_default="UTC"),
        sa.Column("payload", payload, nullable=True),
        sa.Column("catch_up", sa.String(16), nullable=False, server_default="latest"),
        sa.Column("paused", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("orphaned", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("next_run_at", stamp, nullable=False),
        sa.Column("last_run_at", stamp, nullable=True),
        sa.Column("created_at", stamp, nullable=False),
        sa.Column("updated_at", stamp, nullable=False),
    )
    # The same predicate the schema code compiles (paused = false AND orphaned = false
    # on PostgreSQL, paused = 0 AND orphaned = 0 on SQLite).
    paused = sa.column("paused", sa.Boolean())
    orphaned = sa.column("orphaned", sa.Boolean())
    active = sa.and_(paused == sa.false(), orphaned == sa.false())
    op.create_index(
        f"ix_{name}_active_next_run_at",
        name,
        ["next_run_at"],
        sqlite_where=active,
        postgresql_where=active,
    )


def downgrade() -> None:
    op.drop_table(schedules_table_name())
