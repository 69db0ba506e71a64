"""Workers: ``defer.workers()``, ``flask defer workers`` and the dashboard's Workers page
(issue 36).

Revision ID: flask_defer_0014
Revises: flask_defer_0013

Adds the ``<table>_workers`` table: one row per running worker (and per ``run_due``
while it holds jobs), written at its start, refreshed by its lease heartbeat, deleted
when it stops. A new table: a catalogue change on either database.

Downgrade drops it; running workers of the newer code then fail their heartbeat's
refresh and log it, until they are restarted on the older code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flask_defer.migrations import table_name

revision = "flask_defer_0014"
down_revision = "flask_defer_0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        f"{table_name()}_workers",
        sa.Column("id", sa.String(100), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("queues", sa.JSON(), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(32), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_seconds", sa.Float(), nullable=False),
        sa.Column("running", sa.JSON(), nullable=False),
        sa.Column("listening", sa.Boolean(), nullable=True),
        sa.Column("names", sa.JSON(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table(f"{table_name()}_workers")
