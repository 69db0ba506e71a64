"""The demo app end to end in headless Chromium, served on 127.0.0.1.

The demo runs in a werkzeug server thread on SQLite. Time is driven with
``defer.run_due(now=...)`` where the moment matters more than the clock; one test
runs the real embedded worker with a short Undo window, to show a message turning
"Sent" by itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from playwright.sync_api import BrowserContext, Locator, Page, expect
from sqlalchemy import func, select

from demo_app.jobs import comments_key, message_key, publish_key
from demo_app.models import Message, Notification, OutboxEntry, Post, Project, db, defer
from flask_defer import INCLUDE_DELETED, Job, JobStatus, RunSummary

from ..demo_helpers import dispose, make_demo

pytestmark = pytest.mark.browser


@dataclass
class Demo:
    """The demo app being served, and ways to look inside it."""

    app: Flask
    url: str

    def run_due(self, now: datetime | None = None) -> RunSummary:
        with self.app.app_context():
            return defer.run_due(now=now)

    def job(self, key: str) -> Job:
        with self.app.app_context():
            job = defer.get(key=key)
        assert job is not None, key
        return job

    def scalar(self, statement: Any) -> Any:
        with self.app.app_context():
            return db.session.scalar(statement.execution_options(**{INCLUDE_DELETED: True}))

    def id_of(self, model: Any, **where: Any) -> int:
        found = self.scalar(select(model.id).filter_by(**where))
        assert found is not None, where
        return int(found)


@pytest.fixture
def serve(
    tmp_path: Path, live_server: Callable[[Any], str]
) -> Iterator[Callable[..., Demo]]:
    """Factory: serve the demo with config overrides; stopped after the test."""
    apps: list[Flask] = []

    def start(**config: Any) -> Demo:
        app = make_demo(f"sqlite:///{tmp_path / 'demo.sqlite3'}", tmp_path / "instance", **config)
        apps.append(app)
        return Demo(app, live_server(app))

    yield start
    for app in apps:
        dispose(app)


@pytest.fixture
def demo(serve: Callable[..., Demo]) -> Demo:
    return serve()


@pytest.fixture
def open_as(new_browser_context: Callable[..., BrowserContext]) -> Callable[..., Page]:
    """Factory: a fresh browser (its own cookies) signed in as *user*, on *path*."""

    def open_as(demo: Demo, user: str, path: str = "/mail/", **context_args: Any) -> Page:
        context_args.setdefault("viewport", {"width": 1200, "height": 800})
        page = new_browser_context(**context_args).new_page()
        page.goto(demo.url + path)
        page.click(f"#sign-in-{user}")
        expect(page.locator("#signed-in-as")).to_have_text(user.capitalize())
        return page

    return open_as


def toasts(page: Page) -> Locator:
    return page.locator('[data-defer-toast][data-defer-state="open"]')


def send(page: Page, subject: str) -> Locator:
    """Compose and send; return the message's row in the outbox."""
    page.fill("#subject", subject)
    page.click("#send")
    row = page.locator(".row", has_text=subject).first
    expect(row.locator("[data-pill]")).to_have_text("Sending…")
    return row


def mark_page(page: Page) -> None:
    page.evaluate("window.__notReloaded = true")


def assert_not_reloaded(page: Page) -> None:
    assert page.evaluate("window.__notReloaded === true")


def utcnow() -> datetime:
    return datetime.now(UTC)


# -- mail -------------------------------------------------------------------------------


def test_send_then_undo_keeps_the_message_as_a_draft(
    demo: Demo, open_as: Callable[..., Page]
) -> None:
    page = open_as(demo, "alice")
    row = send(page, "Quarterly report")
    toast = toasts(page).last
    expect(toast).to_contain_text("Sending “Quarterly report”")
    expect(toast).not_to_contain_text("sent")
    message_id = demo.id_of(Message, subject="Quarterly report")
    job = demo.job(message_key(message_id))
    assert job.status is JobStatus.PENDING
    mark_page(page)

    toast.get_by_role("button", name="Undo").click()
    expect(page.locator('[data-defer-outcome="undone"]')).to_be_visible()
    # The outbox refreshes itself: the hook made it a draft again.
    expect(row.locator("[data-pill]")).to_have_text("Draft")
    expect(row.get_by_role("button", name="Send again")).to_be_visible()
    assert_not_reloaded(page)
    assert demo.job(message_key(message_id)).status is JobStatus.CANCELLED
    assert demo.run_due(now=job.run_at + timedelta(seconds=1)).ran == 0
    assert demo.scalar(select(func.count()).select_from(OutboxEntry)) == 0


