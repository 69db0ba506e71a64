"""``Defer``'s schema-revision methods: what ``flask defer install`` and ``db ...`` call."""

from __future__ import annotations

from ..store import versioning
from .declarations import FacadeBase


class SchemaMethods(FacadeBase):
    """Check, upgrade and print the SQL of the current app's flask_defer schema."""

    def install(self) -> str:
        """Bring the jobs table to the newest revision, recorded; return the table's name.

        For apps without migrations (``flask defer install``): creates a fresh schema
        or upgrades an existing one. Raises :class:`ManagedByAlembic` in an app that
        runs its own Alembic (Flask-Migrate, or ``alembic_version`` in the database):
        there ``flask db upgrade`` does it. ``db.create_all()`` also records the revision.
        """
        store = self._state().store
        versioning.install(store.engine, self._schema_names())
        return store.table.name

    def schema_status(self) -> versioning.SchemaStatus:
        """How this app's database's flask_defer schema compares with the code's."""
        return versioning.check(self._state().store.engine, self._schema_names())

    def upgrade_schema(self) -> list[str]:
        """Upgrade the schema to the newest revision; return the revisions applied."""
        return versioning.upgrade(self._state().store.engine, self._schema_names())

    def schema_sql(self) -> str:
        """The SQL the upgrade would run, not executed (``flask defer db sql``)."""
        return versioning.pending_sql(self._state().store.engine, self._schema_names())
