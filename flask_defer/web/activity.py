"""The dashboard's Activity page: runs started, done, failed and retried over time, with
p50/p95 lateness, per minute for the last hour and per hour for the last seven days,
for everything or one queue or job name.

The charts are SVG drawn here, on the server (:func:`bars`): no JavaScript, colours
from the stylesheet (so dark mode follows), and each has a table beside it with the
same figures for screen readers and for copying.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from flask import Blueprint, render_template, request, url_for
from flask.typing import ResponseReturnValue

from ..store.activity import ActivityBucket
from ..timeutil import utcnow
from .access import current_defer, operators_only
from .pages import form_context, page_context, refresh_seconds, uncached_page, wants_fragment

#: The two charts: (span, how many buckets, bucket length).
CHARTS = (("minute", 60, timedelta(minutes=1)), ("hour", 7 * 24, timedelta(hours=1)))
#: The chart's drawing size (SVG user units; it scales to the page's width).
WIDTH, HEIGHT = 600.0, 120.0
#: The series, drawn in this order; each has a CSS class of its own.
SERIES = ("done", "retried", "failed")


@dataclass(frozen=True, slots=True)
class Bar:
    """One bucket's bar: its stacked parts ``(series, y, height)`` and its x and width."""

    x: float
    width: float
    parts: tuple[tuple[str, float, float], ...]
    label: str


@dataclass(frozen=True, slots=True)
class Chart:
    """One chart: its buckets (every one, empty ones included) and its bars."""

    span: str
    buckets: tuple[ActivityBucket, ...]
    bars: tuple[Bar, ...]
    peak: int


def register(blueprint: Blueprint) -> None:
    """Add the Activity page (GET) to *blueprint*."""
    blueprint.add_url_rule("/activity", "dashboard_activity", activity_page, methods=["GET"])


def bars(span: str, count: int, step: timedelta, found: list[ActivityBucket],
         now: datetime) -> Chart:  # fmt: skip
    """The chart of the last *count* buckets of *step* up to *now*: a bar per bucket,
    its done, retried and failed stacked (empty buckets stay, as gaps)."""
    first = now.replace(second=0, microsecond=0)
    if span == "hour":
        first = first.replace(minute=0)
    first -= step * (count - 1)
    by_start = {b.start: b for b in found}
    buckets = tuple(by_start.get(first + step * i, ActivityBucket(first + step * i))
                    for i in range(count))  # fmt: skip
    peak = max((b.done + b.retried + b.failed for b in buckets), default=0) or 1
    slot = WIDTH / count
    drawn = []
    for i, bucket in enumerate(buckets):
        y = HEIGHT
        parts = []
        for series in SERIES:
            value = getattr(bucket, series)
            if value:
                height = HEIGHT * value / peak
                y -= height
                parts.append((series, round(y, 2), round(height, 2)))
        label = bucket.start.strftime("%H:%M" if span == "minute" else "%a %H:00")
        drawn.append(Bar(round(i * slot, 2), round(max(slot * 0.8, 0.5), 2), tuple(parts), label))
    return Chart(span, buckets, tuple(drawn), peak)


@operators_only
def activity_page() -> ResponseReturnValue:
    """Both charts for everything, or for the ``queue`` or ``name`` asked for."""
    now = utcnow()
    defer = current_defer()
    queue = request.args.get("queue") or None
    name = request.args.get("name") or None
    charts = []
    for span, count, step in CHARTS:
        found = defer.activity(since=now - step * count, bucket=span, queue=queue, name=name)
        charts.append(bars(span, count, step, found, now))
    queues, names = defer.activity_keys(now - timedelta(days=7))
    context = {
        "charts": charts,
        "queues": queues,
        "names": names,
        "queue": queue,
        "name": name,
        "now": now,
        "width": WIDTH,
        "height": HEIGHT,
        "here": url_for("defer.dashboard_activity", queue=queue, name=name),
        "refresh_seconds": refresh_seconds(),
        **form_context(),
    }
    if wants_fragment():
        return uncached_page(render_template("defer/_dashboard_activity.html", **context))
    return uncached_page(
        render_template("defer/dashboard_activity.html", **context, **page_context())
    )
