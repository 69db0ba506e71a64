"""Paused queues and job names: the ``<jobs table>_pauses`` table.

Revision ID: flask_defer_0007
Revises: flask_defer_0006

Operators pause a queue or a job name at run time (``defer.pause(queue=...)``, ``flask
defer pause``, the dashboard's Queues page); while a row names its queue or name, no
worker and no ``run_due`` claims a job of it, and the jobs stay pending with their
``run_at`` and ``due_at``. The claim reads this table as two ``NOT IN`` subqueries, so
from this revision on the code expects it to exist.

Creates a new, empty table (one row per pause: ``kind`` and ``value`` as its primary
key, ``paused_at``, ``actor``), so it locks nothing that holds data: the jobs table is
not touched.

Downgrade drops the table: every pause is lifted (the older code has none), and the
jobs that waited become claimable at once. No job is lost.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flask_defer.migrations import table_name

revision = "flask_defer_0007"
down_revision = "flask_defer_0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        f"{table_name()}_pauses",
        sa.Column("kind", sa.String(16), primary_key=True),
        sa.Column("value", sa.String(200), primary_key=True),
        sa.Column("paused_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
    )


def downgrade() -> None:
    op.drop_table(f"{table_name()}_pauses")
