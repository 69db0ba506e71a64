"""``Defer``'s operator-dashboard methods: who may use it, run now, counts, bulk retry."""

from __future__ import annotations

from typing import Unpack

from flask import current_app

from ..errors import InvalidArgument
from ..jobs import Job
from ..operations import control, reads
from ..operations.reads import Filters
from ..timeutil import utcnow
from ..validation import checked_actor
from .declarations import DashboardAuth, FacadeBase


class DashboardMethods(FacadeBase):
    """What the dashboard needs beyond the control methods every caller has."""

    def dashboard_auth(self, hook: DashboardAuth) -> DashboardAuth:
        """Register who may use the dashboard (and the metrics endpoint); a decorator.

        The hook takes no arguments and runs inside the request; the dashboard answers
        403 unless it returns a true value. It may also raise an HTTP exception itself, say
        ``abort(401)`` or a redirect to the login page. Without a hook the dashboard
        is closed, except while ``app.debug`` is on::

            @defer.dashboard_auth
            def operators_only():
                return current_user.is_authenticated and current_user.is_admin
        """
        if not callable(hook):
            raise InvalidArgument("hook", f"expected a function, got {hook!r}")
        self._dashboard_auth = hook
        return hook

    def dashboard_allowed(self) -> bool:
        """True when the current request may use the dashboard (debug mode, or the hook)."""
        if current_app.debug:
            return True
        return self._dashboard_auth is not None and bool(self._dashboard_auth())

    def run_now(self, id: int, *, actor: str | None = None, commit: bool = True) -> Job:
        """Make a pending job due now and return it (the dashboard's "Run now").

        One guarded statement, like :meth:`reschedule`: pending → due now. A running or
        settled job raises :class:`JobNotPending`; an unknown id :class:`JobNotFound`.
        ``commit=False`` joins the caller's transaction, as for :meth:`cancel`.
        """
        return control.reschedule(
            self._state(),
            id,
            None,
            utcnow(),
            None,
            checked_actor(actor),
            commit=commit,
            operation="run_now",
            event="run_now",
        )

    def count(self, *, limit: int | None = None, **filters: Unpack[Filters]) -> int:
        """How many jobs match every given filter (the filters of :meth:`list`).

        With ``limit``, counting stops there: the answer is ``min(count, limit)``, read
        from at most ``limit`` rows, so a page over a huge history stays cheap.
        """
        return reads.count(self._state(), filters, limit=limit)

    def retry_many(
        self, *, actor: str | None = None, **filters: Unpack[Filters]
    ) -> int:
        """Put every failed job matching the filters back to pending, due now; how many.

        Attempts are reset, as with :meth:`retry`. Jobs in any other state are left
        alone (one guarded statement), so a ``status`` filter without ``failed`` in it
        retries nothing. Without filters, every failed job is retried.
        """
        return control.retry_many(self._state(), filters, checked_actor(actor))
