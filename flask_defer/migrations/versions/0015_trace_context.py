"""Traces: the trace context of the span that scheduled a job (issue 36).

Revision ID: flask_defer_0015
Revises: flask_defer_0014

Adds ``trace_context`` (nullable JSON, JSONB on PostgreSQL): the W3C ``traceparent``
and ``tracestate`` of the ``defer.schedule`` span (``flask_defer.tracing``, with
OpenTelemetry installed), so the job's run joins that trace. A nullable column: a
catalogue change on PostgreSQL, the write lock for as long on SQLite.

Downgrade drops it: jobs still pending then run in traces of their own.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from flask_defer.migrations import table_name

revision = "flask_defer_0015"
down_revision = "flask_defer_0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    op.add_column(table_name(), sa.Column("trace_context", json, nullable=True))


def downgrade() -> None:
    op.drop_column(table_name(), "trace_context")
