"""Job history: every transition writes its event in its own transaction, on both backends.

Driven through the public facade (``defer.history``) on a real app, and through the
store on a bare engine where the claim, the acknowledgements, reclaim and prune are
exercised directly with an injected clock.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import event, func, inspect, select

from flask_defer import Defer, InvalidArgument, Job, JobEvent, JobSpec, JobStatus, NotYet
from flask_defer.store import Ack, JobFilter, JobStore, NewJob
from flask_defer.store.records import HistoryEvent
from flask_defer.timeutil import utcnow

from ..conftest import AppKit


def events(kit: AppKit, job_id: int) -> list[str]:
    return [e.event for e in kit.defer.history(job_id)]


@pytest.fixture
def history_inserts(history_store: JobStore) -> Iterator[list[str]]:
    """Every statement sent to the database that inserts history rows, as SQL text.

    On PostgreSQL the insert rides inside the claim's or the flush's own statement (a
    CTE), on SQLite it is an INSERT of its own: either way, one per batch.
    """
    seen: list[str] = []
    name = history_store.history_table.name  # type: ignore[union-attr]

    def listen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if f"INSERT INTO {name}" in statement.replace('"', ""):
            seen.append(statement)

    event.listen(history_store.engine, "before_cursor_execute", listen)
    yield seen
    event.remove(history_store.engine, "before_cursor_execute", listen)


# -- through the facade ------------------------------------------------------------------


def test_a_job_that_fails_once_then_succeeds_keeps_the_first_error(kit: AppKit) -> None:
    @kit.defer.job("flaky")
    def flaky(job: Job) -> str:
        if job.attempts == 1:
            raise ConnectionError("smtp is down")
        return "sent"

    job = kit.defer.schedule("flaky")
    kit.db.session.commit()
    now = utcnow()
    assert kit.defer.run_due(now=now).retried == 1
    assert kit.defer.run_due(now=now + timedelta(hours=2)).done == 1

    history = kit.defer.history(job.id)
    assert [e.event for e in history] == ["scheduled", "started", "retried", "started", "done"]
    assert [e.attempt for e in history] == [0, 1, 1, 2, 2]
    assert all(isinstance(e, JobEvent) and e.actor == "app" for e in history)
    retried = history[2]
    assert retried.error is not None and "ConnectionError: smtp is down" in retried.error
    assert retried.run_at is not None and retried.run_at > retried.at
    assert history[-1].error is None
    # The row itself no longer holds the first error; the history does.
    assert kit.defer.get(job.id).last_error is None  # type: ignore[union-attr]
    assert [e.at for e in history] == sorted(e.at for e in history)


def test_undo_by_its_owner_records_undone_by_that_owner(kit: AppKit) -> None:
    @kit.defer.job("send")
    def send(job: Job) -> None: ...

    job = kit.defer.undoable("send", owner="alice", window=30)
    kit.db.session.commit()
    assert kit.defer.undo(job.id, owner="alice").value == "undone"

    history = kit.defer.history(job.id)
    assert [(e.event, e.actor) for e in history] == [("scheduled", "app"), ("undone", "alice")]


def test_a_hold_that_moves_the_job_records_rescheduled_by_its_owner(kit: AppKit) -> None:
    @kit.defer.job("send")
    def send(job: Job) -> None: ...

    job = kit.defer.undoable("send", owner="alice", window=5)
    kit.db.session.commit()
    held = kit.defer.hold(job.id, seconds=20, owner="alice")
    kit.defer.hold(job.id, seconds=1, owner="alice")  # not later: no move, no event

    history = kit.defer.history(job.id)
    assert [(e.event, e.actor) for e in history] == [
        ("scheduled", "app"),
        ("rescheduled", "alice"),
    ]
    assert history[-1].run_at == held.run_at


def test_a_cancel_in_the_callers_transaction_records_its_event_only_if_committed(
    kit: AppKit,
) -> None:
    @kit.defer.job("expire")
    def expire(job: Job) -> None: ...

    job = kit.defer.schedule("expire", delay=3600)
    kit.db.session.commit()
    assert kit.defer.cancel(job.id, actor="ops", commit=False) is True
    kit.db.session.rollback()
    assert [e.event for e in kit.defer.history(job.id)] == ["scheduled"]

    assert kit.defer.cancel(job.id, actor="ops", commit=False) is True
    kit.db.session.commit()
    assert [(e.event, e.actor) for e in kit.defer.history(job.id)] == [
        ("scheduled", "app"),
        ("cancelled", "ops"),
    ]


def test_run_due_records_the_given_actor_and_app_by_default(kit: AppKit) -> None:
    @kit.defer.job("publish")
    def publish(job: Job) -> None:
        pass

    first = kit.defer.schedule("publish", key="post:1")
    kit.db.session.commit()
    kit.defer.run_due(actor="cron:nightly")
    second = kit.defer.schedule("publish", key="post:2")
    kit.db.session.commit()
    kit.defer.run_due()
    assert [(e.event, e.actor) for e in kit.defer.history(first.id)][1:] == [
        ("started", "cron:nightly"),
        ("done", "cron:nightly"),
    ]
    assert {e.actor for e in kit.defer.history(second.id)} == {"app"}


def test_control_methods_record_their_event_and_the_given_actor(kit: AppKit) -> None:
    @kit.defer.job("publish")
    def publish(job: Job) -> None:
        raise RuntimeError("no such post")

    first = kit.defer.schedule("publish", key="post:1", delay=3600, actor="editor:7")
    kit.db.session.commit()
    second = kit.defer.schedule("publish", key="post:1", delay=7200, replace=True)
    kit.db.session.commit()
    kit.defer.reschedule(second.id, delay=60, actor="ops")
    kit.defer.run_now(second.id, actor="ops")
    kit.defer.run_due(now=utcnow() + timedelta(minutes=5))  # attempt 1 of 5 fails
    kit.defer.cancel(second.id, actor="ops")

    assert [(e.event, e.actor) for e in kit.defer.history(first.id)] == [
        ("scheduled", "editor:7"),
        ("replaced", "app"),
    ]
    assert [(e.event, e.actor) for e in kit.defer.history(second.id)] == [
        ("scheduled", "app"),
        ("rescheduled", "ops"),
        ("run_now", "ops"),
        ("started", "app"),
        ("retried", "app"),
        ("cancelled", "ops"),
    ]


def test_a_dead_letter_retried_by_an_operator_records_both(make_app: Callable[..., AppKit]) -> None:
    kit = make_app(DEFER_MAX_ATTEMPTS=1)
    with kit.context():
        kit.db.create_all()

        @kit.defer.job("doomed")
        def doomed(job: Job) -> None:
            raise ValueError("bad payload")

        job = kit.defer.schedule("doomed")
        kit.db.session.commit()
        assert kit.defer.run_due().failed == 1
        kit.defer.retry(job.id, actor="cli")

        history = kit.defer.history(job.id)
        assert [(e.event, e.actor, e.attempt) for e in history] == [
            ("scheduled", "app", 0),
            ("started", "app", 1),
            ("failed", "app", 1),
            ("retried_by_operator", "cli", 0),
        ]
        assert history[2].error is not None and "ValueError: bad payload" in history[2].error


def test_not_yet_records_snoozed_with_the_new_time(kit: AppKit) -> None:
    later = datetime(2099, 1, 1, tzinfo=UTC)

    @kit.defer.job("wait")
    def wait(job: Job) -> None:
        raise NotYet(later)

    job = kit.defer.schedule("wait")
    kit.db.session.commit()
    assert kit.defer.run_due().snoozed == 1
    snoozed = kit.defer.history(job.id)[-1]
    assert (snoozed.event, snoozed.run_at, snoozed.attempt) == ("snoozed", later, 1)


def test_scheduling_rolled_back_leaves_no_history(kit: AppKit) -> None:
    @kit.defer.job("send")
    def send(job: Job) -> None: ...

    job = kit.defer.schedule("send")
    kit.db.session.rollback()
    assert kit.defer.history(job.id) == []


def test_schedule_many_records_scheduled_for_each_job(kit: AppKit) -> None:
    @kit.defer.job("send")
    def send(job: Job) -> None: ...

    assert kit.defer.schedule_many("send", [{"n": n} for n in range(3)]) == 3
    kit.db.session.commit()
    ids = sorted(job.id for job in kit.defer.list(name="send"))
    assert [events(kit, job_id) for job_id in ids] == [["scheduled"]] * 3


def test_schedule_many_events_carry_each_jobs_run_at_and_the_actor_as_schedule_does(
    kit: AppKit,
) -> None:
    @kit.defer.job("send")
    def send(job: Job) -> None: ...

    soon = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    specs = [JobSpec({"n": n}, run_at=soon + timedelta(minutes=n)) for n in range(4)]
    assert kit.defer.schedule_many("send", specs, actor="ops:ana") == 4
    one = kit.defer.schedule("send", run_at=soon, actor="ops:ana")
    kit.db.session.commit()
    (single,) = kit.defer.history(one.id)
    jobs = sorted((j for j in kit.defer.list(name="send") if j.id != one.id), key=lambda j: j.id)
    for n, job in enumerate(jobs):
        (scheduled,) = kit.defer.history(job.id)
        assert scheduled.event == "scheduled" and scheduled.actor == "ops:ana"
        assert scheduled.attempt == 0 and scheduled.error is None
        assert scheduled.run_at == job.run_at == soon + timedelta(minutes=n)
        assert scheduled.at == jobs[0].created_at
    assert single.run_at == soon and single.actor == "ops:ana"


def test_history_off_writes_no_rows_and_has_no_table(make_app: Callable[..., AppKit]) -> None:
    kit = make_app(DEFER_HISTORY=False)
    with kit.context():
        kit.db.create_all()

        @kit.defer.job("send")
        def send(job: Job) -> None: ...

        job = kit.defer.schedule("send")
        kit.db.session.commit()
        kit.defer.run_due()
        assert kit.defer.get(job.id).status is JobStatus.DONE  # type: ignore[union-attr]
        assert kit.defer.history(job.id) == []
        assert "defer_jobs_history" not in kit.db.metadata.tables
        assert "defer_jobs_history" not in inspect(kit.db.engine).get_table_names()


def test_an_app_without_db_keeps_history_in_its_own_sqlite_file(tmp_path: Any) -> None:
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    defer = Defer(app)

    @defer.job("ping")
    def ping(job: Job) -> None: ...

    with app.app_context():
        job = defer.schedule("ping")
        defer.run_due()
        assert [e.event for e in defer.history(job.id)] == ["scheduled", "started", "done"]
        defer.store.engine.dispose()


def test_history_refuses_a_non_integer_id(kit: AppKit) -> None:
    with pytest.raises(InvalidArgument, match="id"):
        kit.defer.history("7")  # type: ignore[arg-type]


def test_actor_must_be_a_short_string(kit: AppKit) -> None:
    @kit.defer.job("send")
    def send(job: Job) -> None: ...

    with pytest.raises(InvalidArgument, match="actor"):
        kit.defer.schedule("send", actor=42)  # type: ignore[arg-type]


def test_the_worker_names_itself_as_host_and_pid(kit: AppKit) -> None:
    @kit.defer.job("send")
    def send(job: Job) -> None: ...

    job = kit.defer.schedule("send")
    kit.db.session.commit()
    worker = kit.defer.worker(burst=True)
    worker.run(install_signal_handlers=False)

    assert worker.actor.startswith("worker:") and worker.actor.count(":") == 2
    history = kit.defer.history(job.id)
    assert [(e.event, e.actor) for e in history] == [
        ("scheduled", "app"),
        ("started", worker.actor),
        ("done", worker.actor),
    ]


# -- through the store, with an injected clock -------------------------------------------


def one_job(store: JobStore, new_job: Callable[..., NewJob], now: datetime, **kw: Any) -> Job:
    with store.begin() as conn:
        return store.insert(conn, new_job(run_at=now, **kw), now=now, replace=False)


def history_of(store: JobStore, job_id: int) -> list[JobEvent]:
    with store.begin() as conn:
        return store.history(conn, job_id)


def test_a_claim_batch_writes_its_started_events_in_one_insert(
    history_store: JobStore,
    history_inserts: list[str],
    new_job: Callable[..., NewJob],
    now: datetime,
) -> None:
    with history_store.begin() as conn:
        history_store.insert_many(conn, [new_job(run_at=now) for _ in range(5)], now=now)
    history_inserts.clear()

    claimed = history_store.claim(
        now=now, limit=5, token="t", lease_until=now + timedelta(seconds=30), actor="worker:h:1"
    )

    assert len(claimed) == 5
    assert len(history_inserts) == 1
    for job in claimed:
        assert [(e.event, e.actor, e.attempt) for e in history_of(history_store, job.id)] == [
            ("scheduled", "app", 0),
            ("started", "worker:h:1", 1),
        ]


def test_a_claim_of_keyed_and_plain_jobs_writes_each_one_started_event_unwatched(
    history_store: JobStore, new_job: Callable[..., NewJob], now: datetime
) -> None:
    """With nobody watching the engine the claim runs on the driver's cursor (on SQLite
    its due jobs are built after the commit): a claim taking keyed and plain jobs
    still writes one ``started`` event for each, at its attempt, by the claimer."""
    with history_store.begin() as conn:
        keyed = history_store.insert(
            conn, new_job(run_at=now, concurrency_key="acct:1"), now=now, replace=False
        )
        history_store.insert_many(conn, [new_job(run_at=now) for _ in range(2)], now=now)

    claimed = history_store.claim(
        now=now, limit=3, token="t", lease_until=now + timedelta(seconds=30), actor="worker:h:2"
    )

    assert len(claimed) == 3
    assert keyed.id in {job.id for job in claimed}
    for job in claimed:
        assert (job.status, job.attempts, job.claim_token) == (JobStatus.RUNNING, 1, "t")
        assert [(e.event, e.actor, e.attempt) for e in history_of(history_store, job.id)] == [
            ("scheduled", "app", 0),
            ("started", "worker:h:2", 1),
        ]


def test_a_flush_owning_one_outcome_of_several_writes_its_event_whole_unwatched(
    history_store: JobStore, new_job: Callable[..., NewJob], now: datetime
) -> None:
    """The batch acknowledgement's events, written on the driver's cursor when nobody
    watches: only the owned row's, with every value as given (an error text with
    quotes, a newline and non-ASCII; a run_at), by the flush's actor."""
    with history_store.begin() as conn:
        history_store.insert_many(conn, [new_job(run_at=now) for _ in range(2)], now=now)
    mine, other = history_store.claim(
        now=now, limit=2, token="t", lease_until=now + timedelta(seconds=30)
    )
    later = now + timedelta(minutes=3, microseconds=11)
    error = 'ValueError: "ünïcode" \'quoted\'\nsecond line'

    owned = history_store.acknowledge_many(
        [
            Ack(mine.id, "t", "pending", run_at=later, last_error=error, attempt=1),
            Ack(other.id, "another claim", "done", attempt=1),  # not ours: no event
        ],
        now=now + timedelta(seconds=2),
        actor="wörker:h:3",
    )

    assert owned == {mine.id}
    last = history_of(history_store, mine.id)[-1]
    assert (last.event, last.at, last.actor, last.attempt, last.error, last.run_at) == (
        "retried", now + timedelta(seconds=2), "wörker:h:3", 1, error, later
    )
    assert [e.event for e in history_of(history_store, other.id)] == ["scheduled", "started"]


