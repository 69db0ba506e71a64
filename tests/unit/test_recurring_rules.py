"""Tick arithmetic without a database: cron across DST, intervals, catch-up plans."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from flask_defer import InvalidArgument
from flask_defer.recurring_rules import ON_TIME, Rule, make_rule, plan, tick_key


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def ticks(rule: Rule, start: datetime, count: int) -> list[datetime]:
    found, moment = [], start
    for _ in range(count):
        moment = rule.next_after(moment)
        found.append(moment)
    return found


def test_berlin_spring_forward_runs_the_skipped_0230_once_at_0300_cest() -> None:
    rule = make_rule("30 2 * * *", None, "Europe/Berlin")
    assert ticks(rule, utc(2026, 3, 28, 12), 2) == [utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)]


def test_berlin_fall_back_runs_the_repeated_0230_once() -> None:
    rule = make_rule("30 2 * * *", None, "Europe/Berlin")
    assert ticks(rule, utc(2026, 10, 24, 12), 2) == [
        utc(2026, 10, 25, 0, 30),  # 02:30 CEST, the first of the two
        utc(2026, 10, 26, 1, 30),
    ]


def test_wildcard_hours_keep_ticking_through_the_repeated_hour() -> None:
    rule = make_rule("*/30 * * * *", None, "America/New_York")
    assert ticks(rule, utc(2026, 11, 1, 4, 45), 5) == [
        utc(2026, 11, 1, 5, 0),
        utc(2026, 11, 1, 5, 30),
        utc(2026, 11, 1, 6, 0),  # 01:00 EST, the second 01:00
        utc(2026, 11, 1, 6, 30),
        utc(2026, 11, 1, 7, 0),
    ]


def test_backwards_agrees_with_forwards_across_a_fall_back() -> None:
    rule = make_rule("30 1 * * *", None, "America/New_York")
    forward = ticks(rule, utc(2026, 10, 30, 12), 4)
    backward, moment = [], forward[-1] + timedelta(seconds=1)
    for _ in range(4):
        moment = rule.previous_before(moment)
        backward.append(moment)
    assert backward == forward[::-1]
    assert rule.last_at_or_before(forward[1]) == forward[1]
    assert rule.first_at_or_after(forward[1]) == forward[1]


def test_intervals_tick_at_whole_multiples_since_the_epoch() -> None:
    rule = make_rule(None, timedelta(minutes=5), "UTC")
    assert rule.first_at_or_after(utc(2026, 3, 1, 10, 2)) == utc(2026, 3, 1, 10, 5)
    assert rule.first_at_or_after(utc(2026, 3, 1, 10, 5)) == utc(2026, 3, 1, 10, 5)
    assert rule.next_after(utc(2026, 3, 1, 10, 5)) == utc(2026, 3, 1, 10, 10)
    assert rule.previous_before(utc(2026, 3, 1, 10, 5)) == utc(2026, 3, 1, 10, 0)
    assert make_rule(None, 90, "UTC").every == timedelta(seconds=90)


HOURLY = make_rule("0 * * * *", None, "UTC")


def test_plan_runs_every_on_time_tick_whatever_the_policy() -> None:
    for policy in ("latest", "skip", "all"):
        steps = plan(HOURLY, utc(2026, 3, 1, 10), utc(2026, 3, 1, 10, 0, 30), policy, 100)
        assert steps.ticks == (utc(2026, 3, 1, 10),)
        assert steps.next_tick == utc(2026, 3, 1, 11)


def test_plan_after_an_outage_follows_the_policy_and_never_repeats_the_past() -> None:
    start, now = utc(2026, 3, 1, 10), utc(2026, 3, 4, 9, 30)
    assert plan(HOURLY, start, now, "latest", 100).ticks == (utc(2026, 3, 4, 9),)
    assert plan(HOURLY, start, now, "skip", 100).ticks == ()
    everything = plan(HOURLY, start, now, "all", 100)
    assert len(everything.ticks) == 72 and everything.ticks[0] == start
    bounded = plan(HOURLY, start, now, "all", 3)
    assert bounded.ticks == (utc(2026, 3, 4, 7), utc(2026, 3, 4, 8), utc(2026, 3, 4, 9))
    assert bounded.truncated
    for policy in ("latest", "skip", "all"):
        assert plan(HOURLY, start, now, policy, 100).next_tick == utc(2026, 3, 4, 10)


def test_plan_for_a_tick_not_due_yet_writes_nothing() -> None:
    steps = plan(HOURLY, utc(2026, 3, 1, 11), utc(2026, 3, 1, 10, 59), "all", 100)
    assert steps.ticks == () and steps.next_tick == utc(2026, 3, 1, 11)


def test_a_tick_just_past_on_time_counts_as_missed() -> None:
    late = utc(2026, 3, 1, 10) + ON_TIME
    assert plan(HOURLY, utc(2026, 3, 1, 10), late, "skip", 100).ticks == ()
    assert plan(HOURLY, utc(2026, 3, 1, 10), late, "latest", 100).ticks == (utc(2026, 3, 1, 10),)


def test_tick_keys_name_the_schedule_and_the_utc_tick() -> None:
    assert tick_key("digest", utc(2026, 3, 23, 8)) == "recurring:digest:2026-03-23T08:00:00Z"


@pytest.mark.parametrize(
    ("cron", "every", "tz", "argument"),
    [
        ("0 9 * * MON", None, "Mars/Olympus", "tz"),
        ("0 9 * * MON", None, None, "tz"),
        ("0 25 * * *", None, "UTC", "cron"),
        ("@daily", None, "UTC", "cron"),
        ("0 9 * * * *", None, "UTC", "cron"),
        (None, None, "UTC", "cron"),
        ("0 9 * * *", 60, "UTC", "cron"),
        (None, 0.5, "UTC", "every"),
        (None, True, "UTC", "every"),
    ],
)
def test_make_rule_refuses_bad_rules_naming_the_argument(
    cron: object, every: object, tz: object, argument: str
) -> None:
    with pytest.raises(InvalidArgument) as raised:
        make_rule(cron, every, tz)
    assert raised.value.argument == argument


@pytest.mark.parametrize(
    "every",
    [float("nan"), float("inf"), float("-inf"), 1e30, -5, 0.5,
     timedelta(days=365 * 9000), timedelta.max, timedelta(days=36_526)],
    ids=repr,
)  # fmt: skip
def test_an_interval_that_could_never_tick_is_refused_naming_every(every: object) -> None:
    with pytest.raises(InvalidArgument) as refused:
        make_rule(None, every, "UTC")
    assert refused.value.argument == "every"


def test_the_longest_interval_allowed_still_computes_its_ticks() -> None:
    rule = make_rule(None, timedelta(days=36_525), "UTC")
    now = datetime(2026, 12, 5, tzinfo=UTC)
    assert rule.previous_before(now) <= now < rule.next_after(now)
