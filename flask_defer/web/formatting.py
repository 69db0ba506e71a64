"""Jinja filters of the dashboard: times for operators, pretty JSON, error summaries.

Times are shown in UTC (the store's time and the worker's), with a relative form
("in 3 min", "4 min ago") computed at render time, because "is it late?" is the
question an operator asks. Every word goes through the blueprint's :mod:`.i18n`, so
the dashboard reads in the operator's language when the app uses Flask-Babel.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from flask import Blueprint

from ..features.http_jobs import shown_payload
from ..i18n import N_, format_number, format_seconds, gettext, ngettext, pgettext
from ..recurring_rules import Rule

#: Longest one-line error summary shown in the job list.
SUMMARY_CHARS = 140


def register(blueprint: Blueprint) -> None:
    """Add the dashboard's filters to the app's Jinja environment."""
    blueprint.add_app_template_filter(utc_text, "defer_utc")
    blueprint.add_app_template_filter(relative, "defer_relative")
    blueprint.add_app_template_filter(pretty_json, "defer_json")
    blueprint.add_app_template_filter(payload_json, "defer_payload_json")
    blueprint.add_app_template_filter(error_summary, "defer_error_summary")
    blueprint.add_app_template_filter(age_text, "defer_age")
    blueprint.add_app_template_filter(event_label, "defer_event_label")
    blueprint.add_app_template_filter(event_tone, "defer_event_tone")
    blueprint.add_app_template_filter(status_label, "defer_status")
    blueprint.add_app_template_filter(schedule_state_label, "defer_schedule_state")
    blueprint.add_app_template_filter(rule_text, "defer_rule")
    blueprint.add_app_template_filter(format_number, "defer_number")
    blueprint.add_app_template_global(ngettext, "defer_ngettext")
    blueprint.add_app_template_global(pgettext, "defer_pgettext")


#: How the job page's timeline names each history event, and its colour (tone).
EVENTS: dict[str, tuple[str, str]] = {
    "scheduled": (N_("Scheduled"), "info"),
    "replaced": (N_("Replaced by a newer job with its key"), "neutral"),
    "rescheduled": (N_("Rescheduled"), "info"),
    "run_now": (N_("Made due now"), "info"),
    "started": (N_("Started"), "info"),
    "done": (N_("Done"), "ok"),
    "retried": (N_("Attempt failed; will retry"), "warn"),
    "snoozed": (N_("Not yet; waits"), "neutral"),
    "failed": (N_("Failed"), "danger"),
    "cancelled": (N_("Cancelled"), "neutral"),
    "undone": (N_("Undone"), "neutral"),
    "reclaimed": (N_("Lease lapsed; reclaimed"), "warn"),
    "retried_by_operator": (N_("Retried by an operator"), "info"),
    "expired": (N_("Expired before it started"), "neutral"),
    "released": (N_("Released: every job it waited for settled"), "info"),
    "abort_requested": (N_("Abort requested"), "warn"),
    "aborted": (N_("Aborted"), "neutral"),
}

#: A job's status as the dashboard's badges and details say it; "due" is a pending
#: job whose time has come (owed work).
STATUSES: dict[str, str] = {
    "pending": N_("pending"),
    "running": N_("running"),
    "done": N_("done"),
    "failed": N_("failed"),
    "cancelled": N_("cancelled"),
    "expired": N_("expired"),
    "due": N_("due"),
}

#: A recurring schedule's state on the Schedules page.
SCHEDULE_STATES: dict[str, str] = {
    "active": N_("active"),
    "paused": N_("paused"),
    "orphaned": N_("orphaned"),
}


def event_label(event: str) -> str:
    """The timeline's words for a history event (the event's own name if unknown)."""
    label = EVENTS.get(event)
    return gettext(label[0]) if label is not None else event


def status_label(status: str) -> str:
    """A status (``pending``, ..., or ``due``) in the reader's words (itself if unknown)."""
    label = STATUSES.get(status)
    return gettext(label) if label is not None else status


def schedule_state_label(state: str) -> str:
    """``active``, ``paused`` or ``orphaned`` in the reader's words."""
    label = SCHEDULE_STATES.get(state)
    return gettext(label) if label is not None else state


def rule_text(rule: Rule) -> str:
    """A schedule's rule: the cron line and its zone as written, or "every 5 min"."""
    if rule.cron is not None:
        return f"{rule.cron} ({rule.tz})"
    assert rule.every is not None
    return gettext("every {interval}", interval=exact_interval(rule.every.total_seconds()))


def exact_interval(seconds: float) -> str:
    """An interval in its largest whole unit ("90 s", "5 min", "2 h", "1 d"), never rounded.

    A schedule's period is a setting the operator compares with the code: "every 1 min"
    for a 90 s schedule would be wrong, so this does not round like the ages do. The
    unit symbols are the SI ones, read alike in the blueprint's languages.
    """
    if seconds != int(seconds) or seconds < 60:
        return f"{seconds:g} s"
    whole = int(seconds)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if whole % size == 0:
            return f"{whole // size} {unit}"
    return f"{whole} s"


def event_tone(event: str) -> str:
    """``ok``, ``warn``, ``danger``, ``info`` or ``neutral``: the event's marker colour."""
    return EVENTS.get(event, (event, "neutral"))[1]


def utc_text(value: datetime | None) -> str:
    """``2030-01-01 12:00:05 UTC`` (or an empty string)."""
    if value is None:
        return ""
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")


def relative(value: datetime | None, now: datetime) -> str:
    """``in 3 min``, ``4 min ago`` or ``now``, measured from *now*."""
    if value is None:
        return ""
    seconds = (value - now).total_seconds()
    if abs(seconds) < 1:
        return gettext("now")
    if seconds > 0:
        return gettext("in {duration}", duration=format_seconds(seconds))
    return gettext("{duration} ago", duration=format_seconds(-seconds))


def age_text(seconds: float | None) -> str:
    """An age such as ``4 min`` (``–`` for none)."""
    if seconds is None:
        return "–"
    return format_seconds(seconds)


def pretty_json(value: Any) -> str:
    """*value* as indented JSON (plain text: the template escapes it)."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def payload_json(job: Any) -> str:
    """*job*'s payload as :func:`pretty_json`, with a scheduled HTTP call's credentials
    and query string hidden (:func:`~flask_defer.features.http_jobs.shown_payload`)."""
    return pretty_json(shown_payload(job.name, job.payload))


def error_summary(error: str | None) -> str:
    """The last line of a traceback (the exception and its message), shortened."""
    if not error:
        return ""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    line = lines[-1] if lines else ""
    # "app.billing.BillingUnavailable: ..." → "BillingUnavailable: ...": the class
    # name is what tells one failure from another at a glance.
    kind, sep, message = line.partition(": ")
    if sep and " " not in kind and "." in kind:
        line = kind.rsplit(".", 1)[1] + sep + message
    if len(line) > SUMMARY_CHARS:
        line = line[: SUMMARY_CHARS - 1] + "…"
    return line
