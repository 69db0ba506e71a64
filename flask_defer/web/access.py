"""Who may use the dashboard and the metrics: closed unless the app says otherwise.

The dashboard shows every user's jobs and can cancel them, so it answers 403 unless
the app's ``@defer.dashboard_auth`` hook lets the request in, or the app runs in
debug mode. The metrics endpoint follows the same rule unless
``DEFER_METRICS_PUBLIC`` is set.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import TypeVar

from flask import abort
from flask.typing import ResponseReturnValue

from ..facade import current_defer
from ..features.owner import flask_login_owner
from ..i18n import gettext

__all__ = ["current_defer", "operator", "operators_only", "require_operator"]

#: Who a dashboard action is in the job history when no Flask-Login user is signed in.
DASHBOARD_ACTOR = "dashboard"

V = TypeVar("V", bound=Callable[..., ResponseReturnValue])


def require_operator() -> None:
    """Abort with 403 unless this request may use the dashboard."""
    if not current_defer().dashboard_allowed():
        abort(403, description=gettext("The jobs dashboard is not open to this request."))


def operator() -> str:
    """Who is acting in this dashboard request, for the job history.

    Flask-Login's user id when one is signed in (the same id the Undo UI uses as the
    owner), else ``"dashboard"``: an app that opens the dashboard by another hook
    still gets an honest "somebody on the dashboard" rather than "app".
    """
    return flask_login_owner() or DASHBOARD_ACTOR


def operators_only(view: V) -> V:
    """Decorate a dashboard view: 403 before anything else unless authorised."""

    @wraps(view)
    def guarded(*args: object, **kwargs: object) -> ResponseReturnValue:
        require_operator()
        return view(*args, **kwargs)

    return guarded  # type: ignore[return-value]
