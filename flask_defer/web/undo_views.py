"""The Undo endpoints: toasts, their states, Undo (htmx and plain form), hold, pending page.

Every view works for "the current owner" only and calls the facade; a job id that is
not the owner's answers 404 exactly like an id that does not exist.

How a page learns an outcome: while one of its toasts (or pending rows) is *waiting*,
``defer.js`` asks ``GET /toasts/state?id=…`` a few times a second, one primary-key
lookup per id (an open toast is asked about too, less often, so an operator's cancel
reaches it), and stops as soon as nothing is open or waiting. A plain request-response costs a
sync WSGI server a thread for a few milliseconds; a server-sent event stream would
hold one thread per waiting tab for the whole wait (unbounded while no worker runs),
which is what ``DESIGN`` rules out. An idle page asks nothing.
"""

from __future__ import annotations

from typing import Any

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

from ..errors import InvalidArgument, JobNotFound, JobNotPending
from ..i18n import format_seconds, gettext, locale_tag
from ..jobs import Job
from ..timeutil import utcnow
from ..undo import (
    MAX_JOB_ID,
    ToastState,
    UndoOutcome,
    announcement,
    cancelling_operator,
    state_text,
    was_replaced,
)
from .access import current_defer
from .csrf import csrf_token, field_name, require_csrf
from .redirects import path_of, safe_local_target
from .responses import is_htmx, no_store, safe_json
from .toasts import page_of_fragment_request, toast_context

#: At most this many ids in one state request (a page shows a handful of toasts).
MAX_WATCHED = 50
#: The most digits a job id can have (``MAX_JOB_ID`` has 19).
MAX_ID_DIGITS = len(str(MAX_JOB_ID))


def register(blueprint: Blueprint) -> None:
    """Add the Undo views to *blueprint*."""
    blueprint.add_url_rule("/toasts", "toasts", toasts_fragment, methods=["GET"])
    blueprint.add_url_rule("/toasts/state", "toast_states", toast_states, methods=["GET"])
    blueprint.add_url_rule("/undo/<int:job_id>", "undo", undo, methods=["POST"])
    blueprint.add_url_rule("/hold/<int:job_id>", "hold", hold, methods=["POST"])
    blueprint.add_url_rule("/pending", "pending", pending_page, methods=["GET"])
    blueprint.add_app_template_filter(format_seconds, "defer_seconds")
    blueprint.add_app_template_global(gettext, "defer_gettext")
    blueprint.add_app_template_global(_toast_texts, "defer_toast_texts")
    blueprint.add_app_template_global(locale_tag, "defer_locale")


def _toast_texts(job: Job) -> dict[str, str]:
    """Every state's text of *job*'s toast, translated: the page switches between them."""
    texts = {state.value: state_text(job, state, gettext) for state in ToastState}
    texts["announce"] = announcement(job, gettext)
    return texts


def toasts_fragment() -> ResponseReturnValue:
    """The current owner's open and waiting toasts as HTML (the region merges it in)."""
    return no_store(
        render_template("defer/_toast_list.html", **toast_context(page=page_of_fragment_request()))
    )


def watched_ids(values: list[str]) -> list[int]:
    """The job ids among the first :data:`MAX_WATCHED` ``id`` values, in order, once each.

    Only a plain ASCII decimal from 1 to :data:`~flask_defer.undo.MAX_JOB_ID` is an id;
    anything else (``0``, ``-1``, ``1e3``, ``abc``, a number past 64 bits, digits of
    another script such as ``١`` or ``²``, which ``int()`` would read or choke on) is
    ignored, exactly like an id that does not exist. The length check comes first, so
    a value of thousands of digits is never converted at all.
    """
    ids: list[int] = []
    for raw in values[:MAX_WATCHED]:
        if 0 < len(raw) <= MAX_ID_DIGITS and raw.isascii() and raw.isdigit():
            number = int(raw)
            if 1 <= number <= MAX_JOB_ID:
                ids.append(number)
    return list(dict.fromkeys(ids))


