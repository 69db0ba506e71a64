"""``defer.schedule_many``: the bulk enqueue path, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from flask_defer import (
    InvalidArgument,
    Job,
    JobSpec,
    JobStatus,
    NotConfigured,
    UnknownJob,
    job_scheduled,
)

from ..conftest import AppKit


@pytest.fixture
def ran(kit: AppKit) -> list[Job]:
    seen: list[Job] = []

    @kit.defer.job("remind", max_attempts=4)
    def remind(job: Job) -> None:
        seen.append(job)

    return seen


def test_schedule_many_writes_every_payload_with_shared_timing(kit: AppKit, ran: list[Job]) -> None:
    before = datetime.now(UTC)
    count = kit.defer.schedule_many(
        "remind", [{"n": n} for n in range(25)], delay=3600, owner="alice", label="Reminder"
    )
    kit.db.session.commit()

    assert count == 25
    jobs = kit.defer.list(name="remind", limit=100)
    assert sorted(job.payload["n"] for job in jobs) == list(range(25))
    for job in jobs:
        assert job.status is JobStatus.PENDING
        assert job.key is None
        assert job.owner == "alice" and job.label == "Reminder"
        assert job.max_attempts == 4
        assert job.due_at == job.run_at
        in_an_hour = before + timedelta(hours=1)
        assert in_an_hour <= job.run_at <= in_an_hour + timedelta(minutes=1)


def test_schedule_many_rolls_back_with_the_callers_transaction(kit: AppKit, ran: list[Job]) -> None:
    kit.defer.schedule_many("remind", [{"n": 1}, {"n": 2}])
    kit.db.session.rollback()

    assert kit.defer.list(name="remind") == []


def test_schedule_many_jobs_run_like_scheduled_ones(kit: AppKit, ran: list[Job]) -> None:
    kit.defer.schedule_many("remind", [{"n": n} for n in range(3)])
    kit.db.session.commit()

    summary = kit.defer.run_due()

    assert summary.done == 3
    assert sorted(job.payload["n"] for job in ran) == [0, 1, 2]


def test_job_spec_items_carry_their_own_timing_owner_and_label(kit: AppKit, ran: list[Job]) -> None:
    when = datetime(2031, 6, 1, 9, 0, tzinfo=UTC)
    kit.defer.schedule_many(
        "remind",
        [
            JobSpec({"n": 1}, run_at=when, owner="bob"),
            JobSpec({"n": 2}, delay=timedelta(days=2), label="Later"),
            {"n": 3},
        ],
        run_at=datetime(2031, 1, 1, tzinfo=UTC),
        owner="alice",
        label="Default",
    )
    kit.db.session.commit()

    by_n = {job.payload["n"]: job for job in kit.defer.list(name="remind")}
    assert by_n[1].run_at == when and by_n[1].owner == "bob" and by_n[1].label == "Default"
    assert by_n[2].owner == "alice" and by_n[2].label == "Later"
    assert by_n[2].run_at < datetime(2031, 1, 1, tzinfo=UTC)
    assert by_n[3].run_at == datetime(2031, 1, 1, tzinfo=UTC) and by_n[3].owner == "alice"


def test_schedule_many_stores_every_text_and_time_exactly_as_given(
    kit: AppKit, ran: list[Job]
) -> None:
    """The bulk insert sends each column as one array (binary on PostgreSQL): texts that
    need quoting in an array literal, NULLs among values and times must come back as is."""
    awkward = ['say "hi"', "back\\slash", "{brace}, comma", "NULL", "", "üñï ✓", "a\ttab"]
    when = datetime(2031, 6, 1, 9, 0, 0, 123456, tzinfo=UTC)
    specs = [
        JobSpec(
            {"text": text, "n": n},
            run_at=when + timedelta(seconds=n),
            owner=f"owner {text}" if n % 2 else None,
            label=text or None,
        )
        for n, text in enumerate(awkward)
    ]
    kit.defer.schedule_many("remind", specs)
    kit.db.session.commit()

    by_n = {job.payload["n"]: job for job in kit.defer.list(name="remind", limit=100)}
    assert sorted(by_n) == list(range(len(awkward)))
    for n, text in enumerate(awkward):
        job = by_n[n]
        assert job.payload == {"text": text, "n": n}
        assert job.run_at == when + timedelta(seconds=n) == job.due_at
        assert job.owner == (f"owner {text}" if n % 2 else None)
        assert job.label == (text or None)


def test_schedule_many_clamps_a_past_run_at_to_now(kit: AppKit, ran: list[Job]) -> None:
    before = datetime.now(UTC)
    kit.defer.schedule_many("remind", [None], run_at=datetime(2001, 1, 1, tzinfo=UTC))
    kit.db.session.commit()

    (job,) = kit.defer.list(name="remind")
    assert job.run_at >= before
    assert job.payload == {}


def test_schedule_many_of_nothing_writes_nothing(kit: AppKit, ran: list[Job]) -> None:
    assert kit.defer.schedule_many("remind", []) == 0
    assert kit.defer.schedule_many("remind", iter(())) == 0
    kit.db.session.commit()
    assert kit.defer.list() == []


def test_schedule_many_unknown_name_raises_unknown_job(kit: AppKit, ran: list[Job]) -> None:
    with pytest.raises(UnknownJob):
        kit.defer.schedule_many("no_such_job", [{"n": 1}])


@pytest.mark.parametrize(
    ("payloads", "argument"),
    [
        ({"n": 1}, "payloads"),  # a dict would iterate its keys
        ("abc", "payloads"),
        (42, "payloads"),
        ([{"n": 1}, {"bad": object()}], "payloads[1]"),
        ([{"n": float("nan")}], "payloads[0]"),
        ([JobSpec({"n": 1}, run_at=datetime(2031, 1, 1))], "payloads[0].run_at"),
        ([JobSpec({"n": 1}, owner="")], "payloads[0].owner"),
        ([JobSpec({"n": 1}, delay=-5)], "payloads[0].delay"),
    ],
)
def test_bad_items_name_their_position_and_write_nothing(
    kit: AppKit, ran: list[Job], payloads: object, argument: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        kit.defer.schedule_many("remind", payloads)  # type: ignore[arg-type]

    assert caught.value.argument == argument
    assert str(caught.value).startswith(f"{argument}: ")
    kit.db.session.commit()
    assert kit.defer.list() == []


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"run_at": datetime(2031, 1, 1)}, "run_at"),
        ({"run_at": datetime(2031, 1, 1, tzinfo=UTC), "delay": 5}, "run_at"),
        ({"delay": "soon"}, "delay"),
        ({"owner": 7}, "owner"),
        ({"label": "x" * 256}, "label"),
    ],
)
def test_bad_shared_arguments_are_named(
    kit: AppKit, ran: list[Job], kwargs: dict[str, object], argument: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        kit.defer.schedule_many("remind", [{"n": 1}], **kwargs)  # type: ignore[arg-type]
    assert caught.value.argument == argument


def test_schedule_many_sends_no_per_job_signal(kit: AppKit, ran: list[Job]) -> None:
    heard: list[Job] = []
    with job_scheduled.connected_to(lambda app, job: heard.append(job)):
        kit.defer.schedule_many("remind", [{"n": 1}, {"n": 2}])
        kit.db.session.commit()
    assert heard == []


def test_control_ops_refuse_while_bulk_jobs_are_uncommitted(kit: AppKit, ran: list[Job]) -> None:
    kit.defer.schedule_many("remind", [{"n": 1}])
    with pytest.raises(NotConfigured, match="commit"):
        kit.defer.run_due()
    kit.db.session.commit()
    assert kit.defer.run_due().done == 1


def test_schedule_many_takes_the_scheduling_options_and_refuses_those_of_keyed_jobs(
    kit: AppKit, ran: list[Job]
) -> None:
    count = kit.defer.schedule_many("remind", [{"n": 1}], queue="bulk", actor="importer")
    kit.db.session.commit()
    assert count == 1
    [job] = kit.defer.list(name="remind")
    assert job.queue == "bulk"
    assert [(e.event, e.actor) for e in kit.defer.history(job.id)] == [("scheduled", "importer")]
    for option, value in (("key", "k"), ("replace", True), ("concurrency_key", "k"),
                          ("expires_at", datetime.now(UTC) + timedelta(days=1))):  # fmt: skip
        with pytest.raises(InvalidArgument) as refused:
            kit.defer.schedule_many("remind", [{"n": 2}], **{option: value})  # type: ignore[misc]
        assert refused.value.argument == option
    assert kit.defer.count(name="remind") == 1
