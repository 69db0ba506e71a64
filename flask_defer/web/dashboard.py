"""The operator dashboard's pages: health figures, the filtered job list, one job.

A browser's navigation gets full pages. With ``HX-Request`` the list answers only its
own fragment, with the health figures swapped in out of band: that is what the
page's periodic refresh and its filter form ask for, so the page updates without a
reload. Like every view of the blueprint, these call the facade (``list``,
``count``, ``get``, ``health``) and hold no SQL.
"""

from __future__ import annotations

import math
from typing import Any

from flask import (
    Blueprint,
    abort,
    render_template,
    request,
    url_for,
)
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import BadRequest

from ..i18n import gettext
from ..jobs import JobStatus
from ..operations.health import SCHEDULED_COUNT_CAP, SETTLED_COUNT_CAP, Health
from ..timeutil import utcnow
from ..undo import MAX_JOB_ID
from . import (
    activity,
    dashboard_actions,
    dashboard_confirm,
    formatting,
    metrics_view,
    queues,
    recurring,
    workers,
)
from .access import current_defer, operators_only
from .dashboard_actions import ActionOutcome
from .job_query import JobQuery
from .pages import form_context, page_context, refresh_seconds, uncached_page, wants_fragment
from .redirects import path_of
from .responses import is_htmx, no_store

#: The id of the list's element; htmx names it in ``HX-Trigger`` when it refreshes.
LIST_ID = "defer-jobs"
#: The job list's total is counted up to this many rows ("10,000+" past it).
LIST_COUNT_CAP = 10_000


def register(blueprint: Blueprint) -> None:
    """Add the dashboard's pages, actions, filters and the metrics endpoint."""
    blueprint.add_url_rule("/", "dashboard", dashboard, methods=["GET"])
    blueprint.add_url_rule("/jobs/<int:job_id>", "dashboard_job", job_page, methods=["GET"])
    dashboard_actions.register(blueprint)
    dashboard_confirm.register(blueprint)
    recurring.register(blueprint)
    queues.register(blueprint)
    workers.register(blueprint)
    activity.register(blueprint)
    metrics_view.register(blueprint)
    formatting.register(blueprint)
    blueprint.register_error_handler(400, _bad_request)


def _bad_request(error: BadRequest) -> ResponseReturnValue:
    """For htmx on the dashboard, a 400 says why in the page's outcome region."""
    endpoint = request.endpoint or ""
    if not endpoint.startswith("defer.dashboard") or not is_htmx():
        return error
    outcome = ActionOutcome(False, error.description or gettext("The request was refused."))
    return no_store((render_template("defer/_dashboard_outcome.html", outcome=outcome), 400))


@operators_only
def dashboard() -> ResponseReturnValue:
    """The health figures and the job list (or, for htmx, the list's fragment)."""
    query = JobQuery.from_args(request.args)
    context = list_context(query)
    if wants_fragment():
        response = uncached_page(render_template("defer/_dashboard_jobs.html", oob=True, **context))
        if request.headers.get("HX-Trigger") != LIST_ID:
            # The filter form or a page link: the address bar follows, so a reload or
            # a shared link shows the same list. The list's own refresh pushes nothing.
            response.headers["HX-Push-Url"] = context["here"]
        return response
    return uncached_page(render_template("defer/dashboard.html", **context, **page_context()))


#: Parents and children the job page lists by name (a group may have 1,000 members).
RELATED_SHOWN = 50


