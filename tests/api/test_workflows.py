"""Jobs that run after other jobs, and groups with one callback, through the public API,
on both backends: ``schedule(..., after=, after_policy=)``, ``defer.parents``,
``defer.group``, what settling a parent does to its children (done, failed, cancelled,
undone, expired, replaced), the argument checks, and real workers releasing children."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import func, select, text
from sqlalchemy.exc import DBAPIError

from flask_defer import Defer, Group, InvalidArgument, Job, JobNotFound, JobStatus, UnknownJob
from flask_defer.timeutil import utcnow

from ..conftest import AppKit
from ..engine.test_worker import MakeKit, make_kit
from ..worker_helpers import wait_until, worker_thread

__all__ = ["make_kit"]


@pytest.fixture
def kit(make_kit: MakeKit) -> AppKit:
    kit = make_kit()
    ran: list[tuple[str, Any]] = []
    kit.app.extensions["ran"] = ran

    @kit.defer.job("step", max_attempts=1)
    def step(job: Job) -> Any:
        ran.append(("step", job.payload))
        if job.payload and job.payload.get("fail"):
            raise RuntimeError(f"step {job.payload.get('n')} broke")
        return {"n": (job.payload or {}).get("n")}

    @kit.defer.job("collect", max_attempts=1)
    def collect(job: Job) -> list[Any]:
        parents = kit.defer.parents(job)
        ran.append(("collect", [(p.id, p.status.value, p.result) for p in parents]))
        return [p.result for p in parents]

    return kit


def ran(kit: AppKit) -> list[tuple[str, Any]]:
    return kit.app.extensions["ran"]  # type: ignore[no-any-return]


def stored(kit: AppKit, job_id: int) -> Job:
    job = kit.defer.get(job_id)
    assert job is not None
    return job


def events(kit: AppKit, job_id: int) -> list[str]:
    return [event.event for event in kit.defer.history(job_id)]


# -- waiting and running ---------------------------------------------------------------


def test_a_child_waits_pending_until_its_parents_are_done_then_reads_their_results(
    kit: AppKit,
) -> None:
    first = kit.defer.schedule("step", {"n": 1})
    second = kit.defer.schedule("step", {"n": 2}, delay=timedelta(minutes=5))
    child = kit.defer.schedule("collect", after=[first, second.id])
    kit.db.session.commit()
    assert child.waiting_for == 2 and child.status is JobStatus.PENDING

    kit.defer.run_due()
    assert ran(kit) == [("step", {"n": 1})]  # the child waits for the second parent
    waiting = stored(kit, child.id)
    assert waiting.status is JobStatus.PENDING and waiting.waiting_for == 1

    kit.defer.run_due(now=utcnow() + timedelta(minutes=6))
    assert [name for name, _ in ran(kit)] == ["step", "step", "collect"]
    assert ran(kit)[-1] == (
        "collect", [(first.id, "done", {"n": 1}), (second.id, "done", {"n": 2})],
    )  # fmt: skip
    done = stored(kit, child.id)
    assert done.status is JobStatus.DONE and done.waiting_for is None
    assert done.result == [{"n": 1}, {"n": 2}]
    assert events(kit, child.id) == ["scheduled", "released", "started", "done"]


def test_a_waiting_child_is_neither_due_nor_owed_nor_next(kit: AppKit) -> None:
    parent = kit.defer.schedule("step", {"n": 1}, delay=timedelta(hours=1))
    child = kit.defer.schedule("collect", after=parent)
    kit.db.session.commit()
    store = kit.defer.store
    now = utcnow()
    # The child's run_at is now, yet nothing is due before the parent's hour.
    assert child.run_at <= now + timedelta(seconds=1)
    assert store.count_due(now=now + timedelta(minutes=1)) == 0
    next_at = store.next_run_at(now=now)
    assert next_at is not None and next_at > now + timedelta(minutes=59)
    assert kit.defer.run_due().ran == 0
    health = kit.defer.health()
    assert health.owed == 0


def test_a_parent_done_before_the_child_is_scheduled_does_not_hold_it(kit: AppKit) -> None:
    parent = kit.defer.schedule("step", {"n": 1})
    kit.db.session.commit()
    kit.defer.run_due()
    child = kit.defer.schedule("collect", after=parent)
    kit.db.session.commit()
    assert child.waiting_for is None
    kit.defer.run_due()
    assert stored(kit, child.id).result == [{"n": 1}]


def test_a_child_and_its_parent_scheduled_in_one_transaction_roll_back_together(
    kit: AppKit,
) -> None:
    parent = kit.defer.schedule("step", {"n": 1})
    child = kit.defer.schedule("collect", after=parent)
    kit.db.session.rollback()
    assert kit.defer.get(parent.id) is None and kit.defer.get(child.id) is None
    assert kit.defer.parents(child.id) == []


# -- the "done" and "settled" policies ----------------------------------------------------


def test_a_failed_parent_cancels_its_done_children_and_their_children_naming_it(
    kit: AppKit,
) -> None:
    parent = kit.defer.schedule("step", {"n": 1, "fail": True})
    child = kit.defer.schedule("collect", after=parent)
    grandchild = kit.defer.schedule("collect", after=child)
    tolerant = kit.defer.schedule("collect", after=child, after_policy="settled")
    kit.db.session.commit()

    kit.defer.run_due()

    cancelled = stored(kit, child.id)
    assert cancelled.status is JobStatus.CANCELLED
    assert f"parent job {parent.id} failed" in (cancelled.last_error or "")
    assert events(kit, child.id) == ["scheduled", "cancelled"]
    assert kit.defer.history(child.id)[-1].error == cancelled.last_error
    assert f"parent job {child.id} cancelled" in (stored(kit, grandchild.id).last_error or "")
    # The "settled" grandchild runs, and sees its parent's outcome.
    assert stored(kit, tolerant.id).status is JobStatus.DONE
    assert ("collect", [(child.id, "cancelled", None)]) in ran(kit)
    assert [name for name, _ in ran(kit)] == ["step", "collect"]


def test_a_settled_child_runs_whatever_its_parents_outcomes(kit: AppKit) -> None:
    broken = kit.defer.schedule("step", {"n": 1, "fail": True})
    fine = kit.defer.schedule("step", {"n": 2})
    child = kit.defer.schedule("collect", after=[broken, fine], after_policy="settled")
    kit.db.session.commit()
    kit.defer.run_due()
    kit.defer.run_due()
    assert stored(kit, child.id).status is JobStatus.DONE
    assert ran(kit)[-1] == ("collect", [(broken.id, "failed", None), (fine.id, "done", {"n": 2})])


def test_a_parent_already_failed_cancels_a_new_done_child_at_once(kit: AppKit) -> None:
    parent = kit.defer.schedule("step", {"n": 1, "fail": True})
    kit.db.session.commit()
    kit.defer.run_due()
    child = kit.defer.schedule("collect", after=parent)
    kit.db.session.commit()
    assert child.status is JobStatus.CANCELLED
    assert f"parent job {parent.id} failed" in (child.last_error or "")
    assert stored(kit, child.id).status is JobStatus.CANCELLED


# -- cancel, undo, expiry, replace ------------------------------------------------------


def test_cancelling_a_parent_cancels_its_done_children_in_the_same_call(kit: AppKit) -> None:
    parent = kit.defer.schedule("step", {"n": 1}, delay=60)
    strict = kit.defer.schedule("collect", after=parent)
    tolerant = kit.defer.schedule("collect", after=parent, after_policy="settled")
    kit.db.session.commit()

    assert kit.defer.cancel(parent.id, actor="alice") is True
    kit.db.session.commit()

    assert stored(kit, strict.id).status is JobStatus.CANCELLED
    assert kit.defer.history(strict.id)[-1].actor == "alice"
    released = stored(kit, tolerant.id)
    assert released.status is JobStatus.PENDING and released.waiting_for is None
    kit.defer.run_due()
    assert stored(kit, tolerant.id).status is JobStatus.DONE


def test_undoing_a_parent_cancels_its_children(kit: AppKit) -> None:
    parent = kit.defer.undoable("step", {"n": 1}, owner="u1", window=30)
    child = kit.defer.schedule("collect", after=parent, owner="u1")
    kit.db.session.commit()
    assert kit.defer.undo(parent.id, owner="u1").undone
    kit.db.session.commit()
    assert stored(kit, child.id).status is JobStatus.CANCELLED


def test_cancel_many_of_parents_cancels_their_children(kit: AppKit) -> None:
    parents = [kit.defer.schedule("step", {"n": n}, delay=60, key=f"p:{n}") for n in range(3)]
    child = kit.defer.schedule("collect", after=parents)
    kit.db.session.commit()
    assert kit.defer.cancel_many(key_prefix="p:")["cancelled"] == 3
    kit.db.session.commit()
    assert stored(kit, child.id).status is JobStatus.CANCELLED


def test_an_expired_parent_cancels_its_done_child(kit: AppKit) -> None:
    now = utcnow()
    parent = kit.defer.schedule("step", {"n": 1}, run_at=now + timedelta(seconds=1), ttl=1)
    child = kit.defer.schedule("collect", after=parent)
    kit.db.session.commit()
    assert kit.defer.store.expire_due(now=now + timedelta(seconds=5)) == 1
    assert stored(kit, parent.id).status is JobStatus.EXPIRED
    assert f"parent job {parent.id} expired" in (stored(kit, child.id).last_error or "")


def test_replacing_a_parent_settles_it_for_its_children(kit: AppKit) -> None:
    parent = kit.defer.schedule("step", {"n": 1}, delay=60, key="report")
    child = kit.defer.schedule("collect", after=parent, after_policy="settled")
    kit.defer.schedule("step", {"n": 2}, delay=60, key="report", replace=True)
    kit.db.session.commit()
    assert stored(kit, child.id).waiting_for is None


# -- the arguments -------------------------------------------------------------------------


def test_an_unknown_parent_raises_job_not_found_and_writes_nothing(kit: AppKit) -> None:
    parent = kit.defer.schedule("step", {"n": 1})
    kit.db.session.commit()
    with pytest.raises(JobNotFound) as raised:
        kit.defer.schedule("collect", after=[parent, 987654])
    assert "987654" in str(raised.value)
    # The caller commits anyway: the child must not be in that commit, waiting for
    # nothing and run at once.
    kit.db.session.commit()
    assert [job.name for job in kit.defer.list()] == ["step"]
    kit.defer.run_due()
    assert ran(kit) == [("step", {"n": 1})]


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"after": "12"}, "after"),
        ({"after": [1, "2"]}, "after"),
        ({"after": True}, "after"),
        ({"after": 0}, "after"),
        ({"after": [-3]}, "after"),
        ({"after": {"id": 1}}, "after"),
        ({"after": list(range(1, 1002))}, "after"),
        ({"after": 1, "after_policy": "always"}, "after_policy"),
        ({"after": 1, "after_policy": 1}, "after_policy"),
    ],
)
def test_bad_after_arguments_name_the_argument(
    kit: AppKit, options: dict[str, Any], named: str
) -> None:
    with pytest.raises(InvalidArgument) as raised:
        kit.defer.schedule("collect", **options)
    assert raised.value.argument == named


def test_an_empty_after_list_waits_for_nothing(kit: AppKit) -> None:
    job = kit.defer.schedule("step", {"n": 1}, after=[])
    assert job.waiting_for is None


def test_schedule_many_refuses_after_and_points_to_group(kit: AppKit) -> None:
    with pytest.raises(InvalidArgument, match="group") as raised:
        kit.defer.schedule_many("step", [{}], after=[1])
    assert raised.value.argument == "after"


# -- groups ----------------------------------------------------------------------------------


def test_a_group_runs_its_members_then_its_callback_once_with_their_results(
    kit: AppKit,
) -> None:
    group = kit.defer.group("step", [{"n": n} for n in range(4)], then="collect")
    kit.db.session.commit()
    assert isinstance(group, Group) and group.id == group.then_job.id
    assert [job.payload for job in group.jobs] == [{"n": n} for n in range(4)]
    assert group.then_job.waiting_for == 4
    assert kit.defer.parents(group.then_job) == [stored(kit, j.id) for j in group.jobs]

    kit.defer.run_due()
    kit.defer.run_due()
    assert [name for name, _ in ran(kit)].count("collect") == 1
    assert stored(kit, group.id).result == [{"n": n} for n in range(4)]
    assert kit.defer.children(group.jobs[0]) == [stored(kit, group.id)]


def test_a_group_on_done_is_cancelled_by_a_failed_member_and_on_settled_is_not(
    kit: AppKit,
) -> None:
    payloads = [{"n": 1}, {"n": 2, "fail": True}]
    strict = kit.defer.group("step", payloads, then="collect")
    tolerant = kit.defer.group("step", payloads, then="collect", on="settled", queue="q2")
    kit.db.session.commit()
    kit.defer.run_due()
    kit.defer.run_due()
    failed_member = strict.jobs[1].id
    assert f"parent job {failed_member} failed" in (stored(kit, strict.id).last_error or "")
    assert stored(kit, tolerant.id).status is JobStatus.DONE
    assert {job.queue for job in (*tolerant.jobs, tolerant.then_job)} == {"q2"}


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"payloads": []}, "payloads"),
        ({"payloads": "abc"}, "payloads"),
        ({"payloads": [{}] * 1001}, "payloads"),
        ({"on": "maybe"}, "on"),
        ({"then": 7}, "then"),
        # Found after the members before it would have been written:
        ({"payloads": [{"n": 1}, {"at": datetime.now(UTC)}]}, "payloads[1]"),
        ({"payloads": [{"n": 1}, {"n": "x" * 1_000_001}]}, "payloads[1]"),
        ({"then_payload": {"at": datetime.now(UTC)}}, "then_payload"),
    ],
)
def test_bad_group_arguments_name_the_argument_and_write_nothing(
    kit: AppKit, arguments: dict[str, Any], named: str
) -> None:
    call: dict[str, Any] = {"payloads": [{}], "then": "collect", **arguments}
    with pytest.raises(InvalidArgument) as raised:
        kit.defer.group("step", call.pop("payloads"), **call)
    assert raised.value.argument == named
    kit.db.session.commit()  # a caller that carries on: no member may be in it
    assert kit.defer.list() == []


def test_a_group_with_an_unknown_callback_writes_nothing(kit: AppKit) -> None:
    with pytest.raises(UnknownJob):
        kit.defer.group("step", [{}, {}], then="nope")
    assert kit.defer.list() == []


# -- real workers ------------------------------------------------------------------------


def test_a_worker_releases_a_groups_callback_in_its_acknowledgement(kit: AppKit) -> None:
    group = kit.defer.group("step", [{"n": n} for n in range(30)], then="collect")
    kit.db.session.commit()
    with worker_thread(kit.defer.worker(concurrency=4)):
        wait_until(lambda: stored(kit, group.id).status is JobStatus.DONE, timeout=30)
    assert [name for name, _ in ran(kit)].count("collect") == 1
    assert len(stored(kit, group.id).result) == 30


def test_a_child_scheduled_while_its_parent_runs_is_released_when_it_ends(
    kit: AppKit,
) -> None:
    started, finish = threading.Event(), threading.Event()

    @kit.defer.job("hold", max_attempts=1)
    def hold(job: Job) -> str:
        started.set()
        assert finish.wait(20)
        return "held"

    parent = kit.defer.schedule("hold")
    kit.db.session.commit()
    with worker_thread(kit.defer.worker()):
        assert started.wait(20)
        child = kit.defer.schedule("collect", after=parent)
        kit.db.session.commit()
        assert child.waiting_for == 1
        finish.set()
        wait_until(lambda: stored(kit, child.id).status is JobStatus.DONE, timeout=20)
    assert stored(kit, child.id).result == ["held"]


def test_the_maintenance_round_releases_children_left_behind_a_settled_parent(
    kit: AppKit,
) -> None:
    # A process that died between a PostgreSQL acknowledgement and its release leaves
    # the edge open behind a settled parent: made here by settling the row directly.
    parent = kit.defer.schedule("step", {"n": 1}, delay=60)
    child = kit.defer.schedule("collect", after=parent)
    kit.db.session.commit()
    store = kit.defer.store
    t = store.table
    with store.begin() as conn:
        conn.execute(t.update().where(t.c.id == parent.id).values(status="done"))
    assert stored(kit, child.id).waiting_for == 1
    assert store.release_stranded(now=datetime.now(UTC)) == 1
    assert stored(kit, child.id).waiting_for is None
    assert store.release_stranded(now=datetime.now(UTC)) == 0


@pytest.mark.parametrize("then", ["run_due", "prune"])
def test_a_cron_only_app_releases_children_left_behind_a_settled_parent(
    kit: AppKit, then: str
) -> None:
    """No worker, so no maintenance round: ``run_due`` releases them, and ``prune``
    does before it deletes the parent (after it the release could not read it)."""
    parent = kit.defer.schedule("step", {"n": 1}, delay=60)
    child = kit.defer.schedule("collect", after=parent)
    kit.db.session.commit()
    store = kit.defer.store
    t = store.table
    long_ago = utcnow() - timedelta(days=400)
    with store.begin() as conn:  # what a process killed between the two leaves
        conn.execute(
            t.update().where(t.c.id == parent.id).values(status="done", finished_at=long_ago)
        )
    if then == "prune":
        assert kit.defer.prune() == 1  # the parent, past its retention
        assert kit.defer.get(parent.id) is None
    summary = kit.defer.run_due()
    assert summary.done == 1
    assert stored(kit, child.id).status is JobStatus.DONE


def test_a_group_in_an_app_without_a_session_commits_whole_or_not_at_all(
    database_url: str, backend: str
) -> None:
    """Without ``db=`` each call had a transaction of its own, so the members were
    committed one by one, before a refused ``then`` job (here: an app's trigger)."""
    app = Flask("group_without_a_session")
    app.config["DEFER_DATABASE_URI"] = database_url
    defer = Defer(app)
    defer.job("step")(lambda job: None)
    defer.job("collect")(lambda job: None)
    with app.app_context():
        store = defer.store
        table = store.table.name
        if backend == "sqlite":
            refuse = [
                f"CREATE TRIGGER refuse_collect BEFORE INSERT ON {table}"
                " WHEN NEW.name = 'collect' BEGIN SELECT RAISE(ABORT, 'refused'); END"
            ]
        else:
            refuse = [
                "CREATE FUNCTION refuse_collect() RETURNS trigger LANGUAGE plpgsql AS $$"
                " BEGIN IF NEW.name = 'collect' THEN RAISE EXCEPTION 'refused'; END IF;"
                " RETURN NEW; END $$",
                f"CREATE TRIGGER refuse_collect BEFORE INSERT ON {table}"
                " FOR EACH ROW EXECUTE FUNCTION refuse_collect()",
            ]
        try:
            defer.list(limit=1)  # the tables exist before the trigger goes on them
            with store.begin() as conn:
                for statement in refuse:
                    conn.execute(text(statement))
            with pytest.raises(DBAPIError, match="refused"):
                defer.group("step", [{"n": 1}, {"n": 2}], then="collect")
            assert defer.list(limit=10) == []
            on_table = "" if backend == "sqlite" else f" ON {table}"
            with store.begin() as conn:
                conn.execute(text(f"DROP TRIGGER refuse_collect{on_table}"))
            group = defer.group("step", [{"n": 1}, {"n": 2}], then="collect")
            assert len(defer.list(limit=10)) == 3 and group.then_job.waiting_for == 2
        finally:
            store.engine.dispose()


def test_two_releases_crossing_over_the_same_children_never_deadlock(
    kit: AppKit, backend: str
) -> None:
    """C1 waits for P1-P3, C2 for P1, P3 and P4. One release settles P1 and P2 (C1 two
    edges, C2 one), the other P3 and P4 (C1 one, C2 two): lowering by count, each
    locked the other's first child first, and PostgreSQL aborted one of them."""
    store = kit.defer.store
    t = store.table
    errors: list[BaseException] = []
    for _ in range(30):
        p1, p2, p3, p4 = (kit.defer.schedule("step", {"n": n}, delay=60) for n in range(4))
        c1 = kit.defer.schedule("collect", after=[p1, p2, p3])
        c2 = kit.defer.schedule("collect", after=[p1, p3, p4])
        kit.db.session.commit()
        with store.begin() as conn:
            conn.execute(
                t.update().where(t.c.id.in_([p1.id, p2.id, p3.id, p4.id])).values(status="done")
            )
        both = threading.Barrier(2)

        def release(parents: list[int], both: threading.Barrier = both) -> None:
            try:
                if backend == "sqlite":  # one writer at a time: they meet at the lock
                    both.wait(5)
                with store.begin_immediate() as conn:
                    if backend == "postgresql":  # both inside, before their writes
                        both.wait(5)
                    store.release_children(conn, parents, now=utcnow())
            except Exception as error:
                errors.append(error)

        threads = [
            threading.Thread(target=release, args=([p1.id, p2.id],)),
            threading.Thread(target=release, args=([p3.id, p4.id],)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert errors == []
        assert stored(kit, c1.id).waiting_for is None
        assert stored(kit, c2.id).waiting_for is None


def test_pruning_a_parent_and_child_deletes_their_edges(kit: AppKit) -> None:
    parent = kit.defer.schedule("step", {"n": 1})
    child = kit.defer.schedule("collect", after=parent)
    kit.db.session.commit()
    kit.defer.run_due()
    kit.defer.run_due()
    store = kit.defer.store
    later = utcnow() + timedelta(days=400)
    assert store.prune(settled_before=later, failed_before=later) == 2
    edges = store.dependencies_table
    with store.begin() as conn:
        assert conn.execute(select(func.count()).select_from(edges)).scalar_one() == 0
    assert kit.defer.parents(child.id) == []
