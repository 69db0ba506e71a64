"""Indexes that let health and the dashboard read no table row (issue 12).

Revision ID: flask_defer_0005
Revises: flask_defer_0004

``defer.health()`` and the dashboard counted every pending row through the table; with
100,000 pending and 1,000,000 settled rows a call took 150-300 ms, every few seconds per
open dashboard tab. This revision widens two indexes and adds a small third one so each
figure is read from an index alone:

* ``ix_<table>_pending_run_at`` (``run_at``, partial on pending rows) becomes
  ``ix_<table>_pending_run_at_name`` on (``run_at``, ``name``, ``due_at``, ``status``):
  the claim uses it as before, and the owed and scheduled figures per name come from it;
* ``ix_<table>_status_finished`` (``status``, ``finished_at``) becomes
  ``ix_<table>_status_finished_name`` (``status``, ``finished_at``, ``name``): pruning as
  before, plus the per-name failed counts and the latest-settled window;
* ``ix_<table>_pending_errors`` on (``name``), partial on pending rows with an error:
  jobs waiting for a handler (usually a handful of rows; an insert without an error
  never enters it).

Each new index is created before the one it replaces is dropped, so the claim and
pruning always have an index.

Locks. PostgreSQL: the indexes are built and the old ones dropped ``CONCURRENTLY``,
outside the migration's transaction (Alembic's autocommit block): writes
(``schedule()``, claims, acknowledgements, cancels) go on while each index is built,
one pass over the table each (about a second per million rows on a small server,
twice that for a concurrent build), and no statement waits longer than for the
transactions already running when the build starts. An interrupted concurrent build
leaves an INVALID index; drop it (``DROP INDEX CONCURRENTLY ix_...``) and upgrade
again. To build them ahead of a deploy (the upgrade then skips them: ``IF NOT
EXISTS``)::

    CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_defer_jobs_pending_run_at_name
        ON defer_jobs (run_at, name, due_at, status) WHERE status = 'pending';
    CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_defer_jobs_pending_errors
        ON defer_jobs (name) WHERE status = 'pending' AND last_error IS NOT NULL;
    CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_defer_jobs_status_finished_name
        ON defer_jobs (status, finished_at, name);

SQLite: the upgrade holds the write lock while it builds the indexes (about a second
per million rows); readers go on, writers wait (up to their busy timeout).

Downgrade restores the two old indexes and drops the three new ones; no row changes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from alembic import op

from flask_defer.migrations import table_name

revision = "flask_defer_0005"
down_revision = "flask_defer_0004"
branch_labels = None
depends_on = None

PENDING = "status = 'pending'"


def upgrade() -> None:
    with _outside_the_transaction():
        _upgrade()


def downgrade() -> None:
    with _outside_the_transaction():
        _downgrade()


@contextmanager
def _outside_the_transaction() -> Iterator[None]:
    """PostgreSQL: build and drop indexes CONCURRENTLY, which no transaction may hold."""
    if _on_postgresql():
        with op.get_context().autocommit_block():
            yield
    else:
        yield


def _on_postgresql() -> bool:
    return bool(op.get_context().dialect.name == "postgresql")


def _upgrade() -> None:
    name = table_name()
    pending = sa.text(PENDING)
    with_error = sa.text(f"{PENDING} AND last_error IS NOT NULL")
    # IF NOT EXISTS: an operator may have pre-created them (see above).
    op.create_index(
        f"ix_{name}_pending_run_at_name",
        name,
        ["run_at", "name", "due_at", "status"],
        sqlite_where=pending,
        postgresql_where=pending,
        if_not_exists=True,
        postgresql_concurrently=_on_postgresql(),
    )
    op.create_index(
        f"ix_{name}_pending_errors",
        name,
        ["name"],
        sqlite_where=with_error,
        postgresql_where=with_error,
        if_not_exists=True,
        postgresql_concurrently=_on_postgresql(),
    )
    op.create_index(
        f"ix_{name}_status_finished_name",
        name,
        ["status", "finished_at", "name"],
        if_not_exists=True,
        postgresql_concurrently=_on_postgresql(),
    )
    op.drop_index(
        f"ix_{name}_pending_run_at",
        table_name=name,
        if_exists=True,
        postgresql_concurrently=_on_postgresql(),
    )
    op.drop_index(
        f"ix_{name}_status_finished",
        table_name=name,
        if_exists=True,
        postgresql_concurrently=_on_postgresql(),
    )


def _downgrade() -> None:
    name = table_name()
    pending = sa.text(PENDING)
    op.create_index(
        f"ix_{name}_pending_run_at",
        name,
        ["run_at"],
        sqlite_where=pending,
        postgresql_where=pending,
        if_not_exists=True,
        postgresql_concurrently=_on_postgresql(),
    )
    op.create_index(
        f"ix_{name}_status_finished",
        name,
        ["status", "finished_at"],
        if_not_exists=True,
        postgresql_concurrently=_on_postgresql(),
    )
    op.drop_index(
        f"ix_{name}_status_finished_name",
        table_name=name,
        if_exists=True,
        postgresql_concurrently=_on_postgresql(),
    )
    op.drop_index(
        f"ix_{name}_pending_errors",
        table_name=name,
        if_exists=True,
        postgresql_concurrently=_on_postgresql(),
    )
    op.drop_index(
        f"ix_{name}_pending_run_at_name",
        table_name=name,
        if_exists=True,
        postgresql_concurrently=_on_postgresql(),
    )