def test_events_written_together_keep_every_value_as_given(
    history_store: JobStore,
    history_inserts: list[str],
    new_job: Callable[..., NewJob],
    now: datetime,
) -> None:
    """Many events at once are one statement (on SQLite a JSON array unpacked by the
    database): text with quotes, newlines and non-ASCII, a missing run_at and a set one
    come back exactly as written, in order."""
    with history_store.begin() as conn:
        job = history_store.insert(conn, new_job(run_at=now), now=now, replace=False)
    later = now + timedelta(minutes=5, microseconds=7)
    error = 'KeyError: "ünïcode" \'quoted\'\nline two \u2028 and [1, {"a": null}]'
    written = [
        HistoryEvent(job.id, "retried", now, "wörker:1", 1, error, later),
        HistoryEvent(job.id, "snoozed", now + timedelta(seconds=1), "app", 2),
        HistoryEvent(job.id, "done", now + timedelta(seconds=2), "app", 2, None, None),
    ]
    history_inserts.clear()
    with history_store.begin() as conn:
        history_store.record_events(conn, written)

    assert len(history_inserts) == 1
    read = history_of(history_store, job.id)[1:]  # after its scheduled event
    assert [(e.event, e.at, e.actor, e.attempt, e.error, e.run_at) for e in read] == [
        (w.event, w.at, w.actor, w.attempt, w.error, w.run_at) for w in written
    ]


