"""The confirm step of the dashboard's actions on jobs, for browsers without JavaScript.

With JavaScript, htmx asks first (``hx-confirm``) and POSTs the action. Without it, the
action's button submits a GET to the same URL, which answers with this page: what is
about to happen, and a POST form that does it. So a cancel, a "Run now" (which starts
a job hours early) or a retry (which runs a failed one again, with its effects) is
never one stray click away, and the POST endpoints stay exactly as they are for
scripts and htmx. Only reschedule, whose form already asks for a time, acts at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from flask import Blueprint, abort, render_template, request, url_for
from flask.typing import ResponseReturnValue

from ..i18n import N_, gettext
from ..undo import MAX_JOB_ID
from .access import current_defer, require_operator
from .csrf import csrf_token, field_name
from .job_query import JobQuery
from .pages import uncached_page
from .redirects import safe_local_target


def register(blueprint: Blueprint) -> None:
    """Add the GET confirm pages beside the POST actions they confirm."""
    for rule, endpoint, view in (
        ("/jobs/<int:job_id>/cancel", "dashboard_cancel_confirm", confirm_cancel),
        ("/jobs/<int:job_id>/run-now", "dashboard_run_now_confirm", confirm_run_now),
        ("/jobs/<int:job_id>/retry", "dashboard_retry_confirm", confirm_retry),
        ("/jobs/<int:job_id>/abort", "dashboard_abort_confirm", confirm_abort),
        ("/jobs/cancel", "dashboard_cancel_many_confirm", confirm_cancel_many),
        ("/jobs/retry", "dashboard_retry_many_confirm", confirm_retry_many),
    ):
        blueprint.add_url_rule(rule, endpoint, view, methods=["GET"])


@dataclass(frozen=True, slots=True)
class JobQuestion:
    """What a confirm page for one job asks; catalogue messages (marked ``N_``).

    ``question`` has ``{id}`` and ``{name}``, ``keyed`` also ``{key}`` (for a job with
    a key, which is how most operators know it).
    """

    question: str
    keyed: str
    detail: str
    endpoint: str
    button: str
    danger: bool


CANCEL = JobQuestion(
    N_("Cancel job {id} ({name})?"),
    N_("Cancel job {id} ({name}, key {key})?"),
    N_("A cancelled job never runs; it cannot be undone from here."),
    "defer.dashboard_cancel",
    N_("Yes, cancel it"),
    danger=True,
)
RUN_NOW = JobQuestion(
    N_("Run job {id} ({name}) now?"),
    N_("Run job {id} ({name}, key {key}) now?"),
    N_("It becomes due now, ahead of its time: a worker starts it at once."),
    "defer.dashboard_run_now",
    N_("Yes, run it now"),
    danger=False,
)
RETRY = JobQuestion(
    N_("Retry job {id} ({name})?"),
    N_("Retry job {id} ({name}, key {key})?"),
    N_("It becomes pending, due now, with its attempts reset: it runs again."),
    "defer.dashboard_retry",
    N_("Yes, retry it"),
    danger=False,
)

ABORT = JobQuestion(
    N_("Abort job {id} ({name})?"),
    N_("Abort job {id} ({name}, key {key})?"),
    N_(
        "Its worker asks the handler to stop; a handler that checks "
        "job.abort_requested() stops and the job is cancelled. One that never checks "
        "runs to its end."
    ),
    "defer.dashboard_abort",
    N_("Yes, abort it"),
    danger=True,
)


def _confirm_job(job_id: int, asked: JobQuestion) -> ResponseReturnValue:
    """The confirm page of *asked* for one job (404 for an unknown id)."""
    require_operator()
    if not 1 <= job_id <= MAX_JOB_ID:
        abort(404)
    job = current_defer().get(job_id)
    if job is None:
        abort(404)
    if job.key:
        question = gettext(asked.keyed, id=job.id, name=job.name, key=job.key)
    else:
        question = gettext(asked.question, id=job.id, name=job.name)
    return _page(
        question=question,
        detail=gettext(asked.detail),
        action=url_for(asked.endpoint, job_id=job.id),
        button=gettext(asked.button),
        danger=asked.danger,
        query=None,
    )


def confirm_cancel(job_id: int) -> ResponseReturnValue:
    """Ask before cancelling one job (404 for an unknown id)."""
    return _confirm_job(job_id, CANCEL)


def confirm_run_now(job_id: int) -> ResponseReturnValue:
    """Ask before making one job due now (404 for an unknown id)."""
    return _confirm_job(job_id, RUN_NOW)


def confirm_abort(job_id: int) -> ResponseReturnValue:
    """Ask before aborting one running job (404 for an unknown id)."""
    return _confirm_job(job_id, ABORT)


def confirm_retry(job_id: int) -> ResponseReturnValue:
    """Ask before retrying one failed job (404 for an unknown id)."""
    return _confirm_job(job_id, RETRY)


def _confirm_bulk(
    doc: str, question: str, detail: str, endpoint: str, button: str, *, danger: bool
) -> Callable[[], ResponseReturnValue]:
    """A confirm page for a bulk action over the filtered rows; *question* names them.

    *question*, *detail* and *button* are catalogue messages (marked ``N_``), translated
    when the page is asked for, in the operator's locale.
    """

    def confirm() -> ResponseReturnValue:
        require_operator()
        query = JobQuery.from_args(request.args)
        return _page(
            question=gettext(question, matching=_matching(query)),
            detail=gettext(detail),
            action=url_for(endpoint),
            button=gettext(button),
            danger=danger,
            query=query,
        )

    confirm.__doc__ = doc
    return confirm


confirm_cancel_many = _confirm_bulk(
    "Ask before cancelling every pending job of the filter.",
    N_("Cancel every pending job {matching}?"),
    N_("Cancelled jobs never run; running ones are left to finish."),
    "defer.dashboard_cancel_many",
    N_("Yes, cancel them"),
    danger=True,
)
confirm_retry_many = _confirm_bulk(
    "Ask before retrying every failed job of the filter.",
    N_("Retry every failed job {matching}?"),
    N_("Each becomes pending, due now, with its attempts reset."),
    "defer.dashboard_retry_many",
    N_("Yes, retry them"),
    danger=False,
)


#: The filters a confirm question names, in the reader's words.
FILTER_NAMES = {"name": N_("name"), "key_prefix": N_("key prefix"), "owner": N_("owner")}


def _matching(query: JobQuery) -> str:
    """What a bulk action acts on: "matching name 'x', owner 'y'", or "in the table"."""
    parts = [
        f"{gettext(FILTER_NAMES[name])} {value!r}"
        for name, value in query.filters.items()
        if value is not None and name in FILTER_NAMES
    ]
    if not parts:
        return gettext("in the table")
    return gettext("matching {filters}", filters=", ".join(parts))


def _page(
    *, question: str, detail: str, action: str, button: str, danger: bool, query: JobQuery | None
) -> ResponseReturnValue:
    back = safe_local_target(request.args.get("next")) or url_for("defer.dashboard")
    # Never cached, as every dashboard page: it carries the CSRF token and the job.
    return uncached_page(
        render_template(
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
    )
