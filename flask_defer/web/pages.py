"""What every page of the dashboard shares: fragments, caching, forms and flashes.

The job list, the queues page and the schedules page each render a full page or, for
htmx, a fragment of it; they read these helpers from here, below all three, so that
the module registering the pages (:mod:`.dashboard`) is not imported back by them.
"""

from __future__ import annotations

from typing import Any, cast

from flask import Response, get_flashed_messages, request

from .access import current_defer
from .csrf import csrf_token, field_name
from .dashboard_actions import FLASH_OK, FLASH_REFUSED
from .responses import is_htmx, no_store


def wants_fragment() -> bool:
    """True when htmx asks for a part of the page (not a history restore of all of it)."""
    return is_htmx() and request.headers.get("HX-History-Restore-Request") != "true"


def uncached_page(body: str) -> Response:
    """A dashboard page or fragment: never cached, and varying on ``HX-Request``
    (the list's URL serves both the page and its fragment)."""
    return no_store(body, vary_htmx=True)


def form_context() -> dict[str, Any]:
    """The CSRF token and field every action form carries."""
    return {"csrf_token": csrf_token(), "csrf_field": field_name()}


def page_context() -> dict[str, Any]:
    """What only full pages need: the outcomes of no-JavaScript actions."""
    flashed = cast(
        "list[tuple[str, str]]",
        get_flashed_messages(with_categories=True, category_filter=[FLASH_OK, FLASH_REFUSED]),
    )
    return {
        "flashed": [(category == FLASH_OK, str(text)) for category, text in flashed],
        "home_url": current_defer().config.dashboard_home_url,
    }


def refresh_seconds() -> float:
    """How often an open page refreshes itself (0: never)."""
    return current_defer().config.dashboard_refresh.total_seconds()
