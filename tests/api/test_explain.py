"""``defer.explain(id)`` on both backends: every reason a pending job has not started,
in at most five queries; ``flask defer explain`` and the job page."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event

from flask_defer import JobNotFound, Reason
from flask_defer.engine.presence import Presence
from flask_defer.timeutil import utcnow

from ..conftest import AppKit
from ..engine.test_worker import MakeKit, make_kit

__all__ = ["make_kit"]


@pytest.fixture
def kit(make_kit: MakeKit) -> AppKit:
    kit = make_kit()
    kit.defer.job("send", queue="mail")(lambda job: None)
    kit.defer.job("sync", concurrency_limit=1)(lambda job: None)
    kit.defer.job("sms", rate_limit="1/h")(lambda job: None)
    return kit


def codes(reasons: list[Reason]) -> list[str]:
    return [reason.code for reason in reasons]


def serve_all(kit: AppKit, names: tuple[str, ...] = ("send", "sync", "sms")) -> Presence:
    """A live worker row serving every queue and knowing *names*."""
    presence = Presence(kit.defer.store, kind="worker", queues=None, concurrency=1,
                        heartbeat_seconds=30, names=names)  # fmt: skip
    presence.arrive(utcnow())
    return presence


@contextmanager
def counted(kit: AppKit) -> Iterator[list[str]]:
    """The statements sent to the database inside the block."""
    sent: list[str] = []
    engine = kit.defer.store.engine

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not statement.lstrip().upper().startswith(("SAVEPOINT", "RELEASE", "ROLLBACK")):
            sent.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", count)


def test_a_job_held_by_everything_at_once_says_so_in_at_most_five_queries(
    kit: AppKit,
) -> None:
    parent = kit.defer.schedule("send", delay=60)
    job = kit.defer.schedule("send", after=parent, delay=30, ttl=3600)
    kit.db.session.commit()
    kit.defer.pause(queue="mail", actor="alice")
    kit.defer.pause(name="send", actor="bob")
    with counted(kit) as sent:
        reasons = kit.defer.explain(job.id)
    assert codes(reasons) == [
        "not_due", "waiting_for_parents", "queue_paused", "name_paused", "no_worker",
    ]  # fmt: skip
    assert len(sent) <= 5, sent
    by = {reason.code: reason for reason in reasons}
    assert by["not_due"].until == job.run_at and "Not due yet" in by["not_due"].text
    assert by["waiting_for_parents"].job_ids == (parent.id,)
    assert f"#{parent.id}" in by["waiting_for_parents"].text
    assert by["queue_paused"].actor == "alice" and by["name_paused"].actor == "bob"
    assert by["queue_paused"].since is not None
    assert "mail" in by["no_worker"].text


def test_a_worker_without_the_handler_is_unknown_handler_and_with_it_nothing(
    kit: AppKit,
) -> None:
    job = kit.defer.schedule("send")
    kit.db.session.commit()
    stranger = serve_all(kit, names=("other",))
    assert codes(kit.defer.explain(job.id)) == ["unknown_handler"]
    stranger.leave()
    serve_all(kit)
    assert kit.defer.explain(job.id) == []  # due, served, free: a worker starts it now


def test_a_key_at_its_limit_names_its_holders(kit: AppKit) -> None:
    serve_all(kit)
    first = kit.defer.schedule("sync", concurrency_key="acct:1")
    second = kit.defer.schedule("sync", concurrency_key="acct:1")
    kit.db.session.commit()
    now = utcnow()
    store = kit.defer.store
    store.claim(now=now, limit=1, token="t", lease_until=now + timedelta(minutes=1))
    (reason,) = kit.defer.explain(second.id)
    assert reason.code == "key_at_limit" and reason.job_ids == (first.id,)
    assert "acct:1" in reason.text


def test_a_used_up_rate_limit_says_until_when(kit: AppKit) -> None:
    serve_all(kit)
    kit.defer.schedule("sms")
    waiting = kit.defer.schedule("sms")
    kit.db.session.commit()
    kit.defer.run_due()
    (reason,) = kit.defer.explain(waiting.id)
    assert reason.code == "rate_limited" and reason.until is not None
    assert utcnow() + timedelta(minutes=59) < reason.until <= utcnow() + timedelta(hours=1)


def test_an_expired_job_not_swept_yet_says_so(kit: AppKit) -> None:
    serve_all(kit)
    job = kit.defer.schedule("send", ttl=1)
    kit.db.session.commit()
    later = utcnow() + timedelta(seconds=5)
    from flask_defer.operations import visibility
    from flask_defer.operations.state import current_state

    reasons = visibility.explain(current_state(), job.id, now=later)
    assert codes(reasons) == ["expired"] and reasons[0].until == job.expires_at


def test_settled_and_unknown_jobs(kit: AppKit) -> None:
    job = kit.defer.schedule("send")
    kit.db.session.commit()
    kit.defer.cancel(job.id)
    assert kit.defer.explain(job.id) == []
    with pytest.raises(JobNotFound):
        kit.defer.explain(987654)


def test_flask_defer_explain_and_the_job_page(kit: AppKit) -> None:
    job = kit.defer.schedule("send", delay=60)
    kit.db.session.commit()
    cli = kit.app.test_cli_runner()
    out = cli.invoke(args=["defer", "explain", str(job.id)]).output
    assert "not_due: Not due yet" in out and "no_worker:" in out
    rows = json.loads(cli.invoke(args=["defer", "explain", str(job.id), "--json"]).output)
    assert [row["code"] for row in rows] == ["not_due", "no_worker"]
    assert rows[0]["until"] == job.run_at.isoformat()
    missing = cli.invoke(args=["defer", "explain", "999999"])
    assert missing.exit_code == 1
    kit.defer.dashboard_auth(lambda: True)
    page = kit.app.test_client().get(f"/defer/jobs/{job.id}").get_data(as_text=True)
    assert "Why it has not started" in page
    assert 'data-defer-reason="not_due"' in page and 'data-defer-reason="no_worker"' in page
