"""The job history table: one row per state change of a job (issue 18).

Revision ID: flask_defer_0003
Revises: flask_defer_0002

Creates a new, empty table (``<jobs table>_history``) and its one index, so it locks
nothing that holds data: the jobs table is not touched. Events are written from the
first transition after the upgrade; jobs that existed before have no history.

Downgrade drops the table and its events (history only: no job is lost).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flask_defer.migrations import table_name

revision = "flask_defer_0003"
down_revision = "flask_defer_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    name = f"{table_name()}_history"
    id_type = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    stamp = sa.DateTime(timezone=True)
    op.create_table(
        name,
        sa.Column("id", id_type, primary_key=True, autoincrement=True),
        sa.Column("job_id", id_type, nullable=False),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("at", stamp, nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("run_at", stamp, nullable=True),
    )
    op.create_index(f"ix_{name}_job", name, ["job_id", "id"])


def downgrade() -> None:
    name = f"{table_name()}_history"
    op.drop_index(f"ix_{name}_job", table_name=name)
    op.drop_table(name)
