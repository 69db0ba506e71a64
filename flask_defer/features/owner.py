"""Who "the current owner" of an Undo toast is.

Toasts and Undo only ever see jobs whose ``owner`` column equals the current owner, so
this is the security boundary of the Undo UI. The default answer is Flask-Login's
authenticated user when the app uses Flask-Login, and otherwise an anonymous,
unguessable per-browser id kept in Flask's session cookie (which Flask signs, so a
browser cannot claim another browser's id). Apps with their own notion of identity
register a loader with ``@defer.owner_loader``.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

from flask import current_app, has_request_context, session

from ..errors import NotConfigured

#: A function returning the current owner's id, or None when there is none.
OwnerLoader = Callable[[], "str | None"]

#: The session key of the anonymous per-browser id.
SESSION_KEY = "_defer_owner"
#: Prefix of anonymous ids, so they can never equal a user id such as "42".
BROWSER_PREFIX = "browser:"


def flask_login_owner() -> str | None:
    """The authenticated Flask-Login user's ``get_id()``, or None.

    None when Flask-Login is not installed, not set up on this app, or the visitor is
    anonymous.
    """
    if getattr(current_app, "login_manager", None) is None:
        return None
    try:
        from flask_login import current_user  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - the app has a login_manager, so it is installed
        return None
    if not current_user or not current_user.is_authenticated:
        return None
    user_id = current_user.get_id()
    return str(user_id) if user_id is not None else None


def browser_owner(*, create: bool) -> str | None:
    """This browser's anonymous id from the session; made and stored if *create*.

    Reading toasts never creates an id (so merely visiting a page sets no cookie);
    scheduling an undoable job does.
    """
    if not has_request_context():
        return None
    value = session.get(SESSION_KEY)
    if isinstance(value, str) and value.startswith(BROWSER_PREFIX):
        return value
    if not create:
        return None
    require_secret_key()
    value = BROWSER_PREFIX + secrets.token_urlsafe(18)
    session[SESSION_KEY] = value
    return value


def require_secret_key() -> None:
    """Raise :class:`NotConfigured` naming ``SECRET_KEY`` when the app has none.

    The Undo UI keeps the anonymous owner id and its own CSRF token in Flask's signed
    session, which needs ``SECRET_KEY``; so do the dashboard's forms, for their CSRF
    token. Without this check the first ``undoable()``
    would die deep in Flask with "The session is unavailable"; checked here, at the
    first call that needs the session and before any row is written, because apps
    that only schedule jobs and run a worker never need a secret key.
    """
    if not current_app.secret_key:
        raise NotConfigured(
            "the Undo UI and the jobs dashboard keep an owner id and a CSRF token in "
            "Flask's session, which needs a secret key: set app.config['SECRET_KEY'] "
            "(e.g. from the environment) before using undoable(), soft_delete(), "
            "defer_toasts() or the dashboard"
        )


def default_owner(*, create: bool = False) -> str | None:
    """Flask-Login's user when there is one, else this browser's anonymous id."""
    if not has_request_context():
        return None
    return flask_login_owner() or browser_owner(create=create)


def resolve_owner(loader: OwnerLoader | None, *, create: bool) -> str | None:
    """Ask the app's loader, or the default one; refuse answers that are not text."""
    if loader is None:
        return default_owner(create=create)
    value = loader()
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 255:
        raise TypeError(
            f"the owner loader must return a non-empty string of at most 255 characters "
            f"or None, got {value!r}"
        )
    return value