def test_a_flush_of_outcomes_writes_their_events_in_one_statement(
    history_store: JobStore,
    history_inserts: list[str],
    new_job: Callable[..., NewJob],
    now: datetime,
) -> None:
    with history_store.begin() as conn:
        history_store.insert_many(conn, [new_job(run_at=now) for _ in range(3)], now=now)
    done, retried, snoozed = history_store.claim(
        now=now, limit=3, token="t", lease_until=now + timedelta(seconds=30)
    )
    later = now + timedelta(hours=1)
    history_inserts.clear()

    owned = history_store.acknowledge_many(
        [
            Ack(done.id, "t", "done", result={"ok": True}, attempt=1),
            Ack(retried.id, "t", "pending", run_at=later, last_error="boom", attempt=1),
            Ack(snoozed.id, "t", "pending", run_at=later, due_at=later, attempts_delta=-1,
                attempt=1),
            Ack(snoozed.id + 1000, "t", "done", attempt=1),  # not ours: no event
        ],
        now=now,
        actor="worker:h:1",
    )  # fmt: skip

    assert owned == {done.id, retried.id, snoozed.id}
    assert len(history_inserts) == 1
    last = {job.id: history_of(history_store, job.id)[-1] for job in (done, retried, snoozed)}
    assert (last[done.id].event, last[done.id].actor, last[done.id].error) == (
        "done",
        "worker:h:1",
        None,
    )
    assert (last[retried.id].event, last[retried.id].error, last[retried.id].run_at) == (
        "retried",
        "boom",
        later,
    )
    assert (last[snoozed.id].event, last[snoozed.id].run_at) == ("snoozed", later)


