"""The store on a bare engine: every statement, on SQLite and PostgreSQL."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, inspect, text

from flask_defer import Job, JobExists, JobStatus
from flask_defer.store import UNKNOWN_HANDLER_NOTE, JobFilter, JobStore, NewJob
from flask_defer.validation import payload_text

MakeJob = Callable[..., NewJob]


def insert(store: JobStore, job: NewJob, now: datetime, replace: bool = False) -> int:
    with store.begin() as conn:
        return store.insert(conn, job, now=now, replace=replace).id


def claim(store: JobStore, now: datetime, limit: int = 10) -> list:
    return store.claim(
        now=now, limit=limit, token=uuid.uuid4().hex, lease_until=now + timedelta(seconds=30)
    )


def test_table_has_partial_indexes_for_pending_and_live_key(store: JobStore) -> None:
    indexes = {ix["name"]: ix for ix in inspect(store.engine).get_indexes("defer_jobs")}
    assert indexes["uq_defer_jobs_live_key"]["unique"]
    assert "ix_defer_jobs_pending_run_at_name" in indexes


def test_insert_returns_pending_job_with_utc_times(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    with store.begin() as conn:
        job = store.insert(conn, new_job(key="k"), now=now, replace=False)
    assert job.status is JobStatus.PENDING
    assert job.run_at == now and job.run_at.tzinfo is not None
    assert job.due_at == now
    with store.begin() as conn:
        again = store.get(conn, job_id=job.id)
    assert again == job


@pytest.mark.parametrize("backend", ["sqlite"])
def test_sqlite_insert_takes_the_write_lock_in_turn_before_writing(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    """The keyless insert runs on the driver's cursor, where SQLAlchemy's statement
    events (the app's writes taking the lock in turn) never fire; it must still open
    its transaction with the process's queued ``BEGIN IMMEDIATE``, not by pysqlite's
    own deferred BEGIN, which waits in SQLite's busy handler instead of in turn."""
    seen: list[str] = []

    @event.listens_for(store.engine, "connect")
    def traced(dbapi: Any, _record: Any) -> None:
        dbapi.set_trace_callback(seen.append)

    store.engine.dispose()
    with store.engine.begin() as conn:
        store.insert(conn, new_job(), now=now, replace=False)
    writes = [sql for sql in seen if sql.startswith(("BEGIN", "INSERT"))]
    assert writes[0] == "BEGIN IMMEDIATE", writes
    assert writes[1].startswith("INSERT INTO defer_jobs "), writes


def test_live_key_is_unique_until_the_holder_settles(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    first = insert(store, new_job(key="message:7:send"), now)
    with pytest.raises(JobExists) as raised:
        insert(store, new_job(key="message:7:send"), now)
    assert raised.value.existing_id == first
    with store.begin() as conn:
        assert store.cancel(conn, now=now, job_id=first) is not None
    second = insert(store, new_job(key="message:7:send"), now)
    assert second != first


def test_replace_swaps_the_pending_holder(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    first = insert(store, new_job(key="k", payload={"v": 1}), now)
    second = insert(store, new_job(key="k", payload={"v": 2}), now, replace=True)
    with store.begin() as conn:
        assert store.get(conn, job_id=first).status is JobStatus.CANCELLED
        live = store.get(conn, key="k")
    assert live.id == second and live.payload == {"v": 2}


def test_replace_cannot_swap_a_running_holder(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    insert(store, new_job(key="k"), now)
    assert len(claim(store, now)) == 1
    with pytest.raises(JobExists):
        insert(store, new_job(key="k"), now, replace=True)


def test_failed_insert_leaves_the_callers_transaction_usable(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    insert(store, new_job(key="k"), now)
    with store.begin() as conn:
        with pytest.raises(JobExists):
            store.insert(conn, new_job(key="k"), now=now, replace=False)
        # On PostgreSQL an integrity error would have aborted this transaction.
        other = store.insert(conn, new_job(key="other"), now=now, replace=False)
    assert other.id


def test_claim_takes_only_due_jobs_in_run_at_order(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    late = insert(store, new_job(run_at=now - timedelta(seconds=5)), now)
    early = insert(store, new_job(run_at=now - timedelta(seconds=10)), now)
    insert(store, new_job(run_at=now + timedelta(seconds=1)), now)
    claimed = claim(store, now)
    assert [job.id for job in claimed] == [early, late]
    assert all(job.status is JobStatus.RUNNING and job.attempts == 1 for job in claimed)
    assert claim(store, now) == []


def test_claim_respects_limit_and_queue(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    for _ in range(3):
        insert(store, new_job(), now)
    insert(store, new_job(queue="mail"), now)
    assert len(store.claim(now=now, limit=2, token="t", lease_until=now, queues=["default"])) == 2
    mail = store.claim(now=now, limit=5, token="t2", lease_until=now, queues=["mail"])
    assert [job.queue for job in mail] == ["mail"]


def test_cancel_after_claim_returns_none(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    job_id = insert(store, new_job(), now)
    claim(store, now)
    with store.begin() as conn:
        assert store.cancel(conn, now=now, job_id=job_id) is None
        assert store.get(conn, job_id=job_id).status is JobStatus.RUNNING


def test_cancel_with_owner_only_touches_that_owners_job(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    job_id = insert(store, new_job(owner="alice"), now)
    with store.begin() as conn:
        assert store.cancel(conn, now=now, job_id=job_id, owner="bob") is None
        assert store.cancel(conn, now=now, job_id=job_id, owner="alice") is not None


def test_hold_is_one_guarded_update_owner_open_later_and_capped(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    s = timedelta(seconds=1)
    job_id = insert(store, new_job(owner="alice", run_at=now + 6 * s, undo_until=now + 5 * s), now)

    def hold(to: timedelta, *, owner: str | None = "alice", at: datetime = now) -> Job | None:
        with store.begin() as conn:
            return store.hold(
                conn,
                job_id,
                owner=owner,
                undo_until=now + to,
                margin=s,
                max_hold=4 * s,
                now=at,
            )

    assert hold(8 * s, owner="bob") is None  # another owner's job
    assert hold(4 * s) is None  # never earlier
    moved = hold(8 * s)
    assert moved is not None and (moved.undo_until, moved.run_at) == (now + 8 * s, now + 9 * s)
    assert moved.due_at == now + 6 * s  # the first due time stays: the cap counts from it
    capped = hold(20 * s, owner=None)  # no owner given: any owner's job; cut to the cap
    assert capped is not None and (capped.undo_until, capped.run_at) == (now + 9 * s, now + 10 * s)
    assert hold(20 * s) is None  # at the cap: no further
    assert hold(9.5 * s, at=now + 9 * s) is None  # the window is over at that moment
    with store.begin() as conn:
        store.cancel(conn, now=now, job_id=job_id)
    assert hold(8.9 * s) is None  # no longer pending


def test_ack_is_compare_and_set_on_the_claim_token(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    insert(store, new_job(max_attempts=5), now)
    (stale,) = claim(store, now)
    # The lease lapses; the job is reclaimed and claimed again by another worker.
    later = now + timedelta(minutes=5)
    assert store.reclaim_lapsed(now=later) == (1, 0)
    (fresh,) = claim(store, later)
    assert not store.ack_done(stale, now=later)
    assert store.ack_done(fresh, now=later)
    with store.begin() as conn:
        job = store.get(conn, job_id=fresh.id)
    assert job.status is JobStatus.DONE and job.attempts == 2


def test_heartbeat_cannot_extend_a_lease_taken_over_by_another_worker(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    insert(store, new_job(max_attempts=5), now)
    (stale,) = claim(store, now)
    later = now + timedelta(minutes=5)
    store.reclaim_lapsed(now=later)
    (fresh,) = claim(store, later)
    # The old worker's heartbeat names the same id, with its old token.
    far = later + timedelta(hours=1)
    assert store.extend_leases([stale], now=later, lease_until=far) == 0
    with store.begin() as conn:
        job = store.get(conn, job_id=fresh.id)
    assert job.lease_expires_at == later + timedelta(seconds=30)
    assert store.extend_leases([fresh], now=later, lease_until=far) == 1
    with store.begin() as conn:
        assert store.get(conn, job_id=fresh.id).lease_expires_at == far


@pytest.mark.parametrize("backend", ["postgresql"])
def test_claim_skips_a_row_another_transaction_holds_locked(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    ids = [insert(store, new_job(run_at=now - timedelta(seconds=n)), now) for n in (3, 2, 1)]
    table = store.table
    claimed: list[list[int]] = []
    with store.engine.connect() as holder, holder.begin():
        # The oldest due row, locked as an appender or an undo would hold it.
        holder.execute(table.select().where(table.c.id == ids[0]).with_for_update()).all()
        worker = threading.Thread(target=lambda: claimed.append([j.id for j in claim(store, now)]))
        worker.start()
        # Without SKIP LOCKED the claim would wait for this transaction to end.
        worker.join(5)
        assert not worker.is_alive(), "the claim waited for a locked row"
    assert claimed == [ids[1:]]
    assert [j.id for j in claim(store, now)] == [ids[0]]


def test_reclaim_fails_a_job_out_of_attempts(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    job_id = insert(store, new_job(max_attempts=1), now)
    claim(store, now)
    assert store.reclaim_lapsed(now=now + timedelta(minutes=1)) == (0, 1)
    with store.begin() as conn:
        job = store.get(conn, job_id=job_id)
    assert job.status is JobStatus.FAILED and "lease lapsed" in (job.last_error or "")


def test_snooze_gives_the_attempt_back(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    insert(store, new_job(), now)
    (job,) = claim(store, now)
    until = now + timedelta(hours=1)
    assert store.ack_snooze(job, now=now, run_at=until, note=None, still_owed=False)
    with store.begin() as conn:
        after = store.get(conn, job_id=job.id)
    assert after.attempts == 0 and after.run_at == until and after.due_at == until


def test_retry_keeps_due_at_so_the_backlog_age_stays_true(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    insert(store, new_job(), now)
    (job,) = claim(store, now)
    assert store.ack_retry(job, now=now, run_at=now + timedelta(minutes=1), error="boom")
    with store.begin() as conn:
        after = store.get(conn, job_id=job.id)
    assert after.due_at == now and after.last_error == "boom" and after.attempts == 1


def test_reschedule_moves_only_pending_jobs(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    job_id = insert(store, new_job(key="k"), now)
    later = now + timedelta(days=30)
    with store.begin() as conn:
        moved = store.reschedule(conn, later, now=now, key="k")
    assert moved is not None and moved.run_at == later
    claim(store, later)
    with store.begin() as conn:
        assert store.reschedule(conn, later, now=now, job_id=job_id) is None


def test_key_prefix_is_literal_and_case_sensitive(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    for key in ["booking:42:a", "booking:42:b", "Booking:42:c", "booking:4200", "booking_42:x"]:
        insert(store, new_job(key=key), now)
    with store.begin() as conn:
        found = store.find(conn, JobFilter(key_prefix="booking:42:"), limit=10)
        assert sorted(job.key for job in found) == ["booking:42:a", "booking:42:b"]
        # "_" and "%" are not wildcards.
        assert [j.key for j in store.find(conn, JobFilter(key_prefix="booking_"), limit=10)] == [
            "booking_42:x"
        ]
        assert store.find(conn, JobFilter(key_prefix="%"), limit=10) == []


def test_cancel_many_counts_what_was_already_running(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    insert(store, new_job(key="booking:42:remind"), now)
    insert(store, new_job(key="booking:42:close", run_at=now + timedelta(days=90)), now)
    insert(store, new_job(key="booking:43:close"), now)
    running = store.claim(now=now, limit=1, token="t", lease_until=now + timedelta(minutes=1))
    assert running[0].key == "booking:42:remind"
    with store.begin() as conn:
        cancelled, in_flight = store.cancel_many_jobs(
            conn, JobFilter(key_prefix="booking:42:"), now=now
        )
    assert [job.key for job in cancelled] == ["booking:42:close"] and in_flight == 1


def test_status_counts_split_scheduled_from_owed(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    insert(store, new_job(run_at=now + timedelta(days=30)), now)
    insert(store, new_job(run_at=now - timedelta(minutes=10)), now)
    insert(store, new_job(run_at=now - timedelta(minutes=1)), now)
    with store.begin() as conn:
        counts = store.status_counts(conn, now=now)
    assert counts.scheduled == 1 and counts.owed == 2
    assert counts.oldest_owed_due_at == now - timedelta(minutes=10)


def test_next_run_at_is_the_earliest_pending(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    assert store.next_run_at() is None
    insert(store, new_job(run_at=now + timedelta(seconds=30)), now)
    insert(store, new_job(run_at=now + timedelta(seconds=5)), now)
    assert store.next_run_at() == now + timedelta(seconds=5)


def test_prune_deletes_only_old_settled_rows(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    old = now - timedelta(days=10)
    done_id = insert(store, new_job(run_at=old), old)
    (job,) = claim(store, old)
    store.ack_done(job, now=old)
    keep_id = insert(store, new_job(run_at=old), old)
    deleted = store.prune(settled_before=now - timedelta(days=7), failed_before=old, batch_size=1)
    assert deleted == 1
    with store.begin() as conn:
        assert store.get(conn, job_id=done_id) is None
        assert store.get(conn, job_id=keep_id) is not None


def test_cancel_versus_claim_race_has_exactly_one_winner(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    """Threads hammer the same rows: for every job, cancel XOR claim wins."""
    trials = 1000
    ids = []
    with store.begin() as conn:
        for _ in range(trials):
            ids.append(store.insert(conn, new_job(), now=now, replace=False).id)
    cancelled: set[int] = set()
    claimed: set[int] = set()
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def canceller(order: list[int]) -> None:
        try:
            start.wait()
            for job_id in order:
                with store.begin() as conn:
                    if store.cancel(conn, now=now, job_id=job_id) is not None:
                        cancelled.add(job_id)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    def claimer() -> None:
        try:
            start.wait()
            while True:
                jobs = store.claim(now=now, limit=5, token=uuid.uuid4().hex, lease_until=now)
                if not jobs:
                    with store.begin() as conn:
                        left = store.count(conn, JobFilter(statuses=(JobStatus.PENDING,)))
                    if left == 0:
                        return
                claimed.update(job.id for job in jobs)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [
        threading.Thread(target=canceller, args=(ids,)),
        threading.Thread(target=canceller, args=(list(reversed(ids)),)),
        threading.Thread(target=claimer),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors
    assert cancelled.isdisjoint(claimed)
    assert cancelled | claimed == set(ids)
    with store.begin() as conn:
        assert store.count(conn, JobFilter(statuses=(JobStatus.CANCELLED,))) == len(cancelled)
        assert store.count(conn, JobFilter(statuses=(JobStatus.RUNNING,))) == len(claimed)


def test_sqlite_bulk_insert_stores_exactly_what_sqlalchemy_executemany_stores(
    tmp_path: Path, now: datetime, new_job: MakeJob
) -> None:
    """The SQLite fast path of insert_many writes the very bytes SQLAlchemy would."""
    import sqlite3
    from contextlib import closing

    from sqlalchemy import MetaData, create_engine, insert

    from flask_defer.store.schema import define_jobs_table

    jobs = [
        new_job(
            name="remind",
            payload=payload,
            run_at=now + timedelta(hours=1, microseconds=n % 3),
            queue="mail" if n % 2 else "default",
            owner="alice" if n % 3 else None,
            label=None if n % 4 else "Reminder",
            undo_until=now + timedelta(seconds=5) if n % 5 == 0 else None,
        )
        for n, payload in enumerate(
            [{}, {"n": 1}, [1, 2.5, "x"], {"nested": {"é": None}}, "text", 7, {"b": True},
             {"q": 'a "quoted" \\ back\nslash', "emoji": "😀", "big": 2**62, "neg": -1.5e-7}]
        )
    ]
    # Half arrive with the JSON text the bulk path made while validating them.
    jobs = [
        replace(job, payload_json=payload_text(job.payload, "payload")) if n % 2 else job
        for n, job in enumerate(jobs)
    ]
    paths = {}
    for way in ("store", "sqlalchemy"):
        paths[way] = tmp_path / f"{way}.sqlite3"
        engine = create_engine(f"sqlite:///{paths[way]}")
        store = JobStore(engine, define_jobs_table(MetaData()))
        store.create_table()
        with store.begin() as conn:
            if way == "store":
                assert store.insert_many(conn, jobs, now=now) == len(jobs)
            else:
                conn.execute(insert(store.table), [store.row_values(j, now) for j in jobs])
        engine.dispose()

    def stored(path: Path) -> list[tuple[object, ...]]:
        with closing(sqlite3.connect(path)) as conn:
            return conn.execute("SELECT * FROM defer_jobs ORDER BY id").fetchall()

    assert stored(paths["store"]) == stored(paths["sqlalchemy"])
    assert len(stored(paths["store"])) == len(jobs)
    # One by one too: the keyless insert stores the JSON text validation made as it is.
    for way in ("store", "sqlalchemy"):
        paths[way].unlink()
        engine = create_engine(f"sqlite:///{paths[way]}")
        store = JobStore(engine, define_jobs_table(MetaData()))
        store.create_table()
        for job in jobs:
            with store.begin() as conn:
                if way == "store":
                    store.insert(conn, job, now=now, replace=False)
                else:
                    conn.execute(insert(store.table), store.row_values(job, now))
        engine.dispose()
    assert stored(paths["store"]) == stored(paths["sqlalchemy"])


def test_sqlite_bulk_insert_of_a_large_batch_goes_in_several_statements_with_one_event_each(
    tmp_path: Path, now: datetime, new_job: MakeJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch whose JSON passes the chunk budget is written in several INSERTs; its ids
    stay consecutive, in the batch's order, and each row gets its scheduled event."""
    from sqlalchemy import MetaData, create_engine

    import flask_defer.store.sqlite as sqlite_driver
    from flask_defer.store.schema import define_history_table, define_jobs_table

    monkeypatch.setattr(sqlite_driver, "BULK_CHUNK_BYTES", 2_000)
    engine = create_engine(f"sqlite:///{tmp_path / 'chunks.sqlite3'}")
    metadata = MetaData()
    store = JobStore(engine, define_jobs_table(metadata), define_history_table(metadata))
    store.create_table()
    insert(store, new_job(name="before"), now)  # the batch's ids do not start at 1
    jobs = [
        replace(job, payload_json=payload_text(job.payload, "payload"))
        for job in (new_job(name="bulk", payload={"n": n, "pad": "x" * 100}) for n in range(60))
    ]
    inserts: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.startswith(f"INSERT INTO {store.quoted_table} ("):
            inserts.append(statement)

    with store.begin() as conn:
        assert store.insert_many(conn, jobs, now=now, actor="importer") == len(jobs)
    assert len(inserts) >= 5  # 60 rows of ~230 bytes in 2,000-byte statements
    with store.begin() as conn:
        rows = conn.execute(
            text("SELECT id, payload FROM defer_jobs WHERE name = 'bulk' ORDER BY id")
        ).all()
        events = conn.execute(
            text("SELECT job_id, event, actor FROM defer_jobs_history ORDER BY id")
        ).all()
    ids = [row[0] for row in rows]
    assert ids == list(range(ids[0], ids[0] + len(jobs)))
    assert [row[1] for row in rows] == [job.payload_json for job in jobs]
    scheduled = [(job_id, actor) for job_id, kind, actor in events if kind == "scheduled"]
    assert scheduled[-len(jobs):] == [(job_id, "importer") for job_id in ids]
    engine.dispose()


@pytest.mark.parametrize("way", ["bulk", "one by one"])
def test_the_store_inserts_store_what_sqlalchemy_stores_and_one_event_per_row(
    engine: Engine, new_job: MakeJob, now: datetime, way: str
) -> None:
    """Both backends, both ways past SQLAlchemy's execution: the prebuilt bulk insert
    (unnest arrays on PostgreSQL, one INSERT ... SELECT over a JSON array and
    last_insert_rowid() on SQLite) and the one-job insert on the driver's cursor write
    the same rows as SQLAlchemy's own insert of the same values, each payload with and
    without the JSON text validation made of it, and each row's ``scheduled`` event
    names that row."""
    from sqlalchemy import MetaData, select
    from sqlalchemy import insert as sa_insert

    from flask_defer.store.schema import define_history_table, define_jobs_table

    metadata = MetaData()
    store = JobStore(engine, define_jobs_table(metadata), define_history_table(metadata))
    store.create_table()
    payloads: list[object] = [
        {}, {"n": 1}, [1, 2.5, "x"], {"é": None}, "text", 7,
        {"q": 'a "quoted" \\ back\nslash', "emoji": "😀", "big": 2**62, "neg": -1.5e-7},
    ]  # fmt: skip
    jobs = [
        new_job(
            name=f"job{n}",
            payload=payload,
            run_at=now + timedelta(minutes=n),
            owner="alice" if n % 2 else None,
            label="Sent" if n % 3 == 0 else None,
            undo_until=now + timedelta(seconds=5) if n % 2 == 0 else None,
        )
        for n, payload in enumerate(payloads)
    ]
    # Each payload twice: as it is, and with the JSON text validation made of it.
    jobs += [replace(job, payload_json=payload_text(job.payload, "payload")) for job in jobs]
    t = store.table
    columns = [c for c in t.c if c.name not in ("id",)]
    insert(store, new_job(name="before"), now)  # the batch's ids do not start at 1
    with store.begin() as conn:
        if way == "bulk":
            assert store.insert_many(conn, jobs, now=now, actor="importer") == len(jobs)
        else:
            for job in jobs:
                store.insert(conn, job, now=now, replace=False, actor="importer")
        conn.execute(sa_insert(t), [store.row_values(j, now) for j in jobs])
        rows = conn.execute(select(t.c.id, *columns).where(t.c.name != "before").order_by(t.c.id))
        by_way = [tuple(row[1:]) for row in rows]
        store_ids = [
            row.id
            for row in conn.execute(
                select(t.c.id).where(t.c.name != "before").order_by(t.c.id).limit(len(jobs))
            )
        ]
    assert by_way[: len(jobs)] == by_way[len(jobs) :]
    with store.begin() as conn:
        for job_id, job in zip(store_ids, jobs, strict=True):
            [event] = store.history(conn, job_id)
            assert (event.event, event.actor, event.run_at) == ("scheduled", "importer", job.run_at)
            assert store.get(conn, job_id=job_id).name == job.name


def _settle(store: JobStore, new_job: MakeJob, now: datetime, name: str, n: int) -> None:
    for _ in range(n):
        job_id = insert(store, new_job(name=name), now)
        with store.begin() as conn:
            assert store.cancel(conn, now=now, job_id=job_id) is not None


def test_settled_counts_stop_at_the_cap_and_say_they_are_lower_bounds(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    _settle(store, new_job, now, "a", 3)
    _settle(store, new_job, now, "b", 2)
    insert(store, new_job(name="a", run_at=now + timedelta(days=1)), now)
    with store.begin() as conn:
        capped = {p.name: p for p in store.counts_by_name(conn, now=now, settled_cap=3)}
        exact = {p.name: p for p in store.counts_by_name(conn, now=now, settled_cap=5)}
    # One row past the cap is read, to know there are more: "at least 4".
    assert sum(p.by_status["cancelled"] for p in capped.values()) == 4
    assert all(p.lower_bounds == frozenset({"cancelled"}) for p in capped.values())
    # Live figures stay exact either way.
    assert capped["a"].scheduled == 1 and capped["a"].by_status["pending"] == 1
    assert exact["a"].by_status["cancelled"] == 3 and exact["b"].by_status["cancelled"] == 2
    assert all(not p.lower_bounds for p in exact.values())


def test_scheduled_counts_stop_at_the_cap_and_mark_pending_a_lower_bound(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    for days in (1, 2, 3):
        insert(store, new_job(name="later", run_at=now + timedelta(days=days)), now)
    insert(store, new_job(name="soon", run_at=now + timedelta(minutes=1)), now)
    for minutes in (1, 2):
        insert(store, new_job(name="later", run_at=now - timedelta(minutes=minutes)), now)
    with store.begin() as conn:
        capped = {p.name: p for p in store.counts_by_name(conn, now=now, scheduled_cap=2)}
        exact = {p.name: p for p in store.counts_by_name(conn, now=now, scheduled_cap=4)}
    # The soonest rows are counted, one past the cap: "at least 3" scheduled.
    assert capped["soon"].scheduled == 1 and capped["later"].scheduled == 2
    assert all(p.lower_bounds == frozenset({"pending"}) for p in capped.values())
    # Owed work is exact whatever the cap.
    assert capped["later"].owed == 2
    assert capped["later"].oldest_owed_due_at == now - timedelta(minutes=2)
    assert exact["later"].scheduled == 3 and exact["later"].by_status["pending"] == 5
    assert all(not p.lower_bounds for p in exact.values())


def test_counts_by_name_reads_only_indexes(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    """Health's statement reads each part from an index alone, never from the table.

    On SQLite every part over pending, failed or settled rows uses a covering index
    (running rows, a worker's few in-flight jobs, are looked up through theirs). On
    PostgreSQL, with sequential and bitmap scans ruled out as a large table would rule
    them out, the pending and settled parts are index-only scans.
    """
    insert(store, new_job(), now)
    statement = store._counts_statement()
    params = {"now": now, "note": "x%", "scheduled_window": 10, "settled_window": 10}
    with store.begin() as conn:
        compiled = statement.compile(dialect=conn.dialect)
        sql, binds = str(compiled), compiled.construct_params(params)
        if store.driver.name == "sqlite":
            positional = tuple(binds[name] for name in compiled.positiontup or ())
            plan = [row[3] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", positional)]
            reads = [line for line in plan if "defer_jobs" in line]
            assert all("INDEX" in line for line in reads), plan
            # All but the running and the waiting-for-a-handler parts, whose few rows
            # are looked up in the table.
            covering = [line for line in reads if "COVERING INDEX" in line]
            assert len(covering) == len(reads) - 2, plan
            assert any("ix_defer_jobs_pending_run_at_name" in line for line in covering)
            assert any("ix_defer_jobs_status_finished_name" in line for line in covering)
            assert any("ix_defer_jobs_pending_errors" in line for line in reads)
        else:
            conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
            conn.exec_driver_sql("SET LOCAL enable_bitmapscan = off")
            plan = "\n".join(row[0] for row in conn.exec_driver_sql(f"EXPLAIN {sql}", binds))
            assert "Seq Scan" not in plan, plan
            assert "Index Only Scan using ix_defer_jobs_pending_run_at_name" in plan, plan
            assert "Index Only Scan using ix_defer_jobs_status_finished_name" in plan, plan


def test_counts_on_a_table_without_the_read_indexes_still_count(
    store: JobStore, new_job: MakeJob, now: datetime, caplog: pytest.LogCaptureFixture
) -> None:
    # A database not upgraded to flask_defer_0005 yet: the web keeps serving health.
    insert(store, new_job(run_at=now - timedelta(minutes=1)), now)
    insert(store, new_job(run_at=now + timedelta(days=1)), now)
    with store.begin() as conn:
        conn.execute(text("DROP INDEX ix_defer_jobs_pending_run_at_name"))
        conn.execute(text("DROP INDEX ix_defer_jobs_pending_errors"))
    with caplog.at_level(logging.WARNING, logger="flask_defer"), store.begin() as conn:
        counts = store.status_counts(conn, now=now)
    assert (counts.owed, counts.scheduled) == (1, 1)
    if store.driver.name == "sqlite":
        assert "missing from the database" in caplog.text


def test_counts_by_name_counts_jobs_a_worker_left_without_a_handler(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    insert(store, new_job(name="send_email"), now)
    insert(store, new_job(name="old_name"), now)
    [claimed] = store.claim(now=now, limit=1, token="t", lease_until=now)
    store.ack_snooze(
        claimed,
        now=now,
        run_at=now + timedelta(seconds=30),
        note=f"{UNKNOWN_HANDLER_NOTE} for {claimed.name!r} in the worker",
        still_owed=True,
    )
    with store.begin() as conn:
        parts = store.counts_by_name(conn, now=now)
        # send_email was left by a worker that lacks it; old_name lacks one here.
        assert claimed.name == "send_email"
        for known, expected in (
            ({"send_email"}, 2), ({"send_email", "old_name"}, 1), (set(), 2),
        ):  # fmt: skip
            assert sum(p.unknown(known) for p in parts) == expected
            assert store.count_unknown(conn, known) == expected


def test_bounded_count_reads_no_further_than_its_limit(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    for _ in range(5):
        insert(store, new_job(), now)
    with store.begin() as conn:
        assert store.count(conn, JobFilter(), limit=3) == 3
        assert store.count(conn, JobFilter(), limit=10) == 5
        assert store.count(conn, JobFilter()) == 5
