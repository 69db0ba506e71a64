"""The store methods the helpers add (hold_claim, batch_append), on a bare engine."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest

from flask_defer import JobStatus
from flask_defer.store import JobStore, NewJob

MakeJob = Callable[..., NewJob]


def claim(store: JobStore, now: datetime) -> list:
    return store.claim(
        now=now, limit=10, token=uuid.uuid4().hex, lease_until=now + timedelta(seconds=30)
    )


def append(store: JobStore, now: datetime, item: object, **options: object):  # type: ignore[no-untyped-def]
    values: dict[str, object] = {
        "name": "digest",
        "key": "post:1",
        "item_json": json.dumps(item),
        "now": now,
        "max_items": None,
        "debounce_until": None,
    }
    values.update(options)
    with store.begin() as conn:
        return store.batch_append(conn, **values)  # type: ignore[arg-type]


def test_keyed_inserts_keep_working_once_the_statement_is_prepared(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    # psycopg prepares a statement from its sixth run on one connection; the
    # ON CONFLICT clause must still find the partial live-key index then.
    with store.begin() as conn:
        for n in range(12):
            store.insert(conn, new_job(key=f"k{n}"), now=now, replace=False)
        for n in range(12):
            store.insert(conn, new_job(key=f"k{n}"), now=now, replace=True)


def test_hold_claim_is_true_only_for_the_current_claim(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    with store.begin() as conn:
        store.insert(conn, new_job(), now=now, replace=False)
    [job] = claim(store, now)
    with store.begin() as conn:
        assert store.hold_claim(conn, job) is True
    store.reclaim_lapsed(now=now + timedelta(seconds=31))
    with store.begin() as conn:
        assert store.hold_claim(conn, job) is False


@pytest.mark.parametrize("backend", ["postgresql"])
def test_hold_claim_keeps_a_reclaim_out_until_the_atomic_handler_commits(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    # An atomic handler that checked its claim must be able to commit its work with
    # the done mark: a reclaim in the meantime would hand the job to another worker
    # (a second run) while this transaction still goes on.
    with store.begin() as conn:
        store.insert(conn, new_job(max_attempts=5), now=now, replace=False)
    [job] = claim(store, now)
    lapsed_at = now + timedelta(minutes=5)
    reclaimed: list[tuple[int, int]] = []
    reclaimer = threading.Thread(
        target=lambda: reclaimed.append(store.reclaim_lapsed(now=lapsed_at))
    )
    with store.begin() as conn:
        assert store.hold_claim(conn, job) is True
        reclaimer.start()
        time.sleep(0.5)
        assert reclaimed == [], "a reclaim went through while the claim was held"
        assert store.ack_done(job, now=lapsed_at, conn=conn)
    reclaimer.join(10)
    assert reclaimed == [(0, 0)]
    with store.begin() as conn:
        stored = store.get(conn, job_id=job.id)
    assert stored.status is JobStatus.DONE and stored.attempts == 1


def test_batch_append_adds_to_a_pending_batch_only(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    due = now + timedelta(minutes=1)
    first = new_job(
        name="digest", key="post:1", run_at=due, payload={"key": "post:1", "items": [{"n": 1}]}
    )
    with store.begin() as conn:
        job = store.insert(conn, first, now=now, replace=False)
    added = append(store, now, {"n": 2})
    assert added is not None and added.job_id == job.id and added.items == 2
    assert added.run_at == job.run_at  # window mode leaves the due time alone
    # An array item stays one item.
    assert append(store, now, [3, 4]).items == 3
    assert append(store, now, {"n": 5}, name="other") is None  # another job's key
    assert append(store, now, {"n": 5}, key="post:2") is None

    [claimed] = claim(store, due)
    assert claimed.payload["items"] == [{"n": 1}, {"n": 2}, [3, 4]]
    assert append(store, now, {"n": 6}) is None  # running: the item must go elsewhere
    with store.begin() as conn:
        assert store.get(conn, job_id=job.id).payload["items"] == [{"n": 1}, {"n": 2}, [3, 4]]


def test_batch_append_refuses_a_due_batch_which_then_gives_up_its_slot(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    first = new_job(name="digest", key="post:1", payload={"items": [0]})  # due at now
    with store.begin() as conn:
        job = store.insert(conn, first, now=now, replace=False)
    assert append(store, now, 1) is None
    with store.begin() as conn:
        assert store.batch_retire_due(conn, name="digest", key="post:1", now=now)
        assert not store.batch_retire_due(conn, name="digest", key="post:1", now=now)
    with store.begin() as conn:
        retired = store.get(conn, job_id=job.id)
    assert retired.key == f"post:1#due-{job.id}" and retired.payload["items"] == [0]
    assert [j.id for j in claim(store, now)] == [job.id]


@pytest.mark.parametrize("backend", ["postgresql"])
def test_producers_of_a_busy_key_never_hold_a_due_batch_away_from_the_claim(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    first = new_job(name="digest", key="post:1", run_at=now, payload={"items": [0]})
    with store.begin() as conn:
        job = store.insert(conn, first, now=now, replace=False)
    with store.engine.connect() as producer, producer.begin():
        # A web request adds an item after the batch fell due and has not committed.
        appended = store.batch_append(
            producer,
            name="digest",
            key="post:1",
            item_json="1",
            now=now + timedelta(milliseconds=1),
            max_items=None,
            debounce_until=None,
        )
        assert appended is None
        # The worker's claim is not kept from the batch by that open transaction.
        assert [j.id for j in claim(store, now + timedelta(milliseconds=2))] == [job.id]


def test_batch_append_refuses_a_full_batch_and_makes_it_due(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    later = now + timedelta(minutes=5)
    first = new_job(name="digest", key="post:1", run_at=later, payload={"items": [1]})
    with store.begin() as conn:
        store.insert(conn, first, now=now, replace=False)
    assert append(store, now, 2, max_items=3).run_at == later
    full = append(store, now, 3, max_items=3)
    assert full.items == 3 and full.run_at == now
    assert append(store, now, 4, max_items=3) is None


def test_batch_append_debounces_up_to_flush_by(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    flush_by = now + timedelta(seconds=30)
    payload = {"items": [0], "flush_by": flush_by.isoformat(timespec="microseconds")}
    due = now + timedelta(seconds=10)
    first = new_job(name="digest", key="post:1", run_at=due, payload=payload)
    with store.begin() as conn:
        store.insert(conn, first, now=now, replace=False)
    moved = append(store, now, 1, debounce_until=now + timedelta(seconds=25, microseconds=7))
    assert moved.run_at == now + timedelta(seconds=25, microseconds=7)
    capped = append(store, now, 2, debounce_until=now + timedelta(seconds=45))
    assert capped.run_at == flush_by
    with store.begin() as conn:
        job = store.get(conn, key="post:1")
    assert job.run_at == flush_by and job.status is JobStatus.PENDING


def test_batch_append_debounce_without_flush_by_is_uncapped(
    store: JobStore, new_job: MakeJob, now: datetime
) -> None:
    first = new_job(
        name="digest", key="post:1", run_at=now + timedelta(seconds=1), payload={"items": [0]}
    )
    with store.begin() as conn:
        store.insert(conn, first, now=now, replace=False)
    moved = append(store, now, 1, debounce_until=now + timedelta(days=3))
    assert moved.run_at == now + timedelta(days=3)
