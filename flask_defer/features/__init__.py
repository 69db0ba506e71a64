"""Helpers built on the per-app state: soft delete, batching, HTTP jobs, recurring.

Each helper is handed the app's :class:`~flask_defer.operations.state.DeferState` (or the
registry, to register its built-in jobs) and never imports ``Defer``; the facade's
``soft_delete``, ``restore``, ``batch``, ``schedule_http`` and the ``*_recurring``
methods only forward to them.
Their built-in jobs are registered on every ``Defer`` by :func:`builtin_handlers`,
the way a task queue ships a blueprint of built-in tasks.
"""

from __future__ import annotations

from ..registry import Registry, UndoHooks
from . import http_jobs, soft_delete


def builtin_handlers(registry: Registry, undo_hooks: UndoHooks) -> None:
    """Register the built-in jobs (purge, HTTP) and the undo hook that restores a row."""
    soft_delete.register(registry, undo_hooks)
    http_jobs.register(registry)
