"""``Defer``'s Undo methods: owners, undoable jobs, holds, the Undo itself, toasts.

The facade of the Undo UI: the blueprint's toast and Undo views call only these. The
rules live in :mod:`flask_defer.operations.scheduling` (the Undo window) and
:mod:`flask_defer.operations.control` (the guarded hold, the Undo, its hooks).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, Unpack

from ..errors import InvalidArgument
from ..features.owner import OwnerLoader, resolve_owner
from ..jobs import Job
from ..operations import control, reads, scheduling
from ..operations.scheduling import ScheduleOptions
from ..registry import UndoHook
from ..timeutil import Duration
from ..undo import Toast, UndoOutcome
from ..validation import checked_text
from .declarations import FacadeBase


class UndoMethods(FacadeBase):
    """Who the current owner is, and what they can see and undo."""

    def owner_loader(self, loader: OwnerLoader) -> OwnerLoader:
        """Register the function that names the current owner of Undo toasts (a decorator).

        It takes no arguments and returns a string id, or None when nobody is there.
        Without one, the owner is Flask-Login's authenticated user (``get_id()``) when
        the app uses Flask-Login, else an anonymous id kept in this browser's session.
        Toasts and Undo only ever see jobs whose ``owner`` equals this value.
        """
        if not callable(loader):
            raise InvalidArgument("loader", f"expected a function, got {loader!r}")
        self._owner_loader = loader
        return loader

    def current_owner(self, *, create: bool = False) -> str | None:
        """The current owner's id, or None (outside a request, or an anonymous visitor).

        ``create=True`` gives an anonymous visitor a per-browser id (stored in the
        session cookie); only scheduling an undoable job does that.
        """
        return resolve_owner(self._owner_loader, create=create)

    def on_undo(self, name: str) -> Callable[[UndoHook], UndoHook]:
        """Run the decorated ``hook(job)`` when a job called *name* is undone.

        Undone by its owner (:meth:`undo`) or cancelled by an operator
        (:meth:`cancel` with an ``actor``: the dashboard, ``flask defer cancel``);
        :meth:`history` says which. The app's own :meth:`cancel` without an actor
        runs no hooks.

        The hook runs in the Undo's transaction, after the cancel and before the
        commit (with a ``db``, that is ``db.session``'s transaction): restoring a
        soft-deleted row and cancelling its purge commit together or not at all. If
        the hook raises, the error propagates and the Undo is rolled back (with
        ``commit=False``, your transaction holds it: roll it back).
        """
        if not isinstance(name, str) or not name:
            raise InvalidArgument("name", f"expected a job name string, got {name!r}")

        def register(hook: UndoHook) -> UndoHook:
            self.undo_hooks.add(name, hook)
            return hook

        return register

    def undoable(
        self,
        name: str,
        payload: Any = None,
        *,
        window: Duration | None = None,
        done_label: str | None = None,
        failed_label: str | None = None,
        waiting_label: str | None = None,
        undone_label: str | None = None,
        **options: Unpack[ScheduleOptions],
    ) -> Job:
        """Schedule *name* to run after an Undo window, and show its owner an Undo toast.

        The owner sees the toast for ``window`` (default ``DEFER_UNDO_WINDOW``, 5 s);
        the job runs ``DEFER_UNDO_MARGIN`` (1 s) after the window closes, so an Undo
        clicked in the last moment still lands. ``owner`` defaults to the current owner
        (see :meth:`owner_loader`); ``label`` is the toast's text while the action is
        pending: name it in progress ("Sending message"), since the outcome is
        ``done_label``'s to say (without one the toast says "Action scheduled"). The
        other options are :meth:`schedule`'s (``key``, ``replace``, the queue controls
        ...), but not ``run_at`` or ``delay``: the window decides when it runs.

        The toast only says what the server knows, in the texts given for each state:
        ``waiting_label`` once the window closed ("Sending…"), ``done_label`` when the
        job ran ("Sent"), ``failed_label`` when it failed for good ("Couldn't send"),
        ``undone_label`` after an Undo ("Sending undone."). Each has a neutral default.

        Like :meth:`schedule`, the row joins ``db.session``'s transaction: the caller
        commits it together with the business change (and the toast appears once it is
        committed).
        """
        state = self._state()
        if options.get("owner") is None:
            options["owner"] = self.current_owner(create=True)
        texts = {
            "waiting_label": waiting_label,
            "done_label": done_label,
            "failed_label": failed_label,
            "undone_label": undone_label,
        }
        return scheduling.undoable(state, name, payload, window=window, texts=texts, **options)

    def hold(self, id: int, *, seconds: Duration, owner: str | None = None) -> Job:
        """Keep an open Undo window open *seconds* from now (its toast is hovered or focused).

        WCAG 2.2.1 (Timing Adjustable): the person reading the toast can stop its clock.
        One guarded update moves ``undo_until`` to now + *seconds* and ``run_at`` a
        ``DEFER_UNDO_MARGIN`` after it, only while the job is pending with its window
        open, only later, and never more than ``DEFER_UNDO_MAX_HOLD`` past the time it
        was first due (the request is cut to the cap). Returns the job as it now is
        (unchanged when it already runs later, or sits at the cap). A closed window or a
        job that is no longer pending raises :class:`JobNotPending`; no job, or with
        ``owner`` another owner's job, raises :class:`JobNotFound`.
        """
        return control.hold(self._state(), id, seconds, owner)

    def undo(
        self,
        id: int | None = None,
        *,
        key: str | None = None,
        owner: str | None = None,
        commit: bool = True,
    ) -> UndoOutcome:
        """The user's Undo: cancel a pending job, run its ``on_undo`` hooks, say what happened.

        pending → cancelled, :attr:`UndoOutcome.UNDONE` (``on_undo`` hooks run in the
        same transaction: a soft-deleted row is restored together with the cancel of
        its purge). running → ``RUNNING``; done or failed → ``ALREADY_RAN``;
        cancelled → ``ALREADY_UNDONE``; expired → ``EXPIRED``. With ``owner`` (the web
        layer always passes it), a job of another owner raises :class:`JobNotFound`, as
        does no job at all: other people's ids are never confirmed to exist. Runs and commits a
        transaction of its own on ``db.session``, like :meth:`cancel`.

        ``commit=False`` cancels and runs the hooks in the caller's ``db.session``
        transaction and commits nothing (see :meth:`cancel`): a rollback undoes the
        cancel and every hook's writes together. If a hook raises, the error
        propagates and the caller rolls back.
        The history records it as ``undone`` by the owner.
        """
        return control.undo(self._state(), id, key, owner, commit=commit)

    def toasts(
        self,
        owner: str | None = None,
        *,
        now: datetime | None = None,
        limit: int | None = None,
        waiting: bool = False,
    ) -> list[Toast]:
        """*owner*'s live Undo toasts (pending, window still open), newest first.

        ``waiting=True`` adds the toasts whose window closed in the last
        :data:`~flask_defer.undo.WAITING_HORIZON` and whose job has not settled yet
        (what a page renders, so a reload during the wait keeps the toast waiting).
        ``owner`` defaults to the current owner; with none, there are no toasts.
        ``limit`` defaults to ``DEFER_TOAST_LIMIT``.
        """
        state = self._state()
        owner = checked_text(owner, "owner") if owner is not None else self.current_owner()
        if owner is None:
            return []
        return reads.toasts(state, owner, now=now, limit=limit, waiting=waiting)

    def pending_for(self, owner: str | None = None, *, limit: int = 100) -> list[Job]:
        """*owner*'s pending jobs, undoable or scheduled, soonest first.

        ``owner`` defaults to the current owner; with none, the list is empty.
        """
        state = self._state()
        owner = checked_text(owner, "owner") if owner is not None else self.current_owner()
        if owner is None:
            return []
        return reads.pending_for(state, owner, limit=limit)
