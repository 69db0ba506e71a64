"""Activity: runs per minute and per hour, by queue and job name (issue 36).

Revision ID: flask_defer_0016
Revises: flask_defer_0015

Adds the ``<table>_activity`` aggregate that workers add to every few seconds (runs
started, done, failed, retried and a lateness histogram), which ``defer.activity()``
and the dashboard's Activity page read. A new table: a catalogue change.

Downgrade drops it; the counts are statistics, not jobs.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flask_defer.migrations import table_name

revision = "flask_defer_0016"
down_revision = "flask_defer_0015"
branch_labels = None
depends_on = None

COUNTS = ["started", "done", "failed", "retried", *[f"late_{i}" for i in range(10)]]


def upgrade() -> None:
    op.create_table(
        f"{table_name()}_activity",
        sa.Column("span", sa.String(1), primary_key=True),
        sa.Column("start", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("queue", sa.String(100), primary_key=True),
        sa.Column("name", sa.String(200), primary_key=True),
        *[sa.Column(c, sa.Integer(), nullable=False, server_default="0") for c in COUNTS],
    )


def downgrade() -> None:
    op.drop_table(f"{table_name()}_activity")