def test_a_lost_claim_records_no_outcome(
    history_store: JobStore, new_job: Callable[..., NewJob], now: datetime
) -> None:
    one_job(history_store, new_job, now)
    (job,) = history_store.claim(now=now, limit=1, token="a", lease_until=now)
    history_store.reclaim_lapsed(now=now + timedelta(seconds=1), actor="worker:h:2")

    assert not history_store.ack_done(job, now=now + timedelta(seconds=2), actor="worker:h:1")
    assert [e.event for e in history_of(history_store, job.id)] == [
        "scheduled",
        "started",
        "reclaimed",
    ]


def test_reclaim_names_the_worker_that_lost_the_lease_then_a_second_start(
    history_store: JobStore, new_job: Callable[..., NewJob], now: datetime
) -> None:
    job = one_job(history_store, new_job, now)
    history_store.claim(now=now, limit=1, token="a", lease_until=now, actor="worker:h:1")
    later = now + timedelta(seconds=5)
    assert history_store.reclaim_lapsed(now=later, actor="worker:h:2") == (1, 0)
    (again,) = history_store.claim(
        now=later, limit=1, token="b", lease_until=later + timedelta(seconds=30), actor="worker:h:2"
    )
    assert history_store.ack_done(again, now=later, actor="worker:h:2")

    history = history_of(history_store, job.id)
    assert [(e.event, e.actor, e.attempt) for e in history] == [
        ("scheduled", "app", 0),
        ("started", "worker:h:1", 1),
        ("reclaimed", "worker:h:2", 1),
        ("started", "worker:h:2", 2),
        ("done", "worker:h:2", 2),
    ]
    assert history[2].error is not None and "worker:h:1" in history[2].error