def toast_states() -> ResponseReturnValue:
    """What the server knows about the watched jobs: ``{"jobs": [{id, key, status, state,
    text, seconds_left}]}``; always 200 for a well-formed request.

    Ids that are not the current owner's are left out, exactly like ids that do not
    exist, and so is every value that is not an id at all (see :func:`watched_ids`);
    the page stops watching them.
    """
    defer = current_defer()
    owner = defer.current_owner()
    ids = watched_ids(request.args.getlist("id"))
    now = utcnow()
    found: list[dict[str, Any]] = []
    if owner is not None:
        for job_id in ids:
            job = defer.get(job_id)
            if job is None or job.owner != owner:
                continue
            state = ToastState.of(job, now)
            found.append(
                {
                    "id": job.id,
                    "key": job.key,
                    "status": job.status.value,
                    "state": state.value,
                    "text": toast_text(job, state),
                    "seconds_left": round(job.undo_seconds_left(now), 3),
                }
            )
    return no_store(safe_json(jobs=found))


def toast_text(job: Job, state: ToastState) -> str:
    """*job*'s toast text in *state*, translated; for a cancelled job, says by whom
    (an operator, or a newer job of its key).

    Only a cancelled job costs a second lookup (its history, by the job's id), and a
    page asks about it once: it stops watching a settled job.
    """
    operator, replaced = None, False
    if state is ToastState.UNDONE:
        events = current_defer().history(job.id)
        operator, replaced = cancelling_operator(events), was_replaced(events)
    return state_text(job, state, gettext, operator=operator, replaced=replaced)


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
    text = outcome.describe(job, gettext)
    if outcome is UndoOutcome.ALREADY_UNDONE and job is not None:
        # An operator or a newer job of the key got there first: say so rather than
        # "Already undone."
        events = defer.history(job.id)
        operator, replaced = cancelling_operator(events), was_replaced(events)
        if operator is not None or replaced:
            text = state_text(job, ToastState.UNDONE, gettext, operator=operator, replaced=replaced)
    if is_htmx():
        state = ToastState.of(job, utcnow()) if job is not None else ToastState.UNDONE
        return no_store(
            render_template(
                "defer/_outcome.html", outcome=outcome, text=text, job=job, state=state
            )
        )
    flash(text, f"defer-{outcome.value}")
    target = safe_local_target(request.form.get("next")) or url_for("defer.pending")
    return redirect(target, code=303)


def hold(job_id: int) -> ResponseReturnValue:
    """Hold the owner's open toast: keep its window open ``seconds`` more (form field).

    200 ``{state, seconds_left, capped}`` while the window is open (``capped``: the
    request was cut by ``DEFER_UNDO_MAX_HOLD``); 409 ``{state}`` once it is closed or
    the job is no longer pending; 404 for another owner's or a missing job; 400 without
    a valid CSRF token or with a bad ``seconds``.
    """
    require_csrf()
    defer = current_defer()
    owner = defer.current_owner()
    if owner is None:
        abort(404)
    try:
        seconds = float(request.form.get("seconds", ""))
    except ValueError:
        abort(400, description="seconds: expected a number of seconds")
    now = utcnow()
    try:
        job = defer.hold(job_id, seconds=seconds, owner=owner)
    except JobNotFound:
        abort(404)
    except InvalidArgument as error:
        abort(400, description=str(error))
    except JobNotPending:
        current = defer.get(job_id)
        state = ToastState.of(current, utcnow()) if current is not None else ToastState.UNDONE
        return no_store(safe_json(409, state=state.value))
    # Capped: the window ends sooner than asked, counted from before the hold. What is
    # left is counted from after it, so the toast never shows more time than the job
    # has (from *now* it read a few ms more than asked, under load).
    capped = job.undo_seconds_left(now) < seconds - 0.05
    left = job.undo_seconds_left(utcnow())
    answer = safe_json(state=ToastState.OPEN.value, seconds_left=round(left, 3), capped=capped)
    return no_store(answer)


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
            **_way_back(defer.config.dashboard_home_url),
            locale=locale_tag(),
        )
    )


def _way_back(home_url: str | None) -> dict[str, Any]:
    """Where the pending page's back link goes: the page the visitor came from, else home.

    A person who opened ``/defer/pending`` from a bookmark, a notification or a new tab
    has no referrer; the link then goes to ``DEFER_DASHBOARD_HOME_URL`` or the site's
    root, so the page is never a dead end on a phone without a back button in view.
    """
    came_from = path_of(request.referrer, request.host_url)
    if came_from and came_from != url_for("defer.pending"):
        return {"back_url": came_from, "back_home": False}
    return {"back_url": home_url or (request.script_root + "/"), "back_home": True}
