"""Tick arithmetic without a database: cron across DST, intervals, catch-up plans."""

from __future__ import annotations

import bisect
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


#: Fixed-time and wildcard rules in zones that fall back an hour (Berlin, New York) or
#: half an hour (Lord Howe), with both 2026 DST weekends of each.
DST_RULES = [
    ("30 2 * * *", "Europe/Berlin"), ("0 2 * * *", "Europe/Berlin"),
    ("*/15 2 * * *", "Europe/Berlin"), ("30 * * * *", "Europe/Berlin"),
    ("15 1 * * *", "America/New_York"), ("*/30 * * * *", "America/New_York"),
    ("45 1 * * *", "Australia/Lord_Howe"),
]
DST_WEEKENDS = [utc(2026, 3, 28), utc(2026, 10, 24), utc(2026, 3, 7), utc(2026, 10, 31),
                utc(2026, 4, 4), utc(2026, 10, 3)]  # fmt: skip


@pytest.mark.parametrize(("cron", "tz"), DST_RULES)
def test_from_any_minute_of_a_dst_weekend_the_next_and_previous_ticks_are_the_chains(
    cron: str, tz: str
) -> None:
    """From inside the repeated hour too: cronsim reads a fixed-time rule's start
    without its fold, and answered that day's first 02:30 (before the moment) as the
    next tick, and the day before's as the previous one."""
    rule = make_rule(cron, None, tz)
    for start in DST_WEEKENDS:
        chain = ticks(rule, start, 200)
        moment = start
        while moment < start + timedelta(days=2):  # every 5 minutes, ticks included
            assert rule.next_after(moment) == chain[bisect.bisect_right(chain, moment)], moment
            before = bisect.bisect_left(chain, moment)
            if before:
                assert rule.previous_before(moment) == chain[before - 1], moment
            moment += timedelta(minutes=5)


def test_a_schedule_resumed_inside_the_repeated_hour_starts_at_the_next_days_tick() -> None:
    rule = make_rule("30 2 * * *", None, "Europe/Berlin")
    resumed = utc(2026, 10, 25, 1, 10)  # 02:10 CET, after 02:30 CEST (00:30 UTC) ran
    assert rule.first_at_or_after(resumed) == utc(2026, 10, 26, 1, 30)
    assert rule.last_at_or_before(resumed) == utc(2026, 10, 25, 0, 30)


def test_a_wildcard_minute_in_a_fixed_hour_follows_the_wall_clock_across_dst() -> None:
    """As documented: no 02:xx in the spring's skipped hour, each twice in autumn's."""
    rule = make_rule("*/15 2 * * *", None, "Europe/Berlin")
    spring = [t for t in ticks(rule, utc(2026, 3, 28, 12), 6) if t < utc(2026, 3, 30)]
    autumn = [t for t in ticks(rule, utc(2026, 10, 24, 12), 12) if t < utc(2026, 10, 26)]
    assert spring == []
    assert len(autumn) == 8 and autumn[0] == utc(2026, 10, 25, 0, 0)


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
        (None, 3600, "Europe/Berlin", "tz"),
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


def test_the_rule_errors_say_which_of_cron_and_every_was_wrong() -> None:
    with pytest.raises(InvalidArgument, match="got neither"):
        make_rule(None, None, "UTC")
    with pytest.raises(InvalidArgument, match="got both"):
        make_rule("0 9 * * *", 60, "UTC")
    with pytest.raises(InvalidArgument, match="use cron=") as refused:
        make_rule(None, timedelta(days=1), "Europe/Berlin")
    assert refused.value.argument == "tz"
    assert make_rule(None, timedelta(days=1), "UTC").tz == "UTC"


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