def test_reclaim_of_a_job_out_of_attempts_records_reclaimed_and_failed(
    history_store: JobStore, new_job: Callable[..., NewJob], now: datetime
) -> None:
    job = one_job(history_store, new_job, now, max_attempts=1)
    history_store.claim(now=now, limit=1, token="a", lease_until=now, actor="worker:h:1")
    assert history_store.reclaim_lapsed(now=now + timedelta(seconds=5), actor="w2") == (0, 1)
    assert [e.event for e in history_of(history_store, job.id)] == [
        "scheduled",
        "started",
        "reclaimed",
        "failed",
    ]


def test_release_takes_back_the_started_event_of_a_claim_never_run(
    history_store: JobStore, new_job: Callable[..., NewJob], now: datetime
) -> None:
    job = one_job(history_store, new_job, now)
    lease = now + timedelta(seconds=30)
    claimed = history_store.claim(now=now, limit=1, token="a", lease_until=lease)
    assert history_store.release(claimed, now=now) == 1
    assert [e.event for e in history_of(history_store, job.id)] == ["scheduled"]


def test_prune_removes_the_history_with_its_job(
    history_store: JobStore, new_job: Callable[..., NewJob], now: datetime
) -> None:
    old = one_job(history_store, new_job, now)
    kept = one_job(history_store, new_job, now)
    with history_store.begin() as conn:
        assert history_store.cancel(conn, now=now, job_id=old.id, actor="ops") is not None

    deleted = history_store.prune(
        settled_before=now + timedelta(seconds=1), failed_before=now + timedelta(seconds=1)
    )

    assert deleted == 1
    assert history_of(history_store, old.id) == []
    assert [e.event for e in history_of(history_store, kept.id)] == ["scheduled"]
    h = history_store.history_table
    assert h is not None
    with history_store.begin() as conn:
        job_ids = set(conn.execute(select(h.c.job_id).group_by(h.c.job_id)).scalars())
        assert job_ids == {kept.id}
        assert conn.execute(select(func.count()).select_from(h)).scalar_one() == 1


