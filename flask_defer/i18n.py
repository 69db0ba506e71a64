"""flask_defer's words in the reader's language: Flask-Babel when the app uses it.

The blueprint's pages and toasts use it, and so does ``defer.explain`` (its reasons'
texts), which is why it stands low, beside validation, not in the web package.

Every user-facing string of the toasts, outcomes and pages goes through
:func:`gettext`. With Flask-Babel installed and initialised on the app (``Babel(app)``),
the text comes from flask_defer's own catalogue (domain ``flask_defer``, shipped in the
package under ``translations/``), in the locale the app's Babel selects; otherwise it
is the English message id itself, so the extension works without the extra.
Placeholders use ``str.format`` names (``{label}``), filled in after translation.
"""

from __future__ import annotations

from datetime import timedelta
from functools import cache
from pathlib import Path
from typing import Any

from flask import current_app, has_app_context

#: The catalogue's folder (``<lang>/LC_MESSAGES/flask_defer.mo``) and gettext domain.
TRANSLATIONS_DIR = Path(__file__).resolve().parent / "translations"
DOMAIN = "flask_defer"


@cache
def _domain() -> Any:
    try:
        from flask_babel import Domain  # type: ignore[import-untyped]
    except ImportError:
        return None
    return Domain(translation_directories=str(TRANSLATIONS_DIR), domain=DOMAIN)


def _babel_active() -> bool:
    return has_app_context() and "babel" in current_app.extensions and _domain() is not None


def gettext(text: str, **variables: Any) -> str:
    """*text* translated to the current locale, then ``{name}`` placeholders filled."""
    if _babel_active():
        text = str(_domain().get_translations().gettext(text))
    return text.format(**variables) if variables else text


def pgettext(context: str, text: str, **variables: Any) -> str:
    """*text* as meant in *context*: one English word, two translations.

    "Scheduled" heads a column of counts on the dashboard and names an event in a job's
    history; French says "Planifiées" for the one and "Planifiée" for the other.
    """
    if _babel_active():
        text = str(_domain().get_translations().pgettext(context, text))
    return text.format(**variables) if variables else text


def ngettext(singular: str, plural: str, count: int, **variables: Any) -> str:
    """The singular or plural form for *count* (``{count}`` is filled in, with the rest)."""
    if _babel_active():
        text = str(_domain().get_translations().ngettext(singular, plural, count))
    else:
        text = singular if count == 1 else plural
    return text.format(count=count, **variables)


def N_(text: str) -> str:
    """*text* unchanged, marked for the catalogue (``gettext_noop``).

    For tables built at import time (no request, no locale yet): ``pybabel extract``
    finds the string here, and the code that shows it calls :func:`gettext` then.
    """
    return text


def format_number(value: int) -> str:
    """*value* with the reader's digit grouping ("10,000"; "10.000" in German)."""
    if _babel_active():
        from babel.numbers import format_decimal
        from flask_babel import get_locale

        locale = get_locale()
        if locale is not None:
            return str(format_decimal(value, locale=locale))
    return f"{value:,}"


def locale_tag() -> str | None:
    """The current locale as a BCP 47 tag ("de-DE") for the browser's ``Intl``, or None."""
    if not _babel_active():
        return None
    from flask_babel import get_locale

    locale = get_locale()
    return str(locale).replace("_", "-") if locale is not None else None


def format_seconds(seconds: float) -> str:
    """A short human duration in the reader's locale ("4 s"; "4 Sek." in German).

    English keeps the compact :func:`plain_seconds`; other locales get Babel's short
    unit forms, which also round the way their readers expect ("2 Std.").
    """
    if _babel_active():
        from babel.dates import format_timedelta
        from flask_babel import get_locale

        locale = get_locale()
        if locale is not None and locale.language != "en":
            total = max(int(seconds + 0.999), 0)
            return str(
                format_timedelta(
                    timedelta(seconds=total), threshold=1.5, format="short", locale=locale
                )
            )
    return plain_seconds(seconds)


def plain_seconds(seconds: float) -> str:
    """A short English duration: "4 s", "3 min", "2 h 5 min", "3 days"."""
    total = max(int(seconds + 0.999), 0)
    if total < 60:
        return f"{total} s"
    minutes = total // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{hours // 24} days"
