"""The confirm step of the dashboard's destructive actions, for browsers without JavaScript.

With JavaScript, htmx asks first (``hx-confirm``) and POSTs the action. Without it, the
action's button submits a GET to the same URL, which answers with this page: what is
about to happen, and a POST form that does it. So a cancel is never one stray click
away, and the POST endpoints stay exactly as they are for scripts and htmx.
"""

from __future__ import annotations

from collections.abc import Callable

from flask import Blueprint, abort, render_template, request, url_for
from flask.typing import ResponseReturnValue

from ..undo import MAX_JOB_ID
from .access import current_defer, require_operator
from .csrf import csrf_token, field_name
from .job_query import JobQuery
from .redirects import safe_local_target


def register(blueprint: Blueprint) -> None:
    """Add the GET confirm pages beside the POST actions they confirm."""
    for rule, endpoint, view in (
        ("/jobs/<int:job_id>/cancel", "dashboard_cancel_confirm", confirm_cancel),
        ("/jobs/cancel", "dashboard_cancel_many_confirm", confirm_cancel_many),
        ("/jobs/retry", "dashboard_retry_many_confirm", confirm_retry_many),
    ):
        blueprint.add_url_rule(rule, endpoint, view, methods=["GET"])


def confirm_cancel(job_id: int) -> ResponseReturnValue:
    """Ask before cancelling one job (404 for an unknown id)."""
    require_operator()
    if not 1 <= job_id <= MAX_JOB_ID:
        abort(404)
    job = current_defer().get(job_id)
    if job is None:
        abort(404)
    what = f"job {job.id} ({job.name}{', key ' + job.key if job.key else ''})"
    return _page(
        question=f"Cancel {what}?",
        detail="A cancelled job never runs; it cannot be undone from here.",
        action=url_for("defer.dashboard_cancel", job_id=job.id),
        button="Yes, cancel it",
        danger=True,
        query=None,
    )


def _confirm_bulk(
    doc: str, question: str, detail: str, endpoint: str, button: str, *, danger: bool
) -> Callable[[], ResponseReturnValue]:
    """A confirm page for a bulk action over the filtered rows; *question* names them."""

    def confirm() -> ResponseReturnValue:
        require_operator()
        query = JobQuery.from_args(request.args)
        return _page(
            question=question.format(matching=_matching(query)),
            detail=detail,
            action=url_for(endpoint),
            button=button,
            danger=danger,
            query=query,
        )

    confirm.__doc__ = doc
    return confirm


confirm_cancel_many = _confirm_bulk(
    "Ask before cancelling every pending job of the filter.",
    "Cancel every pending job {matching}?",
    "Cancelled jobs never run; running ones are left to finish.",
    "defer.dashboard_cancel_many",
    "Yes, cancel them",
    danger=True,
)
confirm_retry_many = _confirm_bulk(
    "Ask before retrying every failed job of the filter.",
    "Retry every failed job {matching}?",
    "Each becomes pending, due now, with its attempts reset.",
    "defer.dashboard_retry_many",
    "Yes, retry them",
    danger=False,
)


def _matching(query: JobQuery) -> str:
    parts = [
        f"{name.replace('_', ' ')} {value!r}"
        for name, value in query.filters.items()
        if value is not None and name != "status"
    ]
    return "matching " + ", ".join(parts) if parts else "in the table"


def _page(
    *, question: str, detail: str, action: str, button: str, danger: bool, query: JobQuery | None
) -> ResponseReturnValue:
    back = safe_local_target(request.args.get("next")) or url_for("defer.dashboard")
    return render_template(
        "defer/dashboard_confirm.html",
        question=question,
        detail=detail,
        action=action,
        button=button,
        danger=danger,
        query=query,
        back_url=back,
        here=back,
        csrf_token=csrf_token(),
        csrf_field=field_name(),
        home_url=current_defer().config.dashboard_home_url,
    )
