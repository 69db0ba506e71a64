"""``{{ defer_toasts() }}``: the current owner's Undo toasts, rendered on the server.

Rendering them from the owner's pending rows on every page is what makes a toast
survive a reload or a navigation with the right remaining time. The outcome of a
no-JavaScript Undo arrives as a flashed message and is shown in the same place.
"""

from __future__ import annotations

from typing import Any, cast

from flask import (
    g,
    get_flashed_messages,
    has_request_context,
    render_template,
    request,
)
from markupsafe import Markup

from ..i18n import locale_tag
from ..undo import Toast, UndoOutcome
from .access import current_defer
from .csrf import csrf_token, field_name
from .redirects import path_of, safe_local_target

#: Flash categories of the no-JavaScript Undo's outcomes ("defer-undone", ...).
FLASH_CATEGORIES = {f"defer-{outcome.value}": outcome for outcome in UndoOutcome}


def defer_toasts(*, assets: bool = True, htmx: bool = True) -> Markup:
    """The toast region with the current owner's live toasts (a Jinja global).

    The first call in a request also links the blueprint's stylesheet and script
    (``assets=False`` to link them yourself) and the vendored htmx (``htmx=False`` when
    the page loads its own htmx 2). Outside a request it renders nothing.
    """
    if not has_request_context():
        return Markup("")
    first = not g.get("_defer_assets_included")
    g._defer_assets_included = True
    return Markup(
        render_template(
            "defer/toasts.html",
            include_assets=assets and first,
            include_htmx=htmx,
            flashed=_flashed_outcomes(),
            **toast_context(page=_current_page()),
        )
    )


def toast_context(*, page: str | None) -> dict[str, Any]:
    """What ``defer/_toast_list.html`` needs: the toasts, a CSRF token, the way back."""
    # Open and waiting toasts: a reload while the job is still on its way keeps the
    # toast waiting instead of dropping it.
    toasts: list[Toast] = current_defer().toasts(waiting=True)
    return {
        "toasts": toasts,
        "locale": locale_tag(),
        # A token is only needed (and the session only touched) when there is a form.
        "csrf_token": csrf_token() if toasts else "",
        "csrf_field": field_name(),
        "next_page": page or "",
    }


def _current_page() -> str | None:
    query = request.query_string.decode("latin-1")
    return safe_local_target(request.path + (f"?{query}" if query else ""))


def page_of_fragment_request() -> str | None:
    """The page an htmx fragment request was made from (htmx sends ``HX-Current-URL``)."""
    return path_of(request.headers.get("HX-Current-URL"), request.host_url)


def _flashed_outcomes() -> list[tuple[UndoOutcome, str]]:
    # Flashed by the no-JavaScript Undo: the outcome sentence, already translated.
    flashed = cast(
        "list[tuple[str, str]]",
        get_flashed_messages(with_categories=True, category_filter=list(FLASH_CATEGORIES)),
    )
    return [(FLASH_CATEGORIES[category], str(message)) for category, message in flashed]
