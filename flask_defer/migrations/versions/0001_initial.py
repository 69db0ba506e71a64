"""The jobs table as released in flask_defer 0.1.0.

Revision ID: flask_defer_0001
Revises: (none; the root of the ``flask_defer`` branch)

Creates a new, empty table and its indexes, so it locks nothing that holds data.
A 0.1.0 database (created by ``flask defer install`` or ``db.create_all()`` before
versions were recorded) already has exactly this schema: ``flask defer db upgrade``
records this revision for it without running it.

Downgrade drops the table and every job in it, so it refuses while a job is still
pending or running (those would be lost silently); settled rows are history only.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from flask_defer.migrations import table_name

revision = "flask_defer_0001"
down_revision = None
branch_labels = ("flask_defer",)
depends_on = None


def upgrade() -> None:
    name = table_name()
    payload = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    stamp = sa.DateTime(timezone=True)
    op.create_table(
        name,
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("queue", sa.String(100), nullable=False, server_default="default"),
        sa.Column("key", sa.String(255), nullable=True),
        sa.Column("payload", payload, nullable=False),
        sa.Column("status", sa.String(16), nullable=False, server_default="pending"),
        sa.Column("run_at", stamp, nullable=False),
        sa.Column("due_at", stamp, nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(255), nullable=True),
        sa.Column("label", sa.String(255), nullable=True),
        sa.Column("undo_until", stamp, nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("result", payload, nullable=True),
        sa.Column("claim_token", sa.String(64), nullable=True),
        sa.Column("lease_expires_at", stamp, nullable=True),
        sa.Column("created_at", stamp, nullable=False),
        sa.Column("updated_at", stamp, nullable=False),
        sa.Column("finished_at", stamp, nullable=True),
    )
    pending = sa.text("status = 'pending'")
    live = sa.text("status IN ('pending', 'running')")
    running = sa.text("status = 'running'")
    op.create_index(
        f"ix_{name}_pending_run_at",
        name,
        ["run_at"],
        sqlite_where=pending,
        postgresql_where=pending,
    )
    op.create_index(
        f"uq_{name}_live_key",
        name,
        ["key"],
        unique=True,
        sqlite_where=live,
        postgresql_where=live,
    )
    op.create_index(
        f"ix_{name}_running_lease",
        name,
        ["lease_expires_at"],
        sqlite_where=running,
        postgresql_where=running,
    )
    op.create_index(
        f"ix_{name}_live_owner",
        name,
        ["owner", "run_at"],
        sqlite_where=live,
        postgresql_where=live,
    )
    op.create_index(f"ix_{name}_status_finished", name, ["status", "finished_at"])


def downgrade() -> None:
    name = table_name()
    if not op.get_context().as_sql:
        live = op.get_bind().execute(
            sa.text(f"SELECT count(*) FROM {name} WHERE status IN ('pending', 'running')")
        )
        count = live.scalar()
        if count:
            raise RuntimeError(
                f"refusing to drop {name}: {count} job(s) are still pending or running "
                "and would be lost; cancel or finish them first"
            )
    op.drop_table(name)
