"""Jinja filters of the dashboard: times for operators, pretty JSON, error summaries.

Times are shown in UTC (the store's time and the worker's), with a relative form
("in 3 min", "4 min ago") computed at render time, because "is it late?" is the
question an operator asks.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from flask import Blueprint

from .i18n import plain_seconds as format_seconds

#: Longest one-line error summary shown in the job list.
SUMMARY_CHARS = 140


def register(blueprint: Blueprint) -> None:
    """Add the dashboard's filters to the app's Jinja environment."""
    blueprint.add_app_template_filter(utc_text, "defer_utc")
    blueprint.add_app_template_filter(relative, "defer_relative")
    blueprint.add_app_template_filter(pretty_json, "defer_json")
    blueprint.add_app_template_filter(error_summary, "defer_error_summary")
    blueprint.add_app_template_filter(age_text, "defer_age")
    blueprint.add_app_template_filter(event_label, "defer_event_label")
    blueprint.add_app_template_filter(event_tone, "defer_event_tone")


#: How the job page's timeline names each history event, and its colour (tone).
EVENTS: dict[str, tuple[str, str]] = {
    "scheduled": ("Scheduled", "info"),
    "replaced": ("Replaced by a newer job with its key", "neutral"),
    "rescheduled": ("Rescheduled", "info"),
    "run_now": ("Made due now", "info"),
    "started": ("Started", "info"),
    "done": ("Done", "ok"),
    "retried": ("Attempt failed; will retry", "warn"),
    "snoozed": ("Not yet; waits", "neutral"),
    "failed": ("Failed", "danger"),
    "cancelled": ("Cancelled", "neutral"),
    "undone": ("Undone", "neutral"),
    "reclaimed": ("Lease lapsed; reclaimed", "warn"),
    "retried_by_operator": ("Retried by an operator", "info"),
}


def event_label(event: str) -> str:
    """The timeline's words for a history event (the event's own name if unknown)."""
    return EVENTS.get(event, (event, "neutral"))[0]


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
        return "now"
    if seconds > 0:
        return f"in {format_seconds(seconds)}"
    return f"{format_seconds(-seconds)} ago"


def age_text(seconds: float | None) -> str:
    """An age such as ``4 min`` (``–`` for none)."""
    if seconds is None:
        return "–"
    return format_seconds(seconds)


def pretty_json(value: Any) -> str:
    """*value* as indented JSON (plain text: the template escapes it)."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


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
