"""Undo with side effects: hooks that run in the transaction that cancels a job.

Cancelling "send this email" needs nothing more than the guarded cancel. Cancelling
"purge this project" must also bring the project back, and both must happen together
or not at all. ``@defer.on_undo("name")`` registers such a hook; ``defer.undo(id)``
cancels the job and runs its hooks in one transaction on ``db.session``, then commits.
A hook that raises rolls the cancel back too. This module keeps the registry.

An operator's cancel (``defer.cancel(..., actor=...)``: the dashboard, ``flask defer
cancel``) runs the same hooks through the same code: for the app, a job an operator
stopped is as undone as one its owner took back, and a "Sending…" message must not
stay so forever. The app's own ``defer.cancel()`` without an actor runs none.
"""

from __future__ import annotations

from collections.abc import Callable

from .errors import InvalidArgument
from .jobs import Job

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
