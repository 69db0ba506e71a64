"""The demo app over HTTP (Flask's test client), on SQLite and PostgreSQL.

Forms carry real CSRF tokens, people sign in as Alice or Bob, and time is driven with
``defer.run_due(now=...)``: what the worker would do at that moment, in this thread.
The browser tests (``test_browser_demo.py``) cover the same flows in Chromium.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any
from urllib.parse import urlencode
from urllib.request import HTTPCookieProcessor, build_opener
from zoneinfo import ZoneInfo

import pytest
from flask import Flask
from sqlalchemy import func, select

from demo_app import database_url_from_env
from demo_app.jobs import comments_key, message_key, publish_key
from demo_app.models import (
    Comment,
    Message,
    Notification,
    OutboxEntry,
    Post,
    Project,
    Task,
    WebhookCall,
    db,
)
from demo_app.when import parse_local
from flask_defer import INCLUDE_DELETED, InvalidArgument, JobStatus

from ..demo_helpers import ROOT, Person, app_context, csrf_from, dispose, job_for, make_demo


@pytest.fixture
def demo(database_url: str, tmp_path: Path) -> Iterator[Callable[..., Flask]]:
    """Factory: the demo app on the backend under test (config overrides as kwargs)."""
    made: list[Flask] = []

    def make(**config: Any) -> Flask:
        app = make_demo(database_url, tmp_path / f"instance{len(made)}", **config)
        made.append(app)
        return app

    yield make
    for app in made:
        dispose(app)


@pytest.fixture
def app(demo: Callable[..., Flask]) -> Flask:
    return demo()


@pytest.fixture
def person(app: Flask) -> Callable[[str], Person]:
    """Factory: a visitor with cookies of their own, signed in as *user*."""

    def make(user: str) -> Person:
        return Person(app, app.test_client()).sign_in(user)

    return make


def utcnow() -> datetime:
    return datetime.now(UTC)


def one(app: Flask, model: Any, **where: Any) -> Any:
    with app.app_context():
        row = db.session.scalars(
            select(model)
            .filter_by(**where)
            .execution_options(**{INCLUDE_DELETED: True})
            .order_by(model.id.desc())
        ).first()
        if row is not None:
            db.session.expunge(row)
        return row


def count(app: Flask, model: Any, **where: Any) -> int:
    with app.app_context():
        stmt = select(func.count()).select_from(model).filter_by(**where)
        return int(db.session.scalar(stmt.execution_options(**{INCLUDE_DELETED: True})) or 0)


# -- signing in, CSRF, every page -------------------------------------------------------


def test_pages_send_visitors_to_sign_in_first(app: Flask) -> None:
    response = app.test_client().get("/mail/")
    assert response.status_code == 302
    assert response.location == "/sign-in?next=/mail/"


def test_sign_in_needs_a_csrf_token(app: Flask) -> None:
    client = app.test_client()
    refused = client.post("/sign-in", data={"user": "alice"})
    assert refused.status_code == 400
    assert "Form expired" in refused.get_data(as_text=True)
    assert client.get("/mail/").status_code == 302


def test_sign_in_as_alice_then_switch_to_bob(app: Flask) -> None:
    visitor = Person(app, app.test_client())
    response = visitor.post("/sign-in", {"user": "alice", "next": "/projects/"})
    assert response.status_code == 303 and response.location == "/projects/"
    page = visitor.get("/projects/").get_data(as_text=True)
    assert 'id="signed-in-as">Alice<' in page
    assert "Website relaunch" in page and "Garden shed" not in page

    assert visitor.post("/sign-out").status_code == 303
    assert visitor.get("/mail/").status_code == 302
    # A "next" pointing elsewhere is ignored.
    response = visitor.post("/sign-in", {"user": "bob", "next": "//evil.example/"})
    assert response.location == "/mail/"
    page = visitor.get("/projects/").get_data(as_text=True)
    assert 'id="signed-in-as">Bob<' in page and "Garden shed" in page


def test_sign_in_as_nobody_is_refused(app: Flask) -> None:
    assert Person(app, app.test_client()).post("/sign-in", {"user": "mallory"}).status_code == 400


def test_every_page_has_the_toast_region(app: Flask, person: Callable[[str], Person]) -> None:
    assert 'id="defer-toasts"' in app.test_client().get("/sign-in").get_data(as_text=True)
    alice = person("alice")
    for path in ["/mail/", "/projects/", "/posts/", "/posts/1", "/notifications/", "/posts/999"]:
        page = alice.get(path).get_data(as_text=True)
        assert 'id="defer-toasts"' in page, path
        assert "defer/defer.js" in page, path


def test_forms_without_a_csrf_token_are_refused(
    app: Flask, person: Callable[[str], Person]
) -> None:
    alice = person("alice")
    response = alice.client.post("/mail/send", data={"to": "a@example.org", "subject": "Hi"})
    assert response.status_code == 400
    assert count(app, Message) == 0


# -- mail ---------------------------------------------------------------------------------


def send(alice: Person, subject: str = "Quarterly report") -> Message:
    response = alice.post("/mail/send", {"to": "ada@example.org", "subject": subject, "body": "…"})
    assert response.status_code == 303 and response.location == "/mail/"
    message = one(alice.app, Message, subject=subject)
    assert message is not None
    return message


def test_send_waits_for_the_undo_window_then_the_handler_sends(
    app: Flask, person: Callable[[str], Person], caplog: pytest.LogCaptureFixture
) -> None:
    alice = person("alice")
    before = utcnow()
    message = send(alice)
    assert message.status == "sending" and message.owner == "alice"
    job = job_for(app, message_key(message.id))
    assert job.status is JobStatus.PENDING and job.owner == "alice"
    # The toast shows the label while nothing has happened yet: no "sent" before it is.
    assert job.label == "Sending “Quarterly report”"
    assert (job.done_label, job.failed_label) == ("Sent", "Couldn't send")
    assert job.undo_until is not None
    assert before + timedelta(seconds=5) <= job.undo_until <= utcnow() + timedelta(seconds=5)
    assert job.run_at == job.undo_until + timedelta(seconds=1)  # the margin
    page = alice.get("/mail/").get_data(as_text=True)
    assert "Sending…" in page and 'data-defer-toast="' in page
    # The outbox refreshes when the toast says the job settled, never by polling.
    assert 'hx-trigger="defer:settled from:body"' in page and "every 1s" not in page

    with app_context(app) as defer:
        assert defer.run_due().ran == 0
        with caplog.at_level(logging.INFO, logger="demo_app"):
            assert defer.run_due(now=job.run_at).done == 1
    sent = one(app, Message, id=message.id)
    assert sent.status == "sent" and sent.sent_at is not None
    entry = one(app, OutboxEntry, message_id=message.id)
    assert entry.recipient == "ada@example.org" and entry.subject == "Quarterly report"
    assert f"delivered message {message.id} to ada@example.org" in caplog.text
    outbox = alice.get("/mail/outbox").get_data(as_text=True)
    assert ">Sent<" in outbox and f"outbox #{entry.id}" in outbox
    assert "every 1s" not in outbox


def test_undo_keeps_the_message_as_a_draft_and_it_can_be_sent_again(
    app: Flask, person: Callable[[str], Person]
) -> None:
    alice = person("alice")
    message = send(alice)
    job = job_for(app, message_key(message.id))
    response = alice.post(f"/defer/undo/{job.id}", {"next": "/mail/"})
    assert response.status_code == 303 and response.location == "/mail/"
    assert one(app, Message, id=message.id).status == "draft"
    assert job_for(app, message_key(message.id)).status is JobStatus.CANCELLED
    with app_context(app) as defer:
        assert defer.run_due(now=job.run_at + timedelta(minutes=1)).ran == 0
    assert count(app, OutboxEntry) == 0
    assert "Sending undone." in alice.get("/mail/").get_data(as_text=True)

    # The key is free again once the first job settled.
    assert alice.post(f"/mail/{message.id}/send").status_code == 303
    again = job_for(app, message_key(message.id))
    assert again.id != job.id and again.status is JobStatus.PENDING
    assert one(app, Message, id=message.id).status == "sending"


def test_the_dashboard_never_says_sent_beside_an_undone_message(
    app: Flask, person: Callable[[str], Person]
) -> None:
    alice = person("alice")
    message = send(alice)
    job = job_for(app, message_key(message.id))
    assert alice.post(f"/defer/undo/{job.id}", {"next": "/mail/"}).status_code == 303
    html = alice.get("/defer/?status=cancelled").get_data(as_text=True)
    row = re.search(rf'<tr id="defer-row-{job.id}".*?</tr>', html, re.S)
    assert row, html
    words = re.sub(r"<[^>]+>", " ", row.group(0))
    assert "cancelled" in words and "Quarterly report" in words
    assert "sent" not in words.lower(), words


def test_an_undone_message_can_be_edited_then_sent(
    app: Flask, person: Callable[[str], Person]
) -> None:
    alice = person("alice")
    message = send(alice)
    job = job_for(app, message_key(message.id))
    alice.post(f"/defer/undo/{job.id}", {"next": "/mail/"})
    outbox = alice.get("/mail/").get_data(as_text=True)
    assert f'href="/mail/?edit={message.id}#compose" id="edit-{message.id}">Edit</a>' in outbox
    form = alice.get(f"/mail/?edit={message.id}").get_data(as_text=True)
    assert "Edit draft" in form
    assert f'<input type="hidden" name="message_id" value="{message.id}">' in form
    assert 'value="Quarterly report"' in form
    response = alice.post(
        "/mail/send",
        {"message_id": str(message.id), "to": "bob@example.org", "subject": "Report, v2"},
    )
    assert response.status_code == 303
    edited = one(app, Message, id=message.id)
    assert (edited.recipient, edited.subject, edited.status) == (
        "bob@example.org",
        "Report, v2",
        "sending",
    )
    assert count(app, Message) == 1  # the draft itself was sent, not a copy
    assert job_for(app, message_key(message.id)).status is JobStatus.PENDING
    # A message on its way is no draft: it cannot be edited any more.
    page = alice.get(f"/mail/?edit={message.id}").get_data(as_text=True)
    assert "not a draft any more" in page and "Edit draft" not in page
    assert person("bob").get(f"/mail/?edit={message.id}").status_code == 404


def test_the_mail_undo_window_comes_from_the_config(
    demo: Callable[..., Flask],
) -> None:
    app = demo(DEMO_MAIL_UNDO_WINDOW=2)
    message = send(Person(app, app.test_client()).sign_in("alice"))
    job = job_for(app, message_key(message.id))
    assert job.undo_until is not None and job.created_at is not None
    assert job.undo_until - job.created_at < timedelta(seconds=2.5)


def test_bob_cannot_undo_or_see_alices_message(app: Flask, person: Callable[[str], Person]) -> None:
    alice, bob = person("alice"), person("bob")
    message = send(alice, "Secret plans")
    job = job_for(app, message_key(message.id))
    assert bob.post(f"/defer/undo/{job.id}").status_code == 404
    page = bob.get("/mail/").get_data(as_text=True)
    assert "Secret plans" not in page and 'data-defer-toast="' not in page
    assert bob.post(f"/mail/{message.id}/send").status_code == 404
    assert job_for(app, message_key(message.id)).status is JobStatus.PENDING


def test_a_message_needs_a_recipient_and_a_subject(
    app: Flask, person: Callable[[str], Person]
) -> None:
    response = person("alice").post("/mail/send", {"to": "", "subject": "Hi"})
    assert response.status_code == 422
    assert "needs a recipient and a subject" in response.get_data(as_text=True)
    assert count(app, Message) == 0


# -- projects -------------------------------------------------------------------------------


def project_named(app: Flask, name: str) -> Project:
    project = one(app, Project, name=name)
    assert project is not None
    return project


def test_a_deleted_project_is_hidden_at_once_and_purged_after_the_grace(
    app: Flask, person: Callable[[str], Person]
) -> None:
    alice = person("alice")
    project = project_named(app, "Website relaunch")
    assert alice.post(f"/projects/{project.id}/delete").status_code == 303
    page = alice.get("/projects/").get_data(as_text=True)
    assert f'id="project-{project.id}"' not in page
    assert f'id="deleted-project-{project.id}"' in page  # in the bin, with a countdown
    assert "Project “Website relaunch” deleted" in page  # the toast
    with app_context(app) as defer:
        [purge] = defer.list(owner="alice", status="pending")
        assert purge.undo_until is not None
        assert purge.run_at - purge.undo_until == timedelta(seconds=1)
        assert defer.run_due(now=utcnow() + timedelta(seconds=25)).ran == 0
        assert defer.run_due(now=utcnow() + timedelta(seconds=31)).done == 1
    assert count(app, Project, id=project.id) == 0
    assert count(app, Task, project_id=project.id) == 0  # the cascade ran
    page = alice.get("/projects/").get_data(as_text=True)
    assert "Website relaunch" not in page


def test_the_bins_countdown_ends_when_the_toasts_undo_does(
    app: Flask, person: Callable[[str], Person]
) -> None:
    from demo_app.when import iso

    alice = person("alice")
    project = project_named(app, "Website relaunch")
    alice.post(f"/projects/{project.id}/delete")
    page = alice.get("/projects/").get_data(as_text=True)
    with app_context(app) as defer:
        [purge] = defer.list(owner="alice", status="pending")
    assert purge.undo_until is not None
    # Toast "Undo 29" and bin "gone for good in 29 s": one moment, the end of Undo.
    binned = page.split(f'id="deleted-project-{project.id}"', 1)[1]
    assert f'data-countdown="{iso(purge.undo_until)}"' in binned.split("</li>", 1)[0]


def test_undo_of_a_delete_brings_the_project_back(
    app: Flask, person: Callable[[str], Person]
) -> None:
    alice = person("alice")
    project = project_named(app, "Team offsite")
    alice.post(f"/projects/{project.id}/delete")
    with app_context(app) as defer:
        [purge] = defer.list(owner="alice", status="pending")
    assert alice.post(f"/defer/undo/{purge.id}", {"next": "/projects/"}).status_code == 303
    assert project_named(app, "Team offsite").deleted_at is None
    with app_context(app) as defer:
        assert defer.run_due(now=utcnow() + timedelta(minutes=5)).ran == 0
    page = alice.get("/projects/").get_data(as_text=True)
    assert f'id="project-{project.id}"' in page and "deleted-project-" not in page


def test_restore_from_the_bin_and_too_late_after_the_purge(
    app: Flask, person: Callable[[str], Person]
) -> None:
    alice = person("alice")
    project = project_named(app, "Quarterly planning")
    alice.post(f"/projects/{project.id}/delete")
    response = alice.post(f"/projects/{project.id}/restore", follow_redirects=True)
    assert "“Quarterly planning” is back." in response.get_data(as_text=True)
    assert project_named(app, "Quarterly planning").deleted_at is None

    alice.post(f"/projects/{project.id}/delete")
    with app_context(app) as defer:
        assert defer.run_due(now=utcnow() + timedelta(seconds=31)).done == 1
    assert alice.post(f"/projects/{project.id}/restore").status_code == 404


def test_nobody_deletes_another_persons_project(
    app: Flask, person: Callable[[str], Person]
) -> None:
    project = project_named(app, "Garden shed")
    assert person("alice").post(f"/projects/{project.id}/delete").status_code == 404
    assert project_named(app, "Garden shed").deleted_at is None


def test_the_grace_period_comes_from_the_config(demo: Callable[..., Flask]) -> None:
    app = demo(DEMO_DELETE_GRACE=timedelta(seconds=4))
    alice = Person(app, app.test_client()).sign_in("alice")
    project = project_named(app, "Website relaunch")
    alice.post(f"/projects/{project.id}/delete")
    with app_context(app) as defer:
        assert defer.run_due(now=utcnow() + timedelta(seconds=4.5)).done == 1
    assert count(app, Project, id=project.id) == 0


def test_a_new_project_can_be_added(app: Flask, person: Callable[[str], Person]) -> None:
    alice = person("alice")
    assert alice.post("/projects/", {"name": "Moon base"}).status_code == 303
    assert "Moon base" in alice.get("/projects/").get_data(as_text=True)


# -- comments: batched notifications ----------------------------------------------------


def post_titled(app: Flask, title: str) -> Post:
    post = one(app, Post, title=title)
    assert post is not None
    return post


def test_comments_become_one_notification_a_window_after_the_first(
    demo: Callable[..., Flask],
) -> None:
    app = demo(DEMO_BATCH_WINDOW=10)
    alice = Person(app, app.test_client()).sign_in("alice")
    bob = Person(app, app.test_client()).sign_in("bob")
    post = post_titled(app, "Why our emails wait five seconds")
    first = utcnow()
    for text in ["Great post", "Five seconds is right", "Gmail does 30"]:
        response = bob.post(f"/posts/{post.id}/comments", {"text": text})
        assert response.status_code == 303
    batch = job_for(app, comments_key(post.id))
    assert batch.status is JobStatus.PENDING and len(batch.payload["items"]) == 3
    assert first + timedelta(seconds=10) <= batch.run_at <= utcnow() + timedelta(seconds=10)
    page = bob.get(f"/posts/{post.id}").get_data(as_text=True)
    assert "Alice gets one notification for" in page and "<strong>3 comments</strong>" in page

    with app_context(app) as defer:
        assert defer.run_due(now=batch.run_at - timedelta(seconds=1)).ran == 0
        assert defer.run_due(now=batch.run_at).done == 1
    assert count(app, Notification, user="alice") == 1
    assert count(app, Notification, user="bob") == 0
    note = one(app, Notification, user="alice")
    assert note.text == "3 new comments on “Why our emails wait five seconds”"
    assert note.detail == "from Bob" and note.post_id == post.id
    assert '<span class="badge" aria-label="1 unread">1</span>' in alice.get("/mail/").get_data(
        as_text=True
    )
    page = alice.get("/notifications/").get_data(as_text=True)
    assert "3 new comments on “Why our emails wait five seconds”" in page
    assert 'class="badge"' not in alice.get("/mail/").get_data(as_text=True)  # read now

    # The next comment opens a new batch.
    bob.post(f"/posts/{post.id}/comments", {"text": "One more"})
    later = job_for(app, comments_key(post.id))
    assert later.id != batch.id and later.payload["items"][0]["comment_id"] == (
        one(app, Comment, text="One more").id
    )


def test_nobody_comments_on_another_persons_draft(
    app: Flask, person: Callable[[str], Person]
) -> None:
    draft = post_titled(app, "Launch announcement")  # Alice's draft
    bob = person("bob")
    assert bob.get(f"/posts/{draft.id}").status_code == 404
    assert bob.post(f"/posts/{draft.id}/comments", {"text": "hi"}).status_code == 404
    assert "Launch announcement" not in bob.get("/posts/").get_data(as_text=True)


# -- scheduled publishing -----------------------------------------------------------------


def test_schedule_uses_the_browsers_utc_offset(app: Flask, person: Callable[[str], Person]) -> None:
    alice = person("alice")
    post = post_titled(app, "Launch announcement")
    # 09:30 in UTC+02:00: JavaScript's getTimezoneOffset() says -120.
    response = alice.post(
        f"/posts/{post.id}/schedule", {"publish_at": "2031-03-04T09:30", "tz_offset": "-120"}
    )
    assert response.status_code == 303
    job = job_for(app, publish_key(post.id))
    assert job.name == "publish_post" and job.status is JobStatus.PENDING
    assert job.run_at == datetime(2031, 3, 4, 7, 30, tzinfo=UTC)
    assert job.owner == "alice" and job.label == "Publish “Launch announcement”"
    scheduled = one(app, Post, id=post.id)
    assert scheduled.status == "scheduled"
    assert scheduled.publish_at == datetime(2031, 3, 4, 7, 30, tzinfo=UTC)
    page = alice.get(f"/posts/{post.id}").get_data(as_text=True)
    assert 'id="reschedule"' in page and 'id="cancel-publishing"' in page
    assert 'datetime="2031-03-04T07:30:00Z"' in page


def test_without_an_offset_the_time_is_utc(app: Flask, person: Callable[[str], Person]) -> None:
    alice = person("alice")
    post = post_titled(app, "Launch announcement")
    alice.post(f"/posts/{post.id}/schedule", {"publish_at": "2031-03-04T09:30", "tz_offset": ""})
    assert job_for(app, publish_key(post.id)).run_at == datetime(2031, 3, 4, 9, 30, tzinfo=UTC)
    assert "(UTC)" in alice.get(f"/posts/{post.id}").get_data(as_text=True)


def test_reschedule_moves_the_same_job(app: Flask, person: Callable[[str], Person]) -> None:
    alice = person("alice")
    post = post_titled(app, "Launch announcement")
    alice.post(f"/posts/{post.id}/schedule", {"publish_at": "2031-03-04T09:30"})
    first = job_for(app, publish_key(post.id))
    response = alice.post(
        f"/posts/{post.id}/schedule",
        {"publish_at": "2031-03-05T18:00", "tz_offset": "300"},  # UTC-05:00
        follow_redirects=True,
    )
    assert "Rescheduled." in response.get_data(as_text=True)
    moved = job_for(app, publish_key(post.id))
    assert moved.id == first.id
    assert moved.run_at == datetime(2031, 3, 5, 23, 0, tzinfo=UTC)
    assert one(app, Post, id=post.id).publish_at == moved.run_at


def test_cancel_before_then_makes_it_a_draft_again(
    app: Flask, person: Callable[[str], Person]
) -> None:
    alice = person("alice")
    post = post_titled(app, "Launch announcement")
    alice.post(f"/posts/{post.id}/schedule", {"publish_at": "2031-03-04T09:30"})
    response = alice.post(f"/posts/{post.id}/cancel", follow_redirects=True)
    assert "Publishing cancelled" in response.get_data(as_text=True)
    assert job_for(app, publish_key(post.id)).status is JobStatus.CANCELLED
    draft = one(app, Post, id=post.id)
    assert draft.status == "draft" and draft.publish_at is None
    with app_context(app) as defer:
        assert defer.run_due(now=datetime(2031, 3, 5, tzinfo=UTC)).ran == 0


def test_a_scheduled_post_goes_live_at_its_time_and_then_it_is_too_late(
    app: Flask, person: Callable[[str], Person]
) -> None:
    alice = person("alice")
    post = post_titled(app, "Launch announcement")
    alice.post(f"/posts/{post.id}/schedule", {"publish_at": "2031-03-04T09:30"})
    with app_context(app) as defer:
        assert defer.run_due(now=datetime(2031, 3, 4, 9, 29, tzinfo=UTC)).ran == 0
        assert defer.run_due(now=datetime(2031, 3, 4, 9, 30, tzinfo=UTC)).done == 1
    live = one(app, Post, id=post.id)
    assert live.status == "published" and live.published_at is not None
    assert one(app, Notification, user="alice").text == "Your post “Launch announcement” is live"
    # Everybody sees it now.
    assert "Launch announcement" in person("bob").get("/posts/").get_data(as_text=True)
    response = alice.post(f"/posts/{post.id}/cancel", follow_redirects=True)
    assert "Too late to cancel" in response.get_data(as_text=True)
    response = alice.post(
        f"/posts/{post.id}/schedule", {"publish_at": "2031-03-09T09:30"}, follow_redirects=True
    )
    assert "already published" in response.get_data(as_text=True)


def test_cancel_from_the_pending_page_makes_it_a_draft_too(
    app: Flask, person: Callable[[str], Person]
) -> None:
    alice = person("alice")
    post = post_titled(app, "Launch announcement")
    alice.post(f"/posts/{post.id}/schedule", {"publish_at": "2031-03-04T09:30"})
    job = job_for(app, publish_key(post.id))
    pending = alice.get("/defer/pending").get_data(as_text=True)
    assert f'id="defer-pending-{job.id}"' in pending and "Publish “Launch announcement”" in pending
    assert alice.post(f"/defer/undo/{job.id}", {"next": "/defer/pending"}).status_code == 303
    assert one(app, Post, id=post.id).status == "draft"  # the on_undo hook


@pytest.mark.parametrize(
    ("form", "problem"),
    [
        ({"publish_at": ""}, "Choose a date and time."),
        ({"publish_at": "next tuesday"}, "is not a date and time"),
        ({"publish_at": "2031-03-04T09:30", "tz_offset": "abc"}, "is not a time zone offset"),
        ({"publish_at": "2031-03-04T09:30", "tz_offset": "9999"}, "not a real time zone offset"),
        ({"publish_at": "2001-01-01T09:30"}, "Choose a time in the future."),
    ],
)
def test_a_bad_publish_time_is_refused_with_a_reason(
    app: Flask, person: Callable[[str], Person], form: dict[str, str], problem: str
) -> None:
    alice = person("alice")
    post = post_titled(app, "Launch announcement")
    response = alice.post(f"/posts/{post.id}/schedule", form, follow_redirects=True)
    assert problem in response.get_data(as_text=True)
    with app_context(app) as defer:
        assert defer.get(key=publish_key(post.id)) is None
    assert one(app, Post, id=post.id).status == "draft"


def test_only_the_author_schedules(app: Flask, person: Callable[[str], Person]) -> None:
    post = post_titled(app, "Spring planting plan")  # Bob's draft
    alice = person("alice")
    assert (
        alice.post(f"/posts/{post.id}/schedule", {"publish_at": "2031-03-04T09:30"}).status_code
        == 404
    )
    assert alice.post(f"/posts/{post.id}/cancel").status_code == 404


def test_a_new_draft_can_be_written(app: Flask, person: Callable[[str], Person]) -> None:
    alice = person("alice")
    response = alice.post("/posts/", {"title": "Hello", "body": "World"})
    assert response.status_code == 303
    post = post_titled(app, "Hello")
    assert response.location == f"/posts/{post.id}"
    assert post.status == "draft" and post.author == "alice"


# -- settings, the dashboard link ---------------------------------------------------------


def test_parse_local_reads_the_browsers_offset() -> None:
    assert parse_local("2031-07-01T09:30", "-120") == datetime(2031, 7, 1, 7, 30, tzinfo=UTC)
    assert parse_local("2031-01-01T09:30", "300") == datetime(2031, 1, 1, 14, 30, tzinfo=UTC)
    assert parse_local("2031-01-01T09:30:15", None) == datetime(2031, 1, 1, 9, 30, 15, tzinfo=UTC)
    assert parse_local("2031-01-01T09:30", "-840").hour == 19  # UTC+14:00, the day before
    with pytest.raises(ValueError, match="without a zone"):
        parse_local("2031-01-01T09:30+02:00", None)


def test_database_url_selects_the_database_and_turns_the_embedded_worker_off(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from demo_app import create_app

    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("DEFER_EMBEDDED_WORKER", raising=False)
    assert database_url_from_env() is None
    default = create_app({"INSTANCE_PATH": str(tmp_path / "a")})
    try:
        assert default.config["SQLALCHEMY_DATABASE_URI"] == "sqlite:///" + str(
            tmp_path / "a" / "demo.sqlite3"
        )
        assert default.config["DEFER_EMBEDDED_WORKER"] is True
        assert (tmp_path / "a" / "demo.sqlite3").exists()  # tables created on start
    finally:
        dispose(default)

    monkeypatch.setenv("DATABASE_URL", "postgres://demo@db.example/demo")
    assert database_url_from_env() == "postgresql+psycopg://demo@db.example/demo"
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'b.sqlite3'}")
    elsewhere = create_app({"INSTANCE_PATH": str(tmp_path / "b")})
    try:
        assert elsewhere.config["SQLALCHEMY_DATABASE_URI"].endswith("b.sqlite3")
        assert elsewhere.config["DEFER_EMBEDDED_WORKER"] is False
    finally:
        dispose(elsewhere)
    monkeypatch.setenv("DEFER_EMBEDDED_WORKER", "1")
    asked = create_app({"INSTANCE_PATH": str(tmp_path / "c")})
    try:
        assert asked.config["DEFER_EMBEDDED_WORKER"] is True
    finally:
        dispose(asked)


def test_grace_and_batch_windows_come_from_the_environment_in_seconds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from demo_app import create_app

    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("DEMO_DELETE_GRACE", "12")
    monkeypatch.setenv("DEMO_BATCH_WINDOW", "7.5")
    monkeypatch.setenv("DEMO_MAIL_UNDO_WINDOW", "3")
    app = create_app({"INSTANCE_PATH": str(tmp_path / "a"), "DEFER_EMBEDDED_WORKER": False})
    try:
        assert app.config["DEMO_DELETE_GRACE"] == timedelta(seconds=12)
        assert app.config["DEMO_BATCH_WINDOW"] == timedelta(seconds=7.5)
        assert app.config["DEMO_MAIL_UNDO_WINDOW"] == timedelta(seconds=3)
    finally:
        dispose(app)
    monkeypatch.setenv("DEMO_DELETE_GRACE", "soon")
    with pytest.raises(ValueError, match="DEMO_DELETE_GRACE must be a number of seconds"):
        create_app({"INSTANCE_PATH": str(tmp_path / "b")})


def test_the_readme_lists_the_demos_environment_settings() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in ("DEMO_DELETE_GRACE", "DEMO_BATCH_WINDOW", "DEMO_MAIL_UNDO_WINDOW"):
        assert f"| `{name}` |" in readme, name


def test_the_dashboard_link_appears_when_the_dashboard_exists(
    demo: Callable[..., Flask],
) -> None:
    app = demo()
    if "defer.dashboard" in app.view_functions:
        # This flask_defer has the dashboard: opened for signed-in demo users.
        alice = Person(app, app.test_client()).sign_in("alice")
        assert 'id="dashboard-link"' in alice.get("/mail/").get_data(as_text=True)
        assert alice.get("/defer/").status_code == 200
        return
    alice = Person(app, app.test_client()).sign_in("alice")
    assert 'id="dashboard-link"' not in alice.get("/mail/").get_data(as_text=True)
    # As soon as there is a dashboard, the link shows.
    with_dashboard = demo()
    with_dashboard.add_url_rule("/defer/", endpoint="defer.dashboard", view_func=lambda: "jobs")
    alice = Person(with_dashboard, with_dashboard.test_client()).sign_in("alice")
    page = alice.get("/mail/").get_data(as_text=True)
    assert 'id="dashboard-link"' in page and 'href="/defer/"' in page


# -- automation: a recurring schedule, a scheduled HTTP call, a failing job ----------------


def test_the_weekly_digest_is_a_recurring_schedule_to_pause_resume_and_run_now(
    app: Flask, person: Callable[[str], Person]
) -> None:
    alice = person("alice")
    page = alice.get("/automation/").get_data(as_text=True)
    assert "Weekly digest: every Monday at 09:00, Berlin time" in page
    state = re.search(r'id="digest-state">(.*?)</p>', page, re.S)
    assert state and "Active" in state.group(1) and "last run never" in state.group(1)
    with app_context(app) as defer:
        (digest,) = [s for s in defer.list_recurring() if s.id == "weekly-digest"]
        assert (digest.cron, digest.tz, digest.catch_up) == ("0 9 * * MON", "Europe/Berlin", "skip")
        local = digest.next_run_at.astimezone(ZoneInfo("Europe/Berlin"))
        assert (local.weekday(), local.hour, local.minute) == (0, 9, 0)
    assert alice.post("/automation/digest/pause").status_code == 303
    assert "Paused" in alice.get("/automation/").get_data(as_text=True)
    with app_context(app) as defer:
        assert [s.paused for s in defer.list_recurring()] == [True]
    assert alice.post("/automation/digest/resume").status_code == 303
    assert alice.post("/automation/digest/run-now").status_code == 303
    with app_context(app) as defer:
        assert [s.paused for s in defer.list_recurring()] == [False]
        assert defer.run_due().done == 1
    assert "Your week: 0 messages sent" in alice.get("/notifications/").get_data(as_text=True)
    assert count(app, Notification, user="bob") == 1


def test_a_scheduled_call_goes_to_the_demos_own_webhook_signed(
    app: Flask, person: Callable[[str], Person]
) -> None:
    alice = person("alice")
    response = alice.post("/automation/call", {"delay": "5", "answer": "503"})
    assert response.status_code == 303
    with app_context(app) as defer:
        (job,) = defer.list(name="flask_defer.http", owner="alice")
    assert job.payload["url"] == "http://localhost/automation/webhook"
    assert job.payload["json"] == {"owner": "alice", "answer": 503, "note": "scheduled 5 s ahead"}
    assert job.run_at > utcnow() + timedelta(seconds=3)
    signed = job.payload["headers"]
    # What the worker's call does, through the test client: no sign-in, no form token.
    anonymous = app.test_client()
    answer = anonymous.post("/automation/webhook", json=job.payload["json"], headers=signed)
    assert answer.status_code == 503 and answer.get_json() == {"received": True, "answer": 503}
    assert count(app, WebhookCall, owner="alice", answered=503) == 1
    forged = {**job.payload["json"], "owner": "bob"}
    assert anonymous.post("/automation/webhook", json=forged, headers=signed).status_code == 403
    assert anonymous.post("/automation/webhook", json=job.payload["json"]).status_code == 403
    assert count(app, WebhookCall) == 1
    page = alice.get("/automation/").get_data(as_text=True)
    assert "Calling the webhook (it will answer 503)" in page and "answered 503" in page
    assert alice.post("/automation/call", {"delay": "0", "answer": "200"}).status_code == 303
    assert alice.post("/automation/call", {"delay": "5", "answer": "302"}).status_code == 303
    with app_context(app) as defer:
        assert len(defer.list(name="flask_defer.http")) == 1  # the bad ones wrote nothing
        with pytest.raises(InvalidArgument, match="DEFER_HTTP_ALLOWED_HOSTS"):
            defer.schedule_http("https://example.org/hook", json={})


def test_the_partner_sync_fails_three_times_then_stays_as_a_dead_letter(
    app: Flask, person: Callable[[str], Person]
) -> None:
    alice = person("alice")
    assert alice.post("/automation/sync").status_code == 303
    with app_context(app) as defer:
        (job,) = defer.list(name="sync_partner", owner="alice")
        for minutes in (0, 10, 20):  # past each backoff
            assert defer.run_due(now=utcnow() + timedelta(minutes=minutes)).ran == 1
        failed = defer.get(job.id)
        assert failed is not None and failed.status is JobStatus.FAILED
        assert failed.attempts == 3 and "PartnerDown" in (failed.last_error or "")
        events = [event.event for event in defer.history(job.id)]
    assert events.count("retried") == 2 and events[-1] == "failed"
    page = alice.get("/automation/").get_data(as_text=True)
    row = re.search(rf'id="sync-{job.id}".*?</li>', page, re.S)
    assert row and "Failed" in row.group(0) and "attempt 3 of 3" in row.group(0)
    assert f'href="/defer/jobs/{job.id}#defer-job-history"' in row.group(0)
    assert 'hx-trigger="every 1s"' not in page  # nothing live: no polling


# -- the language switch ------------------------------------------------------------------


def undo_button(html: str) -> str:
    """The word on the toast's Undo button (before its countdown)."""
    match = re.search(r'class="defer-toast__undo"[^>]*>\s*([^<]+?)\s*<span', html)
    assert match, "no Undo button on the page"
    return match.group(1)


