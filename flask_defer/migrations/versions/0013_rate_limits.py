"""Rate limits: ``@defer.job(..., rate_limit="10/s")`` across every worker (issue 35).

Revision ID: flask_defer_0013
Revises: flask_defer_0012

Adds ``rate_limit`` and ``rate_period`` (nullable) to the jobs table: a rate-limited
job's limit, copied from its handler when it is scheduled (its bucket is its
``concurrency_key``), and the ``<table>_starts`` table, one row per start of such a job
with the moment it stops counting (``until``), indexed by ``(bucket, until)``.

Locks. PostgreSQL: nullable columns and a new table are catalogue changes
(milliseconds). SQLite: the write lock, for as long.

Downgrade drops the table and the columns: rate-limited jobs still pending keep their
bucket as a ``concurrency_key`` (limit 1 running at a time) under the older code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flask_defer.migrations import table_name

revision = "flask_defer_0013"
down_revision = "flask_defer_0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    name = table_name()
    op.add_column(name, sa.Column("rate_limit", sa.Integer(), nullable=True))
    op.add_column(name, sa.Column("rate_period", sa.Float(), nullable=True))
    op.create_table(
        f"{name}_starts",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
            autoincrement=True,
        ),
        sa.Column("bucket", sa.String(255), nullable=False),
        sa.Column("until", sa.DateTime(timezone=True), nullable=False),
    )  # fmt: skip
    op.create_index(f"ix_{name}_starts_bucket_until", f"{name}_starts", ["bucket", "until"])


def downgrade() -> None:
    name = table_name()
    op.drop_index(f"ix_{name}_starts_bucket_until", table_name=f"{name}_starts")
    op.drop_table(f"{name}_starts")
    op.drop_column(name, "rate_period")
    op.drop_column(name, "rate_limit")
