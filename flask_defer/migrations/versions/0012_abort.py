"""Abort: ``defer.abort(id)`` asks the worker running a job to stop it (issue 35).

Revision ID: flask_defer_0012
Revises: flask_defer_0011

Adds ``abort_requested_by`` (nullable): who asked to abort the running job. The worker
running it reads it for its running jobs every heartbeat (by primary key, so no index
is needed), and ``job.abort_requested()`` turns True in the handler.

Locks. PostgreSQL: adding a nullable column is a catalogue change (milliseconds).
SQLite: the write lock, for as long.

Downgrade drops the column: a request not yet seen by its worker is forgotten, and the
job runs to its end.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flask_defer.migrations import table_name

revision = "flask_defer_0012"
down_revision = "flask_defer_0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(table_name(), sa.Column("abort_requested_by", sa.String(255), nullable=True))


def downgrade() -> None:
    op.drop_column(table_name(), "abort_requested_by")
