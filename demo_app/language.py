"""The language switch: English, Deutsch, Français for flask_defer's own texts.

flask_defer translates its toasts, outcomes, pending page and dashboard through the
app's Flask-Babel, in the locale the app selects. ``Babel(app)`` alone would always
select English; the demo's selector takes the reader's choice from the session, then
the browser's ``Accept-Language``. The demo's own pages stay in English.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Flask, abort, redirect, request, session, url_for
from flask_babel import Babel, get_locale

from .users import _local

#: The languages flask_defer ships a catalogue for, with their names in themselves.
LANGUAGES = {"en": "English", "de": "Deutsch", "fr": "Français"}

bp = Blueprint("language", __name__)


def select_locale() -> str | None:
    """The reader's choice (the switch), else the best of the browser's languages."""
    chosen = session.get("language")
    if chosen in LANGUAGES:
        return str(chosen)
    return request.accept_languages.best_match(list(LANGUAGES))


def init_app(app: Flask) -> None:
    Babel(app, locale_selector=select_locale)
    app.register_blueprint(bp)
    app.context_processor(_language_context)


def _language_context() -> dict[str, Any]:
    locale = get_locale()
    return {"languages": LANGUAGES, "language": locale.language if locale else "en"}


@bp.post("/language")
def choose() -> Any:
    """Remember the reader's language (a CSRF-protected form) and go back to the page."""
    language = request.form.get("language", "")
    if language not in LANGUAGES:
        abort(400, description=f"Pick one of {', '.join(LANGUAGES)}.")
    session["language"] = language
    return redirect(_local(request.form.get("next")) or url_for("home"), code=303)
