"""``defer.pause`` / ``resume`` / ``paused`` / ``queues`` (facade/pause_methods.py), from Python,
on SQLite and PostgreSQL: argument checks, signals after the commit, the Queues overview."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flask_defer import InvalidArgument, Job, NotConfigured, Pause, queue_paused, queue_resumed

from ..conftest import AppKit


@pytest.fixture
def handlers(kit: AppKit) -> AppKit:
    kit.defer.job("send_email", queue="emails")(lambda job: None)
    kit.defer.job("send_digest", queue="emails")(lambda job: None)
    kit.defer.job("report")(lambda job: None)
    return kit


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "queue: give exactly one of queue= or name=, got neither"),
        ({"queue": "emails", "name": "send_email"}, "queue: give exactly one of queue= or name="),
        ({"queue": ""}, "queue: must not be empty"),
        ({"queue": 7}, "queue: expected a string, got int 7"),
        ({"queue": "q" * 101}, "queue: at most 100 characters, got 101"),
        ({"name": "n" * 201}, "name: at most 200 characters, got 201"),
        ({"name": "a\x00b"}, "name: contains a NUL character"),
    ],
)
def test_pause_and_resume_name_the_argument_they_refuse(
    handlers: AppKit, kwargs: dict[str, Any], message: str
) -> None:
    for method in (handlers.defer.pause, handlers.defer.resume):
        with pytest.raises(InvalidArgument) as refused:
            method(**kwargs)
        assert str(refused.value).startswith(message)
    assert handlers.defer.paused() == []


def test_a_name_need_not_be_registered_to_be_paused(handlers: AppKit) -> None:
    # A rolling deploy: the handler is in the workers' release, not yet in this one.
    assert handlers.defer.pause(name="not_deployed_yet", actor="ops")
    (pause,) = handlers.defer.paused()
    assert (pause.kind, pause.value, pause.actor) == ("name", "not_deployed_yet", "ops")
    assert handlers.defer.resume(name="not_deployed_yet")


def test_signals_are_sent_once_by_the_call_that_changed_it(handlers: AppKit) -> None:
    heard: list[tuple[str, str, str, str]] = []

    def on_paused(sender: Any, **kw: Any) -> None:
        assert sender is handlers.app
        heard.append(("paused", kw["kind"], kw["value"], kw["actor"]))

    def on_resumed(sender: Any, **kw: Any) -> None:
        heard.append(("resumed", kw["kind"], kw["value"], kw["actor"]))

    with queue_paused.connected_to(on_paused), queue_resumed.connected_to(on_resumed):
        assert handlers.defer.pause(queue="emails", actor="alice")
        assert not handlers.defer.pause(queue="emails", actor="bob")
        assert handlers.defer.resume(queue="emails", actor="carol")
        assert not handlers.defer.resume(queue="emails")
        handlers.defer.pause(name="report")
    assert heard == [
        ("paused", "queue", "emails", "alice"),
        ("resumed", "queue", "emails", "carol"),
        ("paused", "name", "report", "app"),
    ]


def test_pause_refuses_while_db_session_holds_uncommitted_jobs(handlers: AppKit) -> None:
    handlers.defer.schedule("report")
    with pytest.raises(NotConfigured, match=r"pause\(\) runs in its own transaction"):
        handlers.defer.pause(queue="emails")
    handlers.db.session.commit()
    assert handlers.defer.pause(queue="emails")


def test_paused_lists_queues_first_with_when_and_who(handlers: AppKit) -> None:
    before = datetime.now(UTC)
    handlers.defer.pause(name="report", actor="cli")
    handlers.defer.pause(queue="emails", actor="alice")
    paused = handlers.defer.paused()
    assert [(p.kind, p.value, p.actor) for p in paused] == [
        ("queue", "emails", "alice"),
        ("name", "report", "cli"),
    ]
    assert all(isinstance(p, Pause) and before <= p.paused_at <= datetime.now(UTC) for p in paused)


def test_queues_lists_registered_and_live_queues_and_names_with_counts(handlers: AppKit) -> None:
    defer = handlers.defer
    for _ in range(2):
        defer.schedule("send_email")
    defer.schedule("send_digest", delay=timedelta(hours=1))
    defer.schedule("report")
    handlers.db.session.commit()
    now = datetime.now(UTC) + timedelta(seconds=1)
    (claimed,) = defer.store.claim(
        now=now, limit=1, token=uuid.uuid4().hex, lease_until=now + timedelta(minutes=1),
        queues=["default"],
    )
    assert claimed.name == "report"
    defer.pause(queue="emails")
    defer.pause(name="gone")  # no handler and no jobs: listed because it is paused

    rows = {(row.kind, row.value): row for row in defer.queues(now=now)}
    emails = rows[("queue", "emails")]
    assert (emails.pending, emails.due, emails.running, emails.paused) == (3, 2, 0, True)
    assert emails.pause is not None and emails.pause.actor == "app"
    default = rows[("queue", "default")]
    assert (default.pending, default.due, default.running, default.paused) == (0, 0, 1, False)
    send_email = rows[("name", "send_email")]
    assert (send_email.pending, send_email.due, send_email.queue) == (2, 2, "emails")
    digest = rows[("name", "send_digest")]
    assert (digest.pending, digest.due, digest.running) == (1, 0, 0)
    assert rows[("name", "report")].running == 1
    gone = rows[("name", "gone")]
    assert gone.paused and gone.queue is None and gone.pending == 0
    kinds = [row.kind for row in defer.queues(now=now)]
    assert kinds == sorted(kinds, key=lambda kind: kind != "queue")  # queues first


def test_jobs_of_a_paused_name_can_still_be_cancelled_and_rescheduled(handlers: AppKit) -> None:
    defer = handlers.defer
    first, second = defer.schedule("report"), defer.schedule("report")
    handlers.db.session.commit()
    defer.pause(name="report")
    assert defer.cancel(first.id)
    later = datetime.now(UTC) + timedelta(hours=2)
    assert defer.reschedule(second.id, run_at=later).run_at == later
    assert defer.run_due(now=later).ran == 0
    defer.resume(name="report")
    assert defer.run_due(now=later).ran == 1


def test_resumed_jobs_run_oldest_run_at_first(handlers: AppKit) -> None:
    order: list[int] = []

    @handlers.defer.job("ordered")
    def ordered(job: Job) -> None:
        order.append(job.payload["n"])

    handlers.defer.pause(name="ordered")
    start = datetime.now(UTC)
    for n in (3, 1, 2):
        handlers.defer.schedule("ordered", {"n": n}, run_at=start + timedelta(seconds=n))
    handlers.db.session.commit()
    handlers.defer.resume(name="ordered")
    handlers.defer.run_due(now=start + timedelta(seconds=5))
    assert order == [1, 2, 3]
