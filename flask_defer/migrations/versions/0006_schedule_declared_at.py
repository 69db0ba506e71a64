"""When code last declared each recurring schedule (issue 28).

Revision ID: flask_defer_0006
Revises: flask_defer_0005

A process whose code did not declare a schedule (the old release during a rolling
deploy) used to mark it orphaned at its sync, and the schedule stopped ticking for
everyone. Now code that does not know a schedule leaves it alone, and a schedule is
orphaned only by ``defer.forget_recurring(id)`` or once no code has declared it for
``DEFER_SCHEDULE_ORPHAN_GRACE``. This revision adds the nullable ``declared_at``
column that the grace period and ``defer.health()``'s undeclared schedules are
measured from, and sets it to each row's ``updated_at``, so the grace period of a
schedule already gone from code starts at its last change rather than never.

Locks: on PostgreSQL ``ADD COLUMN`` of a nullable column without a default is a
catalogue change (an ACCESS EXCLUSIVE lock on the small schedules table, held for
milliseconds); the data step updates every schedule row (one per
``defer.recurring(...)`` id, usually a handful). The jobs table is not touched.

Downgrade drops the column; nothing else is lost (the older code orphans undeclared
schedules at its sync, as it did).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flask_defer.migrations import schedules_table_name

revision = "flask_defer_0006"
down_revision = "flask_defer_0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    name = schedules_table_name()
    op.add_column(name, sa.Column("declared_at", sa.DateTime(timezone=True), nullable=True))
    op.execute(f'UPDATE "{name}" SET declared_at = updated_at')


def downgrade() -> None:
    op.drop_column(schedules_table_name(), "declared_at")