@operators_only
def job_page(job_id: int) -> ResponseReturnValue:
    """One job: its times, attempts, payload, result, errors and history, with actions.

    The history is a timeline of every state change: who caused it, which attempt,
    and each failed attempt's error (``last_error`` keeps only the latest).
    """
    if not 1 <= job_id <= MAX_JOB_ID:
        abort(404)
    job = current_defer().get(job_id)
    if job is None:
        abort(404)
    context: dict[str, Any] = {
        "job": job,
        # Whether its queue or name is paused (a note beside a pending job's status).
        "paused": tuple(pause.label for pause in current_defer().paused()),
        "history": current_defer().history(job.id),
        # Its workflow: the jobs it runs after (a group's members) and those after it.
        "parents": current_defer().parents(job),
        "children": current_defer().children(job, limit=RELATED_SHOWN + 1),
        "related_shown": RELATED_SHOWN,
        # Why a pending job has not started (at most five queries).
        "reasons": current_defer().explain(job.id) if job.status.value == "pending" else [],
        # A due rate-limited job whose bucket is full right now says so.
        "rate_limited": (
            job.rate_limit is not None
            and job.status.value == "pending"
            and job.concurrency_key in current_defer().health().rate_limited
        ),
        "history_on": current_defer().config.history,
        "now": utcnow(),
        "here": url_for("defer.dashboard_job", job_id=job.id),
        "refresh_seconds": refresh_seconds(),
        **form_context(),
    }
    if wants_fragment():
        return uncached_page(render_template("defer/_dashboard_job.html", **context))
    return uncached_page(
        render_template(
            "defer/dashboard_job.html", back_url=_back_to_list(), **context, **page_context()
        )
    )


def list_context(query: JobQuery) -> dict[str, Any]:
    """What the list fragment and the health figures need."""
    defer = current_defer()
    size = defer.config.dashboard_page_size
    now = utcnow()
    health = defer.health(now=now)
    offset = (query.page - 1) * size
    # A bounded count: an open dashboard refreshes every few seconds, and counting a
    # million rows of history each time is what made it slow. Past the bound the
    # page says "10,000+" and offers one more page than it has counted. (An ungrouped
    # count of ids reads 10,000 index entries in about a millisecond.)
    bound = max(LIST_COUNT_CAP, offset + size) + 1
    total = defer.count(**query.filters, limit=bound)
    total_is_lower_bound = total >= bound
    if total_is_lower_bound:
        total -= 1
    jobs = defer.list(**query.filters, limit=size, offset=offset)
    names = sorted({item.name for item in health.by_name} | set(defer.registry.names()))
    return {
        "query": query,
        "jobs": jobs,
        "total": total,
        "total_is_lower_bound": total_is_lower_bound,
        "first": offset + 1,
        "last": offset + len(jobs),
        "pages": max(math.ceil(total / size), 1) + (1 if total_is_lower_bound else 0),
        "health": health,
        "paused": health.paused,
        "settled_cap": SETTLED_COUNT_CAP,
        "scheduled_cap": SCHEDULED_COUNT_CAP,
        "now": now,
        "names": names,
        "statuses": list(JobStatus),
        "bulk": bulk_counts(query, health),
        "here": url_for("defer.dashboard", **query.args()),
        "refresh_seconds": refresh_seconds(),
        **form_context(),
    }


def bulk_counts(query: JobQuery, health: Health) -> dict[str, int | None]:
    """How many failed and pending jobs a bulk action would touch, when health knows.

    Known without another query when the list is filtered by status and name only;
    ``None`` (unknown) under a key prefix or owner filter.
    """
    counts: dict[str, int] | None = None
    if query.key_prefix is None and query.owner is None:
        if query.name is None:
            counts = health.counts
        else:
            item = next((h for h in health.by_name if h.name == query.name), None)
            counts = item.counts if item is not None else {}
    result: dict[str, int | None] = {}
    for status in (JobStatus.FAILED, JobStatus.PENDING):
        if query.status is not None and query.status is not status:
            result[status.value] = 0
        else:
            result[status.value] = None if counts is None else counts.get(status.value, 0)
    return result


def _back_to_list() -> str:
    """The list the operator came from (with its filters), else the unfiltered list."""
    home = url_for("defer.dashboard")
    came_from = path_of(request.referrer, request.host_url)
    if came_from and came_from.split("?", 1)[0] == home:
        return came_from
    return home
