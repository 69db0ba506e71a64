"""The dashboard's Workers page: every worker, its queues, threads, held jobs, heartbeat.

Read-only; it refreshes itself like the other pages (htmx, only while JavaScript runs).
"""

from __future__ import annotations

from flask import Blueprint, render_template, url_for
from flask.typing import ResponseReturnValue

from ..timeutil import utcnow
from .access import current_defer, operators_only
from .pages import form_context, page_context, refresh_seconds, uncached_page, wants_fragment

#: Job ids a worker's row links to; past that it says how many more.
RUNNING_SHOWN = 10


def register(blueprint: Blueprint) -> None:
    """Add the Workers page (GET) to *blueprint*."""
    blueprint.add_url_rule("/workers", "dashboard_workers", workers_page, methods=["GET"])


@operators_only
def workers_page() -> ResponseReturnValue:
    """Every worker (live first), with what it serves and holds, and its last heartbeat."""
    context = {
        "workers": current_defer().workers(),
        "now": utcnow(),
        "here": url_for("defer.dashboard_workers"),
        "refresh_seconds": refresh_seconds(),
        "running_shown": RUNNING_SHOWN,
        **form_context(),
    }
    if wants_fragment():
        return uncached_page(render_template("defer/_dashboard_workers.html", **context))
    return uncached_page(
        render_template("defer/dashboard_workers.html", **context, **page_context())
    )