def test_bulk_cancel_records_one_event_per_job(
    history_store: JobStore, new_job: Callable[..., NewJob], now: datetime
) -> None:
    a = one_job(history_store, new_job, now, key="b:1")
    b = one_job(history_store, new_job, now, key="b:2")
    with history_store.begin() as conn:
        cancelled, running = history_store.cancel_many_jobs(
            conn, JobFilter(key_prefix="b:"), now=now, actor="ops"
        )
    assert (len(cancelled), running) == (2, 0)
    for job in (a, b):
        assert [(e.event, e.actor) for e in history_of(history_store, job.id)][-1] == (
            "cancelled",
            "ops",
        )


def test_the_history_of_an_id_no_job_has_is_empty_whatever_the_id(kit: AppKit) -> None:
    for unknown in (0, -1, 12345, 2**63):
        assert kit.defer.history(unknown) == []
    with pytest.raises(InvalidArgument):
        kit.defer.history("12")  # type: ignore[arg-type]


def test_a_done_event_carries_a_bounded_excerpt_of_the_result(kit: AppKit) -> None:
    @kit.defer.job("call")
    def call(job: Job) -> dict[str, Any]:
        return {"status": 200, "body": job.payload["body"]}

    short = kit.defer.schedule("call", {"body": "<b>ok</b>"})
    long = kit.defer.schedule("call", {"body": "x" * 500})
    kit.db.session.commit()
    kit.defer.run_due()
    [done] = [e for e in kit.defer.history(short.id) if e.event == "done"]
    # JSON of the stored result (PostgreSQL's jsonb orders the keys its own way).
    assert done.result_excerpt is not None
    assert json.loads(done.result_excerpt) == {"status": 200, "body": "<b>ok</b>"}
    [cut] = [e for e in kit.defer.history(long.id) if e.event == "done"]
    assert cut.result_excerpt is not None and len(cut.result_excerpt) == 201
    assert cut.result_excerpt.endswith("…")
    assert all(e.result_excerpt is None for e in kit.defer.history(long.id) if e.event != "done")