def test_the_language_switch_translates_flask_defers_toast_and_dashboard(
    app: Flask, person: Callable[[str], Person]
) -> None:
    alice = person("alice")
    send(alice)
    page = alice.get("/mail/").get_data(as_text=True)
    assert 'id="language-switch"' in page and undo_button(page) == "Undo"
    assert 'value="en" lang="en" class="btn btn-quiet btn-small" aria-pressed="true"' in page
    response = alice.post("/language", {"language": "de", "next": "/mail/"})
    assert (response.status_code, response.location) == (303, "/mail/")
    page = alice.get("/mail/").get_data(as_text=True)
    assert undo_button(page) == "Rückgängig"
    assert 'value="de" lang="de" class="btn btn-quiet btn-small" aria-pressed="true"' in page
    assert ">Aufgaben<" in alice.get("/defer/").get_data(as_text=True)
    # The choice survives signing in as someone else.
    bob = alice.sign_in("bob")
    assert 'lang="de" class="btn btn-quiet btn-small" aria-pressed="true"' in bob.get(
        "/mail/"
    ).get_data(as_text=True)


def test_without_a_choice_the_browsers_language_is_used(
    app: Flask, person: Callable[[str], Person]
) -> None:
    alice = person("alice")
    send(alice)
    french = alice.get("/mail/", headers={"Accept-Language": "fr-FR,fr;q=0.9"})
    assert undo_button(french.get_data(as_text=True)) == "Annuler"
    other = alice.get("/mail/", headers={"Accept-Language": "ja"})
    assert undo_button(other.get_data(as_text=True)) == "Undo"


