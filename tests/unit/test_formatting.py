"""The dashboard's Jinja filters: times, intervals and statuses, in English and translated."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from flask import Flask
from flask_babel import Babel

from flask_defer.recurring_rules import make_rule
from flask_defer.web import formatting

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.5, "0.5 s"), (45, "45 s"), (90, "90 s"), (300, "5 min"), (5400, "90 min"),
     (7200, "2 h"), (172800, "2 d"), (3601, "3601 s")],
)
def test_a_schedules_interval_is_shown_exactly_in_its_largest_whole_unit(
    seconds: float, text: str
) -> None:
    assert formatting.exact_interval(seconds) == text


def test_an_every_rule_reads_every_and_a_cron_rule_keeps_its_line_and_zone() -> None:
    app = Flask(__name__)
    with app.test_request_context():
        every = make_rule(None, timedelta(seconds=90), "UTC")
        assert formatting.rule_text(every) == "every 90 s"
        cron = make_rule("0 9 * * MON", None, "Europe/Berlin")
        assert formatting.rule_text(cron) == "0 9 * * MON (Europe/Berlin)"


def test_without_babel_times_and_statuses_are_english() -> None:
    app = Flask(__name__)
    with app.test_request_context():
        assert formatting.relative(NOW + timedelta(minutes=3), NOW) == "in 3 min"
        assert formatting.relative(NOW - timedelta(minutes=4), NOW) == "4 min ago"
        assert formatting.relative(NOW, NOW) == "now"
        assert formatting.status_label("due") == "due"
        assert formatting.event_label("retried") == "Attempt failed; will retry"
        assert formatting.event_label("something_new") == "something_new"


@pytest.mark.parametrize(
    ("locale", "later", "earlier", "status", "event", "state"),
    [
        ("de", "in 3 Min.", "vor 4 Min.", "fehlgeschlagen",
         "Versuch fehlgeschlagen; wird wiederholt", "pausiert"),
        ("fr", "dans 3\xa0min", "il y a 4\xa0min", "en échec",
         "Tentative échouée\u202f; nouvel essai prévu", "en pause"),
    ],
)
def test_with_babel_times_statuses_and_events_follow_the_locale(
    locale: str, later: str, earlier: str, status: str, event: str, state: str
) -> None:
    app = Flask(__name__)
    Babel(app, locale_selector=lambda: locale)
    with app.test_request_context():
        assert formatting.relative(NOW + timedelta(minutes=3), NOW) == later
        assert formatting.relative(NOW - timedelta(minutes=4), NOW) == earlier
        assert formatting.status_label("failed") == status
        assert formatting.event_label("retried") == event
        assert formatting.schedule_state_label("paused") == state
