"""flask_defer's Alembic revisions, shipped in the package.

``versions/`` holds one revision per schema change on the ``flask_defer`` branch; the
first (``flask_defer_0001``) is the schema of 0.1.0. They run two ways:

* from the app's own Alembic / Flask-Migrate setup, by adding
  ``flask_defer.migrations:versions`` to its ``version_locations`` (``flask db upgrade``
  then upgrades both, recorded in the app's ``alembic_version``);
* without migrations, through ``flask defer db upgrade`` (``env.py`` here, recorded in
  ``defer_alembic_version``).

Revision files import only Alembic, SQLAlchemy and this module, never the current
schema code: a revision is a frozen step, it must mean the same thing forever.
"""

from __future__ import annotations

from typing import Any

from alembic import op

#: The branch label of flask_defer's revisions (``flask db upgrade flask_defer@head``).
BRANCH = "flask_defer"
#: The version table of ``flask defer db upgrade`` (apps without migrations).
VERSION_TABLE = "defer_alembic_version"
#: Where the app's Alembic finds the revisions (``version_locations``).
VERSION_LOCATION = "flask_defer.migrations:versions"
#: ``config.attributes`` key naming the jobs table (``Defer(table_name=...)``).
TABLE_ATTRIBUTE = "flask_defer_table"
#: The table names flask_defer owns, for ``include_object``.
OWN_TABLES = frozenset({"defer_jobs", VERSION_TABLE})


def table_name() -> str:
    """The jobs table's name in the running migration (``defer_jobs`` unless renamed)."""
    config = op.get_context().config
    name = config.attributes.get(TABLE_ATTRIBUTE) if config is not None else None
    return str(name) if name else "defer_jobs"


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """An Alembic ``include_object`` hook: never propose dropping flask_defer's tables.

    A process whose metadata lacks the jobs table (it never ran ``init_app``, or it is a
    plain Alembic ``env.py``) would otherwise autogenerate ``op.drop_table('defer_jobs')``
    and, applied, delete every job. Pass it as ``Migrate(app, db,
    include_object=include_object)`` or to ``context.configure`` in ``env.py``.
    """
    if type_ == "table" and reflected and compare_to is None and name in OWN_TABLES:
        return False
    table = getattr(obj, "table", None)
    if reflected and compare_to is None and table is not None and table.name in OWN_TABLES:
        return False
    return True