def test_send_and_let_it_go_turns_sent_by_itself(
    serve: Callable[..., Demo], open_as: Callable[..., Page]
) -> None:
    # The real embedded worker, with a 2-second Undo window: wall-clock time on purpose.
    demo = serve(DEFER_EMBEDDED_WORKER=True, DEMO_MAIL_UNDO_WINDOW=2)
    page = open_as(demo, "alice")
    row = send(page, "Lunch on Friday?")
    mark_page(page)
    toast = toasts(page).last
    expect(toast.get_by_role("button", name="Undo")).to_be_visible()
    job_id = toast.get_attribute("data-defer-toast")
    item = page.locator(f'[data-defer-toast="{job_id}"]')
    page.evaluate(
        "window.__settled = [];"
        "document.body.addEventListener('defer:settled', (e) => window.__settled.push(e.detail))"
    )
    expect(item).to_have_attribute("data-defer-state", "waiting", timeout=4000)
    expect(item).to_contain_text("Sending…")
    expect(row.locator("[data-pill]")).to_have_text("Sending…")  # the truth, both places
    expect(item).to_have_attribute("data-defer-state", "done", timeout=6000)
    expect(item).to_contain_text("Sent")
    # The outbox follows through defer:settled (it does not poll), within a second.
    expect(row.locator("[data-pill]")).to_have_text("Sent", timeout=1000)
    assert [d["status"] for d in page.evaluate("window.__settled")] == ["done"]
    expect(row).to_contain_text("outbox #1")
    assert_not_reloaded(page)
    message_id = demo.id_of(Message, subject="Lunch on Friday?")
    assert demo.job(message_key(message_id)).status is JobStatus.DONE
    assert demo.scalar(select(OutboxEntry.message_id)) == message_id


# -- projects ---------------------------------------------------------------------------


def test_delete_a_project_then_undo_brings_it_back(
    demo: Demo, open_as: Callable[..., Page]
) -> None:
    page = open_as(demo, "alice", "/projects/")
    project_id = demo.id_of(Project, name="Website relaunch")
    row = page.locator(f"#project-{project_id}")
    row.get_by_role("button", name="Delete Website relaunch").click()
    expect(row).to_have_count(0)
    binned = page.locator(f"#deleted-project-{project_id}")
    expect(binned).to_contain_text(re.compile(r"gone for good in \d+ s"))
    # The 30 s grace counts down from the server's run_at; a loaded machine may take a
    # few seconds to get here, never the whole grace.
    left = int(re.findall(r"gone for good in (\d+) s", binned.inner_text())[0])
    assert 15 <= left <= 30, left
    toast = toasts(page).last
    expect(toast).to_contain_text("Project “Website relaunch” deleted")
    mark_page(page)

    toast.get_by_role("button", name="Undo").click()
    expect(page.locator('[data-defer-outcome="undone"]')).to_be_visible()
    expect(page.locator(f"#project-{project_id}")).to_be_visible()  # the list refreshed
    expect(binned).to_have_count(0)
    assert_not_reloaded(page)
    assert demo.run_due(now=utcnow() + timedelta(minutes=1)).ran == 0
    assert demo.scalar(select(Project.deleted_at).filter_by(id=project_id)) is None


def test_a_deleted_project_is_gone_for_good_after_the_grace(
    demo: Demo, open_as: Callable[..., Page]
) -> None:
    page = open_as(demo, "alice", "/projects/")
    project_id = demo.id_of(Project, name="Team offsite")
    page.get_by_role("button", name="Delete Team offsite").click()
    binned = page.locator(f"#deleted-project-{project_id}")
    expect(binned).to_be_visible()
    assert demo.run_due(now=utcnow() + timedelta(seconds=31)).done == 1
    expect(binned).to_have_count(0)
    expect(page.locator("#bin")).to_contain_text("Nothing here.")
    expect(page.locator(f"#project-{project_id}")).to_have_count(0)
    assert demo.scalar(select(func.count()).select_from(Project).filter_by(id=project_id)) == 0


# -- comments -----------------------------------------------------------------------------


