"""Undo with side effects: hooks that run in the transaction that cancels a job.

Cancelling "send this email" needs nothing more than the guarded cancel. Cancelling
"purge this project" must also bring the project back, and both must happen together
or not at all. ``@defer.on_undo("name")`` registers such a hook; ``defer.undo(id)``
cancels the job and runs its hooks in one transaction on ``db.session``, then commits.
A hook that raises rolls the cancel back too.

``defer.cancel`` does not run hooks: it is the operator's "stop this job", while
``defer.undo`` is the user's "take back what I just did".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from flask import current_app
from sqlalchemy import Connection

from . import signals
from .errors import InvalidArgument, JobNotFound
from .jobs import Job
from .timeutil import utcnow

if TYPE_CHECKING:
    from .extension import Defer, DeferState

#: A function run with the just-cancelled job, inside the undo's transaction.
UndoHook = Callable[[Job], None]


class UndoHooks:
    """Hooks by job name, run in registration order when a job of that name is undone."""

    def __init__(self) -> None:
        self._hooks: dict[str, list[UndoHook]] = {}

    def add(self, name: str, hook: UndoHook) -> None:
        """Run *hook* whenever a pending job called *name* is undone."""
        if not isinstance(name, str) or not name:
            raise InvalidArgument("name", f"expected a job name, got {name!r}")
        if not callable(hook):
            raise InvalidArgument("hook", f"expected a callable, got {hook!r}")
        hooks = self._hooks.setdefault(name, [])
        if hook not in hooks:
            hooks.append(hook)

    def for_name(self, name: str) -> tuple[UndoHook, ...]:
        """The hooks of job *name*, in the order they were registered."""
        return tuple(self._hooks.get(name, ()))


def undo(
    defer: Defer, job_id: int | None, key: str | None, owner: str | None
) -> bool:
    """Cancel a pending job and run its undo hooks in one committed transaction.

    Same answers as ``defer.cancel``: True if this call cancelled it; False if it is
    running or settled (nothing changed, no hook ran); :class:`JobNotFound` for an
    unknown id or key, or a job of another owner when *owner* is given.
    """
    state = defer._state()
    with _undo_transaction(state) as conn:
        cancelled = state.store.cancel(conn, now=utcnow(), job_id=job_id, key=key, owner=owner)
        if cancelled is None:
            existing = state.store.get(conn, job_id=job_id, key=key)
            if existing is None or (owner is not None and existing.owner != owner):
                raise JobNotFound(job_id, key)
            return False
        for hook in defer.undo_hooks.for_name(cancelled.name):
            hook(cancelled)
    signals.job_cancelled.send(current_app._get_current_object(), job=cancelled)  # type: ignore[attr-defined]
    return True


@contextmanager
def _undo_transaction(state: DeferState) -> Iterator[Connection]:
    """``db.session``'s transaction, committed on success and rolled back on error."""
    if state.session is None:
        with state.store.begin() as conn:
            yield conn
        return
    session = state.session
    try:
        yield session.connection(bind_arguments={"clause": state.store.table})
    except BaseException:
        session.rollback()
        raise
    session.commit()
