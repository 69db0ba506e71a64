"""The Undo toast's state texts in their own columns (issue 14).

Revision ID: flask_defer_0004
Revises: flask_defer_0003

``undoable(waiting_label=, done_label=, failed_label=, undone_label=)`` used to store
its texts inside the ``label`` column, joined by U+001F, to avoid a schema change. This
revision adds one nullable column per text and moves any joined texts of existing rows
into them, so ``label`` holds the label alone again and may contain any character.

Locks: on PostgreSQL each ``ADD COLUMN`` of a nullable column without a default is a
catalogue change (an ACCESS EXCLUSIVE lock held for milliseconds, no table rewrite);
the data step then updates only rows whose label holds U+001F (Undo toasts, which live
seconds to minutes, so usually a handful). On SQLite ``ADD COLUMN`` rewrites nothing.

Downgrade joins the texts back into ``label`` (as the older code reads them) and drops
the columns: nothing is lost.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flask_defer.migrations import table_name

revision = "flask_defer_0004"
down_revision = "flask_defer_0003"
branch_labels = None
depends_on = None

#: The columns, in the order the older code joined them after the label.
TEXT_COLUMNS = ("waiting_label", "done_label", "failed_label", "undone_label")
SEPARATOR = "\x1f"


def upgrade() -> None:
    name = table_name()
    for column in TEXT_COLUMNS:
        op.add_column(name, sa.Column(column, sa.String(255), nullable=True))
    if op.get_context().dialect.name == "postgresql":
        # One statement, so it also runs as printed by `flask defer db sql`.
        parts = [f"{c} = NULLIF(split_part(label, chr(31), {n}), '')" for n, c in _numbered()]
        op.execute(
            f"UPDATE \"{name}\" SET label = NULLIF(split_part(label, chr(31), 1), ''), "
            + ", ".join(parts)
            + " WHERE strpos(label, chr(31)) > 0"
        )
    elif not op.get_context().as_sql:
        _split_in_python(name)
    # SQLite printed as SQL (no string splitting there): the joined texts were written
    # only by unreleased code between 0.1.0 and this revision, so nothing is printed.


def _numbered() -> list[tuple[int, str]]:
    """Each text column with its 1-based part number after the label."""
    return [(n, column) for n, column in enumerate(TEXT_COLUMNS, start=2)]


def _split_in_python(name: str) -> None:
    jobs = _texts_table(name)
    conn = op.get_bind()
    joined = conn.execute(
        sa.select(jobs.c.id, jobs.c.label).where(jobs.c.label.contains(SEPARATOR, autoescape=True))
    ).all()
    for job_id, stored in joined:
        label, *rest = stored.split(SEPARATOR)
        texts = dict(zip(TEXT_COLUMNS, rest, strict=False))
        values = {column: texts.get(column) or None for column in TEXT_COLUMNS}
        conn.execute(
            sa.update(jobs).where(jobs.c.id == job_id).values(label=label or None, **values)
        )


def downgrade() -> None:
    name = table_name()
    sep = "chr(31)" if op.get_context().dialect.name == "postgresql" else "char(31)"
    joined = f" || {sep} || ".join(f"COALESCE({c}, '')" for c in ("label", *TEXT_COLUMNS))
    has_text = " OR ".join(f"{c} IS NOT NULL" for c in TEXT_COLUMNS)
    op.execute(f'UPDATE "{name}" SET label = substr({joined}, 1, 255) WHERE {has_text}')
    for column in reversed(TEXT_COLUMNS):
        # SQLite has had DROP COLUMN since 3.35; no batch copy of the jobs table needed.
        op.drop_column(name, column)


def _texts_table(name: str) -> sa.TableClause:
    """A lightweight view of the columns this revision reads and writes."""
    return sa.table(
        name,
        sa.column("id", sa.BigInteger()),
        sa.column("label", sa.String(255)),
        *(sa.column(column, sa.String(255)) for column in TEXT_COLUMNS),
    )
