"""CSRF protection for the blueprint's state-changing requests.

When the app uses Flask-WTF's ``CSRFProtect`` (``app.extensions["csrf"]``), its token
is the one issued and checked, so an app has one CSRF story. Otherwise the extension
keeps its own random token in the (signed) session and compares in constant time.
Either way the token travels in the ``X-CSRFToken`` header (htmx) or in the
``csrf_token`` form field (the no-JavaScript form).
"""

from __future__ import annotations

import hmac
import secrets

from flask import abort, current_app, request, session

from ..features.owner import require_secret_key
from ..i18n import gettext

#: The session key of the extension's own token.
SESSION_KEY = "_defer_csrf"
#: Headers a token is accepted from (Flask-WTF's defaults).
HEADERS = ("X-CSRFToken", "X-CSRF-Token")
#: The form field of the no-JavaScript path.
FIELD_NAME = "csrf_token"


def uses_flask_wtf() -> bool:
    """True when the current app has Flask-WTF's CSRFProtect set up."""
    return current_app.extensions.get("csrf") is not None


def field_name() -> str:
    """The form field the token is posted in (Flask-WTF's setting when it is in use)."""
    if uses_flask_wtf():
        return str(current_app.config.get("WTF_CSRF_FIELD_NAME", FIELD_NAME))
    return FIELD_NAME


def csrf_token() -> str:
    """The token to put in forms and the htmx header for this browser."""
    if uses_flask_wtf():
        from flask_wtf.csrf import generate_csrf  # type: ignore[import-untyped]

        return str(generate_csrf())
    token = session.get(SESSION_KEY)
    if not isinstance(token, str) or len(token) < 32:
        require_secret_key()
        token = secrets.token_urlsafe(32)
        session[SESSION_KEY] = token
    return token


def submitted_token() -> str | None:
    """The token the request carries, from a header or the form."""
    for header in HEADERS:
        value = request.headers.get(header)
        if value:
            return value
    value = request.form.get(field_name())
    return value or None


def require_csrf() -> None:
    """Abort with 400 unless the request carries this browser's valid token."""
    token = submitted_token()
    if token is None:
        abort(400, description=gettext("The CSRF token is missing."))
    if uses_flask_wtf():
        # wtforms' ValidationError, re-exported by flask_wtf.csrf.
        from flask_wtf.csrf import ValidationError, validate_csrf

        try:
            validate_csrf(token)
        except ValidationError as error:
            abort(400, description=gettext("The CSRF token is invalid: {error}", error=error))
        return
    expected = session.get(SESSION_KEY)
    if not isinstance(expected, str) or not hmac.compare_digest(expected.encode(), token.encode()):
        abort(400, description=gettext("The CSRF token is invalid or has expired."))
