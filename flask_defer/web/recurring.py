"""The dashboard's Schedules page: next and last run, pause, resume, run now.

Closed like the rest of the dashboard (the authorisation hook, else 403) and every
action is a CSRF-protected POST calling one facade method, so the page, ``flask defer
schedules`` and Python pause a schedule through the same guarded statement.
"""

from __future__ import annotations

from collections.abc import Callable

from flask import Blueprint, abort, render_template, url_for
from flask.typing import ResponseReturnValue

from ..errors import ScheduleNotFound
from ..facade import DeferFacade
from ..i18n import N_, gettext
from ..recurring_rules import ID_PATTERN
from ..timeutil import utcnow
from .access import current_defer, operators_only, require_operator
from .csrf import require_csrf
from .dashboard_actions import ActionOutcome, answer
from .pages import form_context, page_context, uncached_page, wants_fragment


def register(blueprint: Blueprint) -> None:
    """Add the Schedules page (GET) and its actions (POST) to *blueprint*."""
    blueprint.add_url_rule("/schedules", "dashboard_schedules", schedules_page, methods=["GET"])
    for rule, endpoint, view in (
        ("/schedules/<schedule_id>/pause", "dashboard_schedule_pause", pause),
        ("/schedules/<schedule_id>/resume", "dashboard_schedule_resume", resume),
        ("/schedules/<schedule_id>/run-now", "dashboard_schedule_run_now", run_now),
    ):
        blueprint.add_url_rule(rule, endpoint, view, methods=["POST"])


@operators_only
def schedules_page() -> ResponseReturnValue:
    """Every schedule (orphaned ones too) with its rule, state, next and last run."""
    context = {
        "schedules": current_defer().list_recurring(),
        "now": utcnow(),
        "here": url_for("defer.dashboard_schedules"),
        **form_context(),
    }
    if wants_fragment():
        return uncached_page(render_template("defer/_dashboard_schedules.html", **context))
    return uncached_page(
        render_template("defer/dashboard_schedules.html", **context, **page_context())
    )


def _guard(schedule_id: str) -> None:
    require_operator()
    require_csrf()
    if not ID_PATTERN.fullmatch(schedule_id):
        abort(404)


def pause(schedule_id: str) -> ResponseReturnValue:
    """running → paused; an already paused schedule is reported as such."""
    return _switch(
        schedule_id,
        DeferFacade.pause_recurring,
        N_("Schedule {id} paused."),
        N_("Schedule {id} was already paused."),
    )


def resume(schedule_id: str) -> ResponseReturnValue:
    """paused → running from its next tick (the paused ticks are not run)."""
    return _switch(
        schedule_id,
        DeferFacade.resume_recurring,
        N_("Schedule {id} resumed."),
        N_("Schedule {id} was not paused."),
    )


def _switch(
    schedule_id: str, method: Callable[[DeferFacade, str], bool], done: str, unchanged: str
) -> ResponseReturnValue:
    """Pause or resume (the facade's *method*): the *done* sentence if this call changed
    it, else *unchanged* (each a catalogue message with ``{id}``)."""
    _guard(schedule_id)
    try:
        changed = method(current_defer(), schedule_id)
    except ScheduleNotFound:
        abort(404)
    # *done* and *unchanged* are catalogue messages (marked N_), translated here.
    text = done if changed else unchanged
    return answer(ActionOutcome(changed, gettext(text, id=schedule_id)))


def run_now(schedule_id: str) -> ResponseReturnValue:
    """One extra job of the schedule, due now; its ticks are unchanged."""
    _guard(schedule_id)
    try:
        job = current_defer().run_recurring_now(schedule_id)
    except ScheduleNotFound:
        abort(404)
    return answer(
        ActionOutcome(
            True, gettext("Schedule {id}: job {job} is due now.", id=schedule_id, job=job.id)
        )
    )