def test_three_comments_become_one_notification(demo: Demo, open_as: Callable[..., Page]) -> None:
    post_id = demo.id_of(Post, title="Why our emails wait five seconds")
    bob = open_as(demo, "bob", f"/posts/{post_id}")
    for text in ["Great post", "Five seconds feels right", "Gmail lets you pick 30"]:
        bob.fill("#comment-text", text)
        bob.click("#comment")
        expect(bob.locator(".comment", has_text=text)).to_be_visible()
    expect(bob.locator("#batch-info")).to_contain_text(
        "Alice gets one notification for 3 comments in"
    )
    batch = demo.job(comments_key(post_id))
    assert len(batch.payload["items"]) == 3

    alice = open_as(demo, "alice", "/notifications/")
    expect(alice.locator(".empty")).to_contain_text("Nothing yet.")
    assert demo.run_due(now=batch.run_at).done == 1
    alice.reload()
    notes = alice.locator("#notifications .row")
    expect(notes).to_have_count(1)
    expect(notes.first).to_contain_text("3 new comments on “Why our emails wait five seconds”")
    expect(notes.first).to_contain_text("from Bob")
    assert demo.scalar(select(func.count()).select_from(Notification)) == 1
    # Bob's page stops announcing the batch once it has gone out.
    expect(bob.locator("#batch-info")).to_have_count(0)


# -- ownership --------------------------------------------------------------------------------


def test_the_two_users_cannot_see_each_others_toasts(
    serve: Callable[..., Demo], open_as: Callable[..., Page]
) -> None:
    demo = serve(DEMO_MAIL_UNDO_WINDOW=30)
    alice = open_as(demo, "alice")
    bob = open_as(demo, "bob")
    send(alice, "For Alice's eyes")
    expect(toasts(alice)).to_have_count(1)
    send(bob, "From Bob")
    expect(toasts(bob)).to_have_count(1)
    expect(toasts(bob)).to_contain_text("From Bob")
    alice.reload()
    expect(toasts(alice)).to_have_count(1)
    expect(toasts(alice)).to_contain_text("For Alice's eyes")
    expect(alice.locator("#outbox")).not_to_contain_text("From Bob")

    # Bob cannot undo Alice's message, even knowing its id.
    alices = demo.job(message_key(demo.id_of(Message, subject="For Alice's eyes")))
    token = bob.locator("#compose input[name=csrf_token]").input_value()
    answer = bob.request.post(
        f"{demo.url}/defer/undo/{alices.id}",
        headers={"HX-Request": "true", "X-CSRFToken": token},
    )
    assert answer.status == 404
    bob.goto(demo.url + "/defer/pending")
    expect(bob.locator(f"#defer-pending-{alices.id}")).to_have_count(0)
    assert demo.job(alices.key or "").status is JobStatus.PENDING

    # Same browser, other person: Alice switches to Bob and sees only Bob's toast.
    alice.get_by_role("button", name="Switch user").click()
    alice.click("#sign-in-bob")
    expect(alice.locator("#signed-in-as")).to_have_text("Bob")
    expect(toasts(alice)).to_have_count(1)
    expect(toasts(alice)).to_contain_text("From Bob")


# -- scheduled publishing -------------------------------------------------------------------


def test_schedule_reschedule_and_cancel_in_the_readers_time_zone(
    demo: Demo, open_as: Callable[..., Page]
) -> None:
    post_id = demo.id_of(Post, title="Launch announcement")
    page = open_as(demo, "alice", f"/posts/{post_id}", timezone_id="America/New_York")
    expect(page.locator("[data-zone-label]")).to_contain_text("America/New_York")
    page.fill("#publish-at", "2031-07-01T09:30")
    expect(page.locator("[data-zone-label]")).to_contain_text("UTC-04:00")  # summer time
    page.click("#schedule")
    expect(page.locator(".flash")).to_have_text("Scheduled.")
    job = demo.job(publish_key(post_id))
    assert job.run_at == datetime(2031, 7, 1, 13, 30, tzinfo=UTC)
    expect(page.locator("#post-live [data-pill]")).to_contain_text("Scheduled")
    # The form shows the time back in the reader's zone.
    expect(page.locator("#publish-at")).to_have_value("2031-07-01T09:30")

    page.fill("#publish-at", "2031-12-01T09:30")  # winter: UTC-05:00
    page.click("#reschedule")
    expect(page.locator(".flash")).to_have_text("Rescheduled.")
    moved = demo.job(publish_key(post_id))
    assert moved.id == job.id and moved.run_at == datetime(2031, 12, 1, 14, 30, tzinfo=UTC)

    page.click("#cancel-publishing")
    expect(page.locator(".flash")).to_contain_text("Publishing cancelled")
    expect(page.locator("#post-live [data-pill]")).to_have_text("Draft")
    assert demo.job(publish_key(post_id)).status is JobStatus.CANCELLED


