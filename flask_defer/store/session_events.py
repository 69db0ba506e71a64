"""Attach a listener to the app's ``db.session`` exactly once per session factory.

``event.contains`` cannot answer this reliably: SQLAlchemy keys its listener registry
by ``id()`` of the target, and listening on a ``scoped_session`` targets the per-factory
``Session`` subclass. Once such a class is garbage collected, a new one can get its id,
and ``contains`` then says True for a class that has no listener at all (seen as the
"uncommitted jobs" flag never being cleared, now and then, in a long test run). A weak
map keyed by the factory object itself has no such aliasing.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session, scoped_session

_attached: weakref.WeakKeyDictionary[Any, set[tuple[str, Callable[..., Any]]]] = (
    weakref.WeakKeyDictionary()
)


def listen_once(
    session: scoped_session[Session], identifier: str, fn: Callable[..., Any]
) -> None:
    """``event.listen(session, identifier, fn)`` unless it was done for this factory."""
    attached = _attached.setdefault(session.session_factory, set())
    if (identifier, fn) not in attached:
        event.listen(session, identifier, fn)
        attached.add((identifier, fn))
