"""Local times around DST changes: Python's fold rule by default, refused in strict mode."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from flask_defer import InvalidArgument, Job
from flask_defer.timeutil import as_utc

from ..conftest import AppKit

BERLIN = ZoneInfo("Europe/Berlin")
# 2031-03-30 02:30 does not exist in Berlin (02:00 → 03:00); 2031-10-26 02:30 happens twice.
SKIPPED = datetime(2031, 3, 30, 2, 30, tzinfo=BERLIN)
AMBIGUOUS = datetime(2031, 10, 26, 2, 30, tzinfo=BERLIN)


def test_by_default_an_ambiguous_time_is_its_first_occurrence() -> None:
    assert as_utc(AMBIGUOUS, "run_at") == datetime(2031, 10, 26, 0, 30, tzinfo=UTC)
    assert as_utc(AMBIGUOUS.replace(fold=1), "run_at") == datetime(2031, 10, 26, 1, 30, tzinfo=UTC)


def test_by_default_a_skipped_time_lands_after_the_gap() -> None:
    # Read with the offset before the change (+01:00): 01:30 UTC, 03:30 local.
    assert as_utc(SKIPPED, "run_at") == datetime(2031, 3, 30, 1, 30, tzinfo=UTC)


@pytest.mark.parametrize(("value", "what"), [(SKIPPED, "skipped"), (AMBIGUOUS, "ambiguous")])
def test_strict_mode_refuses_dst_edge_times(value: datetime, what: str) -> None:
    with pytest.raises(InvalidArgument, match=what) as caught:
        as_utc(value, "run_at", strict=True)
    assert caught.value.argument == "run_at"


def test_strict_mode_accepts_ordinary_local_and_utc_times() -> None:
    for value in (
        datetime(2031, 7, 1, 9, 0, tzinfo=BERLIN),
        datetime(2031, 3, 30, 1, 59, tzinfo=BERLIN),
        datetime(2031, 3, 30, 3, 0, tzinfo=BERLIN),
        datetime(2031, 10, 26, 2, 30, tzinfo=UTC),
    ):
        assert as_utc(value, "run_at", strict=True) == value.astimezone(UTC)


def test_defer_strict_local_times_refuses_them_in_schedule_and_reschedule(
    make_app: Any,
) -> None:
    kit: AppKit = make_app(DEFER_STRICT_LOCAL_TIMES=True)

    @kit.defer.job("publish")
    def publish(job: Job) -> None:
        pass

    with kit.app.app_context():
        kit.db.create_all()
        with pytest.raises(InvalidArgument, match="DEFER_STRICT_LOCAL_TIMES"):
            kit.defer.schedule("publish", run_at=AMBIGUOUS)
        job = kit.defer.schedule("publish", run_at=AMBIGUOUS + timedelta(days=1))
        kit.db.session.commit()
        with pytest.raises(InvalidArgument, match="skipped"):
            kit.defer.reschedule(job.id, run_at=SKIPPED)


def test_without_strict_mode_schedule_accepts_them(kit: AppKit) -> None:
    @kit.defer.job("publish")
    def publish(job: Job) -> None:
        pass

    job = kit.defer.schedule("publish", run_at=AMBIGUOUS)
    assert job.run_at == datetime(2031, 10, 26, 0, 30, tzinfo=UTC)