# -- automation ---------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("width", [375, 1280])
def test_automation_runs_a_webhook_call_over_http_and_shows_a_failed_sync(
    demo: Demo,
    open_as: Callable[..., Page],
    axe_violations: Callable[[Any], list[dict[str, Any]]],
    width: int,
    scheme: str,
) -> None:
    page = open_as(
        demo, "alice", "/automation/", viewport={"width": width, "height": 900},
        color_scheme=scheme,
    )  # fmt: skip
    expect(page.get_by_role("heading", name="Automation", level=1)).to_be_visible()
    expect(page.locator("#digest-state")).to_contain_text("Active")
    page.click("#digest-pause")
    expect(page.locator("#digest-state")).to_contain_text("Paused")
    page.click("#digest-resume")
    expect(page.locator("#digest-state")).to_contain_text("Active")

    # A real HTTP call: the job's POST reaches the served demo's own webhook.
    page.fill("#delay", "1")
    page.select_option("#answer", "200")
    page.click("#schedule-call")
    call = page.locator("#http-calls .row").first
    expect(call.locator("[data-pill]")).to_have_text("Waiting")
    assert demo.run_due(now=utcnow() + timedelta(seconds=2)).done == 1
    expect(call.locator("[data-pill]")).to_have_text("Done")  # the page polls while live
    expect(page.locator("#webhook-received")).to_contain_text("answered 200")

    page.click("#start-sync")
    sync = page.locator("#syncs .row").first
    for minutes in (0, 10, 20):
        assert demo.run_due(now=utcnow() + timedelta(minutes=minutes)).ran == 1
    expect(sync.locator("[data-pill]")).to_have_text("Failed")
    expect(sync).to_contain_text("attempt 3 of 3")
    expect(sync).to_contain_text("PartnerDown")
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"{overflow}px of horizontal scroll at {width}px"
    assert axe_violations(page) == []
    sync.get_by_role("link", name="History").click()
    history = page.locator("#defer-job-history").get_by_role("listitem")
    expect(history.last).to_contain_text("Failed")


# -- the language switch ------------------------------------------------------------------


@pytest.mark.parametrize("width", [375, 1280])
def test_the_language_switch_turns_the_toast_german_and_back(
    demo: Demo, open_as: Callable[..., Page], width: int
) -> None:
    page = open_as(demo, "alice", viewport={"width": width, "height": 800})
    switch = page.locator("#language-switch")
    expect(switch.get_by_role("button", name="English")).to_have_attribute("aria-pressed", "true")
    switch.get_by_role("button", name="Deutsch").click()
    expect(switch.get_by_role("button", name="Deutsch")).to_have_attribute("aria-pressed", "true")
    expect(page).to_have_url(demo.url + "/mail/")
    send(page, "Quarterly report")
    toast = toasts(page).last
    expect(toast.locator(".defer-toast__undo")).to_contain_text("Rückgängig")
    toast.locator(".defer-toast__undo").click()
    expect(page.locator('[data-defer-outcome="undone"]')).to_be_visible()
    # The settled toast sits over the footer's switch on a short page: dismiss it first.
    page.keyboard.press("Escape")
    expect(page.locator('[data-defer-outcome="undone"]')).to_have_count(0)
    switch.get_by_role("button", name="English").click()
    expect(switch.get_by_role("button", name="English")).to_have_attribute("aria-pressed", "true")
    send(page, "Team lunch")
    expect(toasts(page).last.locator(".defer-toast__undo")).to_contain_text("Undo")


# -- the screenshot for the README ------------------------------------------------------------


@pytest.mark.docs_screenshot
def test_screenshot_of_the_demo(
    serve: Callable[..., Demo],
    open_as: Callable[..., Page],
    artifacts: Path,
    docs_screenshot: Callable[[Path, str], Path | None],
) -> None:
    demo = serve(DEFER_EMBEDDED_WORKER=True)  # as `make demo` runs it
    page = open_as(
        demo,
        "alice",
        viewport={"width": 1200, "height": 940},
        device_scale_factor=2,
        color_scheme="light",
    )
    send(page, "Team lunch on Friday")
    demo.run_due(now=utcnow() + timedelta(seconds=10))
    page.reload()
    send(page, "Quarterly report")
    toast = toasts(page).last
    expect(toast.locator("[data-defer-count]")).to_have_text(re.compile(r"^[45]$"))
    sent = page.locator(".row", has_text="Team lunch").locator("[data-pill]")
    expect(sent).to_have_text("Sent")
    page.wait_for_timeout(300)  # let the toast's entry animation finish
    page.screenshot(path=str(artifacts / "demo.png"))
    assert (artifacts / "demo.png").stat().st_size > 20_000
    docs_screenshot(artifacts / "demo.png", "demo.png")  # the README's first picture