def test_the_language_switch_refuses_other_languages_foreign_redirects_and_no_token(
    app: Flask, person: Callable[[str], Person]
) -> None:
    alice = person("alice")
    assert alice.post("/language", {"language": "xx"}).status_code == 400
    away = alice.post("/language", {"language": "fr", "next": "https://evil.example/"})
    assert (away.status_code, away.location) == (303, "/")
    no_token = alice.client.post("/language", data={"language": "de"})
    assert no_token.status_code == 400


# -- the two documented ways to run it ------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def demo_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    if "DATABASE_URL" not in extra:
        env.pop("DATABASE_URL", None)
    env.pop("DEFER_EMBEDDED_WORKER", None)
    return env


def stop(process: subprocess.Popen[str], timeout: float = 20) -> str:
    """Ctrl-C *process* and return its output; killed if it ignores that, never left over.

    A demo that outlived its test would hold its port and its database file and fail
    the next test, so this runs in every such test's ``finally``.
    """
    process.send_signal(signal.SIGINT)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        raise AssertionError(f"the demo ignored Ctrl-C for {timeout} s:\n{output}") from None
    return str(output)


def ignore_sigint() -> None:
    """As a shell script started in the background (``demo &``) leaves its children."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.slow
def test_the_demo_stops_on_ctrl_c_even_when_started_with_sigint_ignored(tmp_path: Path) -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "demo_app"],
        cwd=ROOT,
        env=demo_env(DEMO_INSTANCE_PATH=str(tmp_path / "instance"), DEMO_PORT=str(port)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=ignore_sigint,
    )

    def serving() -> bool:
        assert process.poll() is None, "python -m demo_app exited"
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_until(serving, 30, f"the demo on port {port}")
    finally:
        output = stop(process, timeout=10)
    assert process.returncode == 0, output


@pytest.mark.slow
def test_python_m_demo_app_serves_the_demo_and_its_worker_sends_mail(tmp_path: Path) -> None:
    """The README's one command: SQLite in the instance folder, the embedded worker."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    instance = tmp_path / "instance"
    process = subprocess.Popen(
        [sys.executable, "-m", "demo_app"],
        cwd=ROOT,
        env=demo_env(DEMO_INSTANCE_PATH=str(instance), DEMO_PORT=str(port)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    browser = build_opener(HTTPCookieProcessor(CookieJar()))

    def fetch(path: str, form: dict[str, str] | None = None) -> str:
        data = urlencode(form).encode() if form is not None else None
        with browser.open(base + path, data=data, timeout=5) as response:
            return str(response.read().decode())

    def serving() -> bool:
        try:
            return "Continue as Alice" in fetch("/sign-in")
        except OSError:
            assert process.poll() is None, "python -m demo_app exited"
            return False

    try:
        wait_until(serving, 30, f"{base}/sign-in")
        assert (instance / "demo.sqlite3").exists()
        page = fetch("/sign-in", {"csrf_token": csrf_from(fetch("/sign-in")), "user": "alice"})
        assert "Website relaunch" not in page and 'id="signed-in-as">Alice<' in page
        token = csrf_from(page)
        page = fetch("/mail/send", {"csrf_token": token, "to": "ada@example.org", "subject": "Hi"})
        assert "Sending…" in page
        # Nobody clicks Undo: 5 s window + 1 s margin, then the embedded worker sends it.
        wait_until(lambda: ">Sent<" in fetch("/mail/outbox"), 20, "the message to be sent")
    finally:
        output = stop(process)
    assert f"flask_defer demo   {base}" in output
    assert "embedded worker" in output
    assert "delivered message 1 to ada@example.org: 'Hi'" in output
    assert process.returncode == 0, output


@pytest.mark.parametrize("backend", ["postgresql"])
def test_on_postgresql_a_separate_worker_process_runs_the_jobs(
    app: Flask, person: Callable[[str], Person], database_url: str
) -> None:
    """The README's second way: DATABASE_URL and `flask --app demo_app defer worker`."""
    assert app.config["SQLALCHEMY_DATABASE_URI"] == database_url
    message = send(person("alice"))
    with app_context(app) as defer:
        # Let the Undo window pass without waiting for it.
        defer.reschedule(key=message_key(message.id), run_at=utcnow())
    result = subprocess.run(
        [sys.executable, "-m", "flask", "--app", "demo_app", "defer", "worker", "--burst"],
        cwd=ROOT,
        env=demo_env(DATABASE_URL=database_url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert f"delivered message {message.id} to ada@example.org" in result.stderr + result.stdout
    assert one(app, Message, id=message.id).status == "sent"
