"""The dashboard's actions: cancel, run now, reschedule, retry, and their bulk forms.

Each action is one guarded facade call, so it only acts from the right state and
says what really happened ("Job 12 is running; not cancelled.") instead of
pretending. Every one is a POST that needs the operator's authorisation (403) and a
CSRF token (400). htmx gets the outcome as a fragment plus an ``HX-Trigger`` that
makes the page refresh its list; a plain form gets a redirect and a flashed outcome.
Outcomes are translated (:mod:`.i18n`) when they are made, in the operator's locale.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import wraps
from typing import TypeVar

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

from ..errors import JobNotFound, JobNotPending
from ..i18n import N_, gettext, ngettext
from ..undo import MAX_JOB_ID
from .access import current_defer, operator, require_operator
from .csrf import require_csrf
from .formatting import relative, status_label, utc_text
from .job_query import JobQuery
from .redirects import safe_local_target
from .responses import is_htmx, no_store

#: The event an action's htmx answer fires on ``body``; the list and the job page
#: listen for it and refresh themselves.
JOBS_CHANGED = "defer-jobs-changed"
#: Flash categories of the no-JavaScript actions' outcomes (the pages show them).
FLASH_OK = "defer-dashboard-ok"
FLASH_REFUSED = "defer-dashboard-refused"
#: The longest delay a reschedule accepts (about ten years), in seconds.
MAX_DELAY = 10 * 366 * 24 * 3600

V = TypeVar("V", bound=Callable[..., ResponseReturnValue])


@dataclass(frozen=True, slots=True)
class ActionOutcome:
    """What an action did: ``ok`` when it changed something, and one sentence."""

    ok: bool
    text: str


def register(blueprint: Blueprint) -> None:
    """Add the action endpoints (all POST) to *blueprint*."""
    for rule, endpoint, view in (
        ("/jobs/<int:job_id>/cancel", "dashboard_cancel", cancel),
        ("/jobs/<int:job_id>/run-now", "dashboard_run_now", run_now),
        ("/jobs/<int:job_id>/reschedule", "dashboard_reschedule", reschedule),
        ("/jobs/<int:job_id>/retry", "dashboard_retry", retry),
        ("/jobs/<int:job_id>/abort", "dashboard_abort", abort_job),
        ("/jobs/cancel", "dashboard_cancel_many", cancel_many),
        ("/jobs/retry", "dashboard_retry_many", retry_many),
    ):
        blueprint.add_url_rule(rule, endpoint, view, methods=["POST"])


def action(view: V) -> V:
    """Authorisation (403), then CSRF (400), then a job id in range (404)."""

    @wraps(view)
    def guarded(*args: object, **kwargs: object) -> ResponseReturnValue:
        require_operator()
        require_csrf()
        job_id = kwargs.get("job_id")
        if isinstance(job_id, int) and not 1 <= job_id <= MAX_JOB_ID:
            abort(404)
        try:
            return view(*args, **kwargs)
        except JobNotFound:
            abort(404)

    return guarded  # type: ignore[return-value]


@action
def cancel(job_id: int) -> ResponseReturnValue:
    """pending → cancelled; anything else is refused with the job's real state."""
    if current_defer().cancel(job_id, actor=operator()):
        return answer(ActionOutcome(True, gettext("Job {id} cancelled.", id=job_id)))
    return answer(
        _refused(job_id, _status_of(job_id), N_("Job {id} is {status}; not cancelled."))
    )


@action
def abort_job(job_id: int) -> ResponseReturnValue:
    """running → abort requested (pending → cancelled); a settled job is refused."""
    if current_defer().abort(job_id, actor=operator()):
        job = current_defer().get(job_id)
        if job is not None and job.status.value == "cancelled":
            return answer(ActionOutcome(True, gettext("Job {id} cancelled.", id=job_id)))
        return answer(
            ActionOutcome(
                True, gettext("Abort of job {id} requested; its worker stops it.", id=job_id)
            )
        )
    return answer(
        _refused(job_id, _status_of(job_id), N_("Job {id} is {status}; not aborted."))
    )


@action
def run_now(job_id: int) -> ResponseReturnValue:
    """pending → due now (a worker starts it at once); anything else is refused."""
    try:
        current_defer().run_now(job_id, actor=operator())
    except JobNotPending as error:
        return answer(_refused(job_id, error.status, N_("Job {id} is {status}; not run now.")))
    return answer(
        ActionOutcome(True, gettext("Job {id} is due now; a worker will start it.", id=job_id))
    )


