"""What every group of ``Defer``'s methods shares: its declarations and the app's state."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from flask import current_app

from ..features import recurring as _recurring
from ..features.owner import OwnerLoader
from ..operations.state import DeferState, current_state
from ..registry import Registry, UndoHooks
from ..store import versioning
from ..store.schema import SchemaNames

#: The dashboard's authorisation hook: no arguments, True to let the request in.
DashboardAuth = Callable[[], Any]


class FacadeBase:
    """The attributes ``Defer.__init__`` sets, typed once for every method group.

    A ``Defer`` is created before any app exists, so it keeps only declarations (the
    handlers, undo hooks, recurring schedules, the owner loader and dashboard hook);
    everything per app is read from ``app.extensions["defer"]`` on each call.
    """

    registry: Registry
    undo_hooks: UndoHooks
    #: ``defer.recurring(...)`` declarations (every app bound to this one ticks them).
    schedules: _recurring.Declarations
    table_name: str
    schedules_table_name: str
    _owner_loader: OwnerLoader | None
    _dashboard_auth: DashboardAuth | None

    @staticmethod
    def _state() -> DeferState:
        """The current app's state; :class:`NotConfigured` outside a set-up app."""
        return current_state()

    def _tables(self, state: DeferState) -> SchemaNames:
        """The names of *state*'s tables, not yet knowing who migrates them."""
        return SchemaNames(jobs=state.store.table.name, schedules=self.schedules_table_name)

    def _schema_names(self) -> SchemaNames:
        """The current app's tables, and whether its own Alembic (Flask-Migrate) runs."""
        migrate = "migrate" in current_app.extensions
        return replace(self._tables(self._state()), app_migrations=migrate)

    def _require_current_schema(self) -> None:
        """Raise :class:`SchemaMismatch` unless the schema matches the code."""
        # A worker on a schema behind or ahead of the code would fail on every claim.
        versioning.require_current(self._state().store.engine, self._schema_names())
