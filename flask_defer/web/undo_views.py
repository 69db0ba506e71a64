"""The Undo endpoints: toasts fragment, Undo (htmx and plain form), pending actions page.

Every view works for "the current owner" only and calls the facade; a job id that is
not the owner's answers 404 exactly like an id that does not exist.
"""

from __future__ import annotations

from flask import (
    Blueprint,
    abort,
    flash,
    redirect,
    render_template,
    request,
    url_for,
)
from flask.typing import ResponseReturnValue

from ..errors import JobNotFound
from ..timeutil import utcnow
from .access import current_defer
from .csrf import csrf_token, field_name, require_csrf
from .redirects import path_of, safe_local_target
from .responses import is_htmx, no_store
from .toasts import page_of_fragment_request, toast_context


def register(blueprint: Blueprint) -> None:
    """Add the Undo views to *blueprint*."""
    blueprint.add_url_rule("/toasts", "toasts", toasts_fragment, methods=["GET"])
    blueprint.add_url_rule("/undo/<int:job_id>", "undo", undo, methods=["POST"])
    blueprint.add_url_rule("/pending", "pending", pending_page, methods=["GET"])
    blueprint.add_app_template_filter(format_seconds, "defer_seconds")


def format_seconds(seconds: float) -> str:
    """A short human duration for the pending page: "4 s", "3 min", "2 h 5 min", "3 days"."""
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


def toasts_fragment() -> ResponseReturnValue:
    """The current owner's live toasts as HTML (the toast region refreshes from it)."""
    return no_store(
        render_template("defer/_toast_list.html", **toast_context(page=page_of_fragment_request()))
    )


def undo(job_id: int) -> ResponseReturnValue:
    """Undo the current owner's job: an outcome fragment for htmx, else a redirect back."""
    require_csrf()
    defer = current_defer()
    owner = defer.current_owner()
    if owner is None:
        abort(404)
    try:
        outcome = defer.undo(job_id, owner=owner)
    except JobNotFound:
        abort(404)
    job = defer.get(job_id)
    label = job.label if job is not None else None
    text = outcome.describe(label)
    if is_htmx():
        return no_store(
            render_template("defer/_outcome.html", outcome=outcome, text=text, job=job)
        )
    flash(text, f"defer-{outcome.value}")
    target = safe_local_target(request.form.get("next")) or url_for("defer.pending")
    return redirect(target, code=303)


def pending_page() -> ResponseReturnValue:
    """The owner's pending jobs: undoable ones with their window, scheduled ones with run_at."""
    defer = current_defer()
    now = utcnow()
    jobs = defer.pending_for()
    return no_store(
        render_template(
            "defer/pending.html",
            jobs=jobs,
            now=now,
            csrf_token=csrf_token() if jobs else "",
            csrf_field=field_name(),
            back_url=path_of(request.referrer, request.host_url),
        )
    )