@action
def reschedule(job_id: int) -> ResponseReturnValue:
    """pending → due at the requested time (``run_at`` in UTC, or ``delay`` seconds).

    "Delay by 1 day" moves the job a day past its own run time, not a day from now:
    a job due on Friday delayed by a day is due on Saturday.
    """
    run_at, delay = _requested_time()
    if delay is not None:
        current = current_defer().get(job_id)
        if current is None:
            raise JobNotFound(job_id)
        # The reschedule itself stays guarded: a job that settles meanwhile is refused.
        run_at, delay = current.run_at + delay, None
    try:
        job = current_defer().reschedule(
            job_id, run_at=run_at, delay=delay, actor=operator()
        )
    except JobNotPending as error:
        return answer(
            _refused(job_id, error.status, N_("Job {id} is {status}; not rescheduled."))
        )
    when = f"{utc_text(job.run_at)} ({relative(job.run_at, job.updated_at or job.run_at)})"
    return answer(
        ActionOutcome(True, gettext("Job {id} rescheduled to {when}.", id=job_id, when=when))
    )


@action
def retry(job_id: int) -> ResponseReturnValue:
    """failed → pending, due now, attempts reset; anything else is refused."""
    try:
        current_defer().retry(job_id, actor=operator())
    except JobNotPending as error:
        return answer(
            _refused(
                job_id,
                error.status,
                N_("Job {id} is {status}; not retried (only a failed job can be)."),
            )
        )
    return answer(
        ActionOutcome(
            True, gettext("Job {id} is pending again, due now, attempts reset.", id=job_id)
        )
    )


@action
def cancel_many() -> ResponseReturnValue:
    """Cancel the pending jobs among the filtered rows (needs a name, key or owner)."""
    query = JobQuery.from_args(request.form)
    if not query.narrowed:
        return answer(
            ActionOutcome(
                False,
                gettext(
                    "Filter by name, key prefix or owner first: "
                    "the dashboard does not cancel every pending job at once."
                ),
            ),
            status=400,
        )
    counts = current_defer().cancel_many(actor=operator(), **query.filters)
    cancelled, in_flight = counts["cancelled"], counts["in_flight"]
    text = ngettext("Cancelled {count} pending job.", "Cancelled {count} pending jobs.", cancelled)
    if cancelled == 0:
        text = gettext("No pending jobs match this filter; nothing cancelled.")
    if in_flight:
        text += " " + ngettext(
            "{count} running job could not be stopped.",
            "{count} running jobs could not be stopped.",
            in_flight,
        )
    return answer(ActionOutcome(cancelled > 0, text))


@action
def retry_many() -> ResponseReturnValue:
    """Retry the failed jobs among the filtered rows."""
    query = JobQuery.from_args(request.form)
    retried = current_defer().retry_many(actor=operator(), **query.filters)
    if retried == 0:
        return answer(
            ActionOutcome(False, gettext("No failed jobs match this filter; nothing retried."))
        )
    return answer(
        ActionOutcome(
            True,
            ngettext(
                "Retried {count} failed job, due now.", "Retried {count} failed jobs, due now.",
                retried,
            ),
        )
    )


def answer(outcome: ActionOutcome, *, status: int = 200) -> ResponseReturnValue:
    """The outcome as an htmx fragment, or as a flashed message and a redirect back."""
    if is_htmx():
        response = no_store(
            (render_template("defer/_dashboard_outcome.html", outcome=outcome), status)
        )
        response.headers["HX-Trigger"] = JOBS_CHANGED
        return response
    if status >= 400:
        abort(status, description=outcome.text)
    flash(outcome.text, FLASH_OK if outcome.ok else FLASH_REFUSED)
    target = safe_local_target(request.form.get("next")) or url_for("defer.dashboard")
    return redirect(target, code=303)


def _requested_time() -> tuple[datetime | None, timedelta | None]:
    """The reschedule's target from the form: ``delay`` (seconds) wins over ``run_at``."""
    delay = request.form.get("delay", "").strip()
    if delay:
        if not delay.isascii() or not delay.isdigit() or len(delay) > 12 or int(delay) > MAX_DELAY:
            abort(
                400,
                description=gettext(
                    "The delay must be a whole number of seconds, at most 10 years."
                ),
            )
        return None, timedelta(seconds=int(delay))
    text = request.form.get("run_at", "").strip()
    if not text:
        abort(400, description=gettext("Give the time to run at (run_at) or a delay in seconds."))
    try:
        when = datetime.fromisoformat(text)
        # The form's datetime-local field says "UTC" next to it: a naive value is UTC.
        when = when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    except (ValueError, OverflowError):
        abort(
            400,
            description=gettext("The time to run at is not a date and time (YYYY-MM-DDTHH:MM)."),
        )
    if when.year > 9000:
        abort(400, description=gettext("The time to run at is too far in the future."))
    return when, None


def _status_of(job_id: int) -> str:
    job = current_defer().get(job_id)
    if job is None:
        raise JobNotFound(job_id)
    return job.status.value


def _refused(job_id: int, status: str, sentence: str) -> ActionOutcome:
    """The refusal *sentence* (a catalogue message with ``{id}`` and ``{status}``)."""
    return ActionOutcome(False, gettext(sentence, id=job_id, status=status_label(status)))
