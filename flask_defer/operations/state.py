"""The per-app state in ``app.extensions["defer"]``: a plain holder, built complete.

``init_app`` builds one :class:`DeferState` per app (:func:`~.assembly.build_state`):
the frozen config, the store over the app's engine, the app's
:class:`~flask_defer.store.transactions.Transactions`, the runner (claim → execute →
acknowledge) that ``run_due`` and the worker share, the recurring schedules and the
metrics. It is never changed afterwards, and holds no rule: the rules take it as their
first argument (:mod:`.scheduling`, :mod:`.control`, :mod:`.reads`, :mod:`.running`).
Every signal is sent by :meth:`DeferState.send`, with the app as sender. The features
(soft delete, batching, HTTP jobs) are handed this object, never ``Defer``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from blinker import Signal
from flask import Flask, current_app, has_app_context

from ..config import DeferConfig
from ..engine.execution import Executor
from ..engine.runner import Runner
from ..engine.ticks import RecurringTicks
from ..errors import NotConfigured
from ..registry import Registry, UndoHooks
from ..store import JobStore
from ..store.transactions import Transactions

if TYPE_CHECKING:
    from .metrics import Metrics


@dataclass(frozen=True, eq=False)
class DeferState:
    """What one app's ``app.extensions["defer"]`` holds (internal; use ``Defer``)."""

    #: The public facade bound to this app (the web layer and the CLI call it).
    extension: Any
    config: DeferConfig
    store: JobStore
    transactions: Transactions
    executor: Executor
    runner: Runner
    registry: Registry
    undo_hooks: UndoHooks
    #: The app, sender of every signal.
    app: Flask
    #: The app's Flask-SQLAlchemy ``db``, or None when flask_defer owns its engine.
    db: Any = None
    #: The app's Prometheus metrics (``DEFER_METRICS``), or None.
    metrics: Metrics | None = None
    #: The app's recurring schedules (:mod:`flask_defer.features.recurring`); the
    #: worker and run_due tick them.
    recurring: RecurringTicks | None = None

    # -- signals: the one way out ----------------------------------------------------

    def send(self, signal: Signal, **kwargs: Any) -> None:
        """Send one of :mod:`flask_defer.signals` with this app as sender."""
        if signal.receivers:  # a worker sends two a job; most apps listen to none
            signal.send(self.app, **kwargs)

    def send_when_committed(self, signal: Signal, *, commit: bool, **kwargs: Any) -> None:
        """Send *signal* for a control call: now when it committed its own transaction,
        else once the caller's transaction commits (``commit=False``), never on rollback.

        A receiver must only hear of a cancel that became real: the same call rolled
        back leaves the job pending, as if it had never been made.
        """
        self.transactions.after_commit(lambda: self.send(signal, **kwargs), commit=commit)


def state_of(app: Flask) -> DeferState | None:
    """*app*'s flask_defer state, or None when ``init_app`` was not called on it."""
    state = app.extensions.get("defer")
    return state if isinstance(state, DeferState) else None


def current_state() -> DeferState:
    """The current app's state; :class:`NotConfigured` that says what to do otherwise."""
    if not has_app_context():
        raise NotConfigured(
            "flask_defer needs an application context: call it inside a request, "
            "a CLI command, or `with app.app_context():`"
        )
    state = state_of(current_app)
    if state is None:
        raise NotConfigured(
            "flask_defer is not initialised on this app: did you forget defer.init_app(app)?"
        )
    return state

