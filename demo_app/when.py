"""Times: read a ``datetime-local`` input as an aware datetime, and show times in templates.

A ``datetime-local`` input sends a wall-clock time without a zone ("2030-03-04T09:00").
flask_defer refuses naive datetimes, rightly: 09:00 *where*? The form therefore also
sends the browser's UTC offset *at the chosen time* (``tz_offset``, minutes as
JavaScript's ``getTimezoneOffset()`` gives them, so daylight saving is handled by the
browser). Without JavaScript the field is empty and the form says the time is UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from markupsafe import Markup, escape

#: The widest real UTC offsets are -12:00 and +14:00.
MAX_OFFSET_MINUTES = 14 * 60


def parse_local(value: str | None, tz_offset: str | None) -> datetime:
    """An aware datetime from a ``datetime-local`` value and a browser's offset.

    ``tz_offset`` is minutes *behind* UTC (UTC+02:00 → ``-120``); empty means UTC.
    Raises ValueError with a sentence for the person filling in the form.
    """
    if not value:
        raise ValueError("Choose a date and time.")
    try:
        naive = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"“{value}” is not a date and time.") from None
    if naive.tzinfo is not None:
        raise ValueError("Give the time without a zone; the form adds it.")
    if not tz_offset:
        return naive.replace(tzinfo=UTC)
    try:
        minutes = int(tz_offset)
    except ValueError:
        raise ValueError(f"“{tz_offset}” is not a time zone offset.") from None
    if abs(minutes) > MAX_OFFSET_MINUTES:
        raise ValueError(f"{minutes} minutes is not a real time zone offset.")
    return naive.replace(tzinfo=timezone(-timedelta(minutes=minutes))).astimezone(UTC)


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def time_tag(moment: datetime | None, style: str = "datetime") -> Markup:
    """``<time>`` in UTC; the page's script rewrites it in the reader's own time zone."""
    if moment is None:
        return Markup("")
    utc = moment.astimezone(UTC)
    text = utc.strftime("%H:%M:%S UTC") if style == "time" else utc.strftime("%a %d %b, %H:%M UTC")
    return Markup('<time datetime="{}" data-local="{}">{}</time>').format(
        iso(utc), escape(style), text
    )


def countdown_tag(moment: datetime | None, now: datetime | None = None) -> Markup:
    """ "in 42 s", counted down by the page's script (the server's figure without JS)."""
    if moment is None:
        return Markup("")
    left = (moment - (now or datetime.now(UTC))).total_seconds()
    return Markup('<span class="countdown" data-countdown="{}">{}</span>').format(
        iso(moment), _relative(left)
    )


def _relative(seconds: float) -> str:
    if seconds <= 0:
        return "any moment now"
    total = int(seconds + 0.999)
    if total < 60:
        return f"in {total} s"
    if total < 3600:
        return f"in {total // 60} min {total % 60:02d} s"
    hours, rest = divmod(total, 3600)
    if hours < 48:
        return f"in {hours} h {rest // 60} min"
    return f"in {hours // 24} days"


def local_input_value(moment: datetime | None) -> str:
    """A ``datetime-local`` value in UTC (the script shifts it to the reader's zone)."""
    if moment is None:
        return ""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M")