def test_a_parents_acknowledgement_lowers_its_children_and_releases_those_at_zero(
    history_store: JobStore, new_job: Callable[..., NewJob], now: datetime
) -> None:
    """The release statement of each driver: a child waiting for two parents is lowered
    by the first and released by the second; a released child is due from its run_at,
    or from the release when its run_at has passed; each release writes one
    ``released`` event carrying the row's run_at, attempt 0 and the acknowledging actor."""
    store = history_store
    first, second = one_job(store, new_job, now), one_job(store, new_job, now)
    early, late = now - timedelta(minutes=10), now + timedelta(hours=1)
    with store.begin() as conn:
        both = store.insert(conn, new_job(run_at=early), now=now, replace=False)
        store.attach(conn, both, [first.id, second.id], "done", now=now)
        later = store.insert(conn, new_job(run_at=late), now=now, replace=False)
        store.attach(conn, later, [first.id], "done", now=now)
    lease = now + timedelta(seconds=30)
    claimed = store.claim(now=now, limit=10, token="t", lease_until=lease)
    assert sorted(job.id for job in claimed) == sorted([first.id, second.id])
    t = store.table

    def row(job_id: int) -> tuple[Any, ...]:
        with store.begin() as conn:
            found = conn.execute(
                select(t.c.waiting_for, t.c.due_at, t.c.run_at).where(t.c.id == job_id)
            ).one()
        return tuple(found)

    def released(job_id: int) -> list[tuple[Any, ...]]:
        return [
            (e.actor, e.attempt, e.run_at, e.at)
            for e in history_of(store, job_id)
            if e.event == "released"
        ]

    at = now + timedelta(seconds=5)
    store.acknowledge_many([Ack(first.id, "t", "done", attempt=1)], now=at, actor="w1")
    assert row(both.id) == (1, early, early)  # lowered, still waiting
    assert released(both.id) == []
    assert row(later.id) == (None, late, late)  # released, due from its own run_at
    assert released(later.id) == [("w1", 0, late, at)]

    store.acknowledge_many([Ack(second.id, "t", "done", attempt=1)], now=at, actor="w2")
    assert row(both.id) == (None, at, early)  # its run_at passed: due from the release
    assert released(both.id) == [("w2", 0, early, at)]
    assert released(later.id) == [("w1", 0, late, at)]  # released once


def test_one_acknowledgement_batch_releases_only_the_children_of_parents_it_settles(
    history_store: JobStore, new_job: Callable[..., NewJob], now: datetime
) -> None:
    """In one batch: a parent that settles releases its child; a parent sent back to
    pending (a retry) and a parent whose claim was lost release nothing, and the lost
    one's acknowledgement is not counted nor recorded."""
    store = history_store
    settled, retried, lost = (one_job(store, new_job, now) for _ in range(3))
    with store.begin() as conn:
        children = {}
        for parent in (settled, retried, lost):
            child = store.insert(conn, new_job(run_at=now), now=now, replace=False)
            store.attach(conn, child, [parent.id], "settled", now=now)
            children[parent.id] = child.id
    lease = now + timedelta(seconds=30)
    claimed = store.claim(now=now, limit=10, token="t", lease_until=lease)
    assert sorted(job.id for job in claimed) == sorted([settled.id, retried.id, lost.id])
    at = now + timedelta(seconds=5)
    acks = [
        Ack(settled.id, "t", "failed", last_error="gave up", attempt=1),
        Ack(retried.id, "t", "pending", run_at=at + timedelta(minutes=1), attempt=1),
        Ack(lost.id, "another claim", "done", attempt=1),
    ]
    assert store.acknowledge_many(acks, now=at, actor="w") == {settled.id, retried.id}

    def waiting_for(job_id: int) -> Any:
        with store.begin() as conn:
            return conn.execute(
                select(store.table.c.waiting_for).where(store.table.c.id == job_id)
            ).scalar_one()

    assert waiting_for(children[settled.id]) is None
    assert waiting_for(children[retried.id]) == 1
    assert waiting_for(children[lost.id]) == 1
    assert [e.event for e in history_of(store, lost.id)] == ["scheduled", "started"]
    assert [e.event for e in history_of(store, retried.id)][-1] == "retried"


def test_a_store_without_history_releases_children_all_the_same(
    store: JobStore, new_job: Callable[..., NewJob], now: datetime
) -> None:
    parent = one_job(store, new_job, now)
    with store.begin() as conn:
        child = store.insert(conn, new_job(run_at=now), now=now, replace=False)
        store.attach(conn, child, [parent.id], "done", now=now)
    store.claim(now=now, limit=10, token="t", lease_until=now + timedelta(seconds=30))
    store.acknowledge_many([Ack(parent.id, "t", "done", attempt=1)], now=now)
    with store.begin() as conn:
        assert conn.execute(
            select(store.table.c.waiting_for, store.table.c.status).where(
                store.table.c.id == child.id
            )
        ).one() == (None, "pending")
