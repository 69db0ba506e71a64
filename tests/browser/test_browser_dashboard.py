"""The operator dashboard in real headless Chromium, against a real server on 127.0.0.1.

The ops app (``tests/dashboard_app``) runs in a werkzeug server thread on SQLite; the
HTTP tests cover both backends. The operator signs in through Flask-Login, exactly as
the documented ``@defer.dashboard_auth`` example expects.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import BrowserContext, Locator, Page, expect
from playwright.sync_api import Error as PlaywrightError

from flask_defer import JobStatus
from flask_defer.engine.presence import Presence
from flask_defer.timeutil import utcnow

from ..dashboard_app import OpsApp, Seeded, create_app, seed

pytestmark = pytest.mark.browser


#: Each page test runs light and dark, at desktop and phone widths.
IN_EVERY_LAYOUT = pytest.mark.parametrize(
    ("scheme", "width"),
    [("light", 1280), ("dark", 1280), ("light", 375), ("dark", 375)],
    ids=["light-1280", "dark-1280", "light-375", "dark-375"],
)


@dataclass
class Live:
    """The running ops app, its seeded jobs and its base URL."""

    ops: OpsApp
    jobs: Seeded
    url: str


@pytest.fixture
def live(tmp_path: Path, live_server: Callable[[Any], str]) -> Iterator[Live]:
    ops = create_app(f"sqlite:///{tmp_path / 'ops.sqlite3'}", DEFER_DASHBOARD_REFRESH=1)
    jobs = seed(ops)
    try:
        yield Live(ops, jobs, live_server(ops.app))
    finally:
        ops.dispose()


@pytest.fixture
def operator_page(
    new_browser_context: Callable[..., BrowserContext], live: Live
) -> Callable[..., Page]:
    """Factory: a signed-in operator's page on the dashboard."""

    def open_page(**context_args: Any) -> Page:
        context_args.setdefault("viewport", {"width": 1280, "height": 900})
        page = new_browser_context(**context_args).new_page()
        page.goto(live.url + "/login/admin")  # redirects to the dashboard
        expect(page.locator("#defer-jobs")).to_be_visible()
        return page

    return open_page


def rows(page: Page) -> Any:
    return page.locator("#defer-jobs tbody tr")


def test_filter_open_a_failed_job_and_retry_it(
    live: Live, operator_page: Callable[..., Page]
) -> None:
    page = operator_page()
    (failed_id,) = live.jobs.failed
    total = sum(len(ids) for ids in vars(live.jobs).values())
    expect(rows(page)).to_have_count(total)
    page.evaluate("window.__notReloaded = true")

    # Filter: the list is swapped in place and the address bar follows.
    page.get_by_label("Status").select_option("failed")
    expect(rows(page)).to_have_count(1)
    expect(page).to_have_url(live.url + "/defer/?status=failed")
    row = page.locator(f"#defer-row-{failed_id}")
    expect(row).to_contain_text("sync_invoices")
    expect(row).to_contain_text("BillingUnavailable: billing API refused the connection")
    assert page.evaluate("window.__notReloaded === true")

    # Open the failed job: its traceback, attempts and payload.
    row.get_by_role("link", name="sync_invoices").click()
    expect(page).to_have_url(live.url + f"/defer/jobs/{failed_id}")
    error = page.get_by_label("Traceback of the last error")
    expect(error).to_contain_text("Traceback (most recent call last)")
    expect(error).to_contain_text("in _post_invoices")
    expect(page.locator(".defer-dl")).to_contain_text("3 of 3")
    expect(page.locator("pre.defer-code").first).to_contain_text('"account": 4711')

    # Retry it: it asks first (dismissed: nothing happens), then acts once accepted;
    # the answer arrives in place and the page refreshes its own state.
    page.evaluate("window.__notReloaded = true")
    asked: list[str] = []

    def answer(accept: bool) -> Callable[[Any], None]:
        def handle(dialog: Any) -> None:
            asked.append(dialog.message)
            dialog.accept() if accept else dialog.dismiss()

        return handle

    page.once("dialog", answer(False))
    page.get_by_role("button", name="Retry").click()
    expect(page.locator("#defer-job")).to_have_attribute("data-defer-status", "failed")
    page.wait_for_timeout(300)  # proving an absence: no request went out
    assert live.ops.job(failed_id).status is JobStatus.FAILED
    page.once("dialog", answer(True))
    page.get_by_role("button", name="Retry").click()
    expect(page.locator("#defer-outcome")).to_have_text(
        f"Job {failed_id} is pending again, due now, attempts reset."
    )
    expect(page.locator("#defer-job")).to_have_attribute("data-defer-status", "pending")
    expect(page.locator(".defer-dl")).to_contain_text("0 of 3")
    expect(page.get_by_role("button", name="Run now")).to_be_visible()
    assert page.evaluate("window.__notReloaded === true")
    job = live.ops.job(failed_id)
    assert job.status is JobStatus.PENDING and job.attempts == 0
    assert asked == [f"Retry job {failed_id} ({job.name})? It runs again now, attempts reset."] * 2

    # Back to the filtered list: the job has left the failed filter.
    page.get_by_role("link", name="← Jobs").click()
    expect(page).to_have_url(live.url + "/defer/?status=failed")
    expect(page.locator(".defer-empty")).to_have_text("No jobs match these filters.")


def test_the_list_refreshes_itself_without_a_reload(
    live: Live, operator_page: Callable[..., Page]
) -> None:
    page = operator_page()
    page.evaluate("window.__notReloaded = true")
    (running_id,) = live.jobs.running
    expect(page.locator(f"#defer-row-{running_id}")).to_have_attribute(
        "data-defer-status", "running"
    )
    # Another operator (the CLI here) cancels a scheduled job behind the page's back.
    scheduled_id = live.jobs.scheduled[0]
    with live.ops.context():
        assert live.ops.defer.cancel(scheduled_id)
    expect(page.locator(f"#defer-row-{scheduled_id}")).to_have_attribute(
        "data-defer-status", "cancelled", timeout=5000
    )
    assert page.evaluate("window.__notReloaded === true")


def test_a_refresh_leaves_the_keyboard_focus_where_the_operator_put_it(
    live: Live, operator_page: Callable[..., Page]
) -> None:
    """The list and a live job's page replace themselves every DEFER_DASHBOARD_REFRESH (a
    second here): the focused link's new copy takes the focus, so a keyboard user is not
    thrown back to the top of the page mid-table."""
    page = operator_page()

    def stays_focused_through_a_refresh(selector: str, then: str) -> None:
        element = page.locator(selector)
        element.focus()
        expect(element).to_be_focused()
        page.evaluate("document.activeElement.dataset.beforeRefresh = '1'")
        # The mark goes with the old element: its absence proves a refresh replaced it.
        expect(page.locator(f"{selector}:not([data-before-refresh])")).to_be_attached()
        expect(element).to_be_focused()
        page.keyboard.press("Tab")  # and the keyboard goes on from there
        expect(page.locator(then)).to_be_focused()

    (running_id,) = live.jobs.running
    stays_focused_through_a_refresh(
        f"#defer-row-{running_id}-name", f"#defer-row-{running_id}-history"
    )
    # The health cards are swapped in with the list (out of band).
    stays_focused_through_a_refresh("#defer-health-failed", "#defer-health-done")

    with live.ops.context():
        group = live.ops.defer.group(
            "send_email", [{"to": "a@example.com"}, {"to": "b@example.com"}], then="send_digest"
        )
        live.ops.db.session.commit()
    page.goto(f"{live.url}/defer/jobs/{group.id}")
    first, second = group.jobs[0].id, group.jobs[1].id
    stays_focused_through_a_refresh(
        f"#defer-related-parents-{first}", f"#defer-related-parents-{second}"
    )


def test_run_now_asks_first_and_acts_only_once_confirmed(
    live: Live, operator_page: Callable[..., Page]
) -> None:
    page = operator_page()
    job_id = live.jobs.scheduled[0]
    before = live.ops.job(job_id)
    row = page.locator(f"#defer-row-{job_id}")
    asked: list[str] = []

    def dismiss(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.dismiss()

    page.once("dialog", dismiss)
    row.get_by_role("button", name="Run now").click()
    page.wait_for_timeout(300)  # proving an absence: no request went out
    assert live.ops.job(job_id).run_at == before.run_at
    assert asked == [f"Run job {job_id} ({before.name}) now? A worker starts it at once."]
    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Run now").click()
    expect(page.locator("#defer-outcome")).to_have_text(
        f"Job {job_id} is due now; a worker will start it."
    )
    assert live.ops.job(job_id).run_at < before.run_at


def test_a_refused_action_says_what_really_happened(
    live: Live, operator_page: Callable[..., Page]
) -> None:
    page = operator_page()
    due_id = live.jobs.due[0]
    row = page.locator(f"#defer-row-{due_id}")
    # A worker claims the job between the page's render and the click.
    with live.ops.context():
        live.ops.defer.store.claim(
            now=live.ops.job(due_id).run_at,
            limit=10,
            token="worker-1",
            lease_until=live.ops.job(due_id).run_at.replace(year=2100),
        )
    asked: list[str] = []

    def accept(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.accept()

    page.once("dialog", accept)
    row.get_by_role("button", name="Cancel").click()
    expect(page.locator("#defer-outcome [data-defer-result]")).to_have_attribute(
        "data-defer-result", "refused"
    )
    expect(page.locator("#defer-outcome")).to_have_text(f"Job {due_id} is running; not cancelled.")
    assert live.ops.job(due_id).status is JobStatus.RUNNING
    assert asked == [f"Cancel job {due_id} (send_email)? It will not run."]


# -- the screenshot ------------------------------------------------------------------------


@pytest.mark.docs_screenshot
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_screenshot_of_the_dashboard(
    live: Live,
    operator_page: Callable[..., Page],
    artifacts: Path,
    docs_screenshot: Callable[[Path, str], Path | None],
    scheme: str,
) -> None:
    page = operator_page(
        color_scheme=scheme, device_scale_factor=2, viewport={"width": 1280, "height": 1040}
    )
    expect(rows(page)).to_have_count(sum(len(ids) for ids in vars(live.jobs).values()))
    suffix = "" if scheme == "light" else "-dark"
    page.screenshot(path=str(artifacts / f"dashboard{suffix}.png"), full_page=True)
    assert (artifacts / f"dashboard{suffix}.png").stat().st_size > 50_000
    docs_screenshot(artifacts / f"dashboard{suffix}.png", f"dashboard{suffix}.png")
    page.goto(f"{live.url}/defer/jobs/{live.jobs.failed[0]}")
    expect(page.get_by_label("Traceback of the last error")).to_be_visible()
    page.screenshot(path=str(artifacts / f"dashboard-job{suffix}.png"), full_page=True)


def test_schedules_page_pauses_and_resumes_a_schedule_in_place(
    live: Live, operator_page: Callable[..., Page], artifacts: Path
) -> None:
    page = operator_page()
    page.get_by_role("link", name="Schedules").click()
    row = page.locator("#defer-schedule-nightly-invoices")
    expect(row).to_have_attribute("data-defer-state", "active")
    expect(row).to_contain_text("0 3 1 1 * (Europe/Berlin)")
    row.get_by_role("button", name="Pause").click()
    expect(page.locator("#defer-outcome")).to_contain_text("Schedule nightly-invoices paused.")
    expect(row).to_have_attribute("data-defer-state", "paused")  # the table refreshed
    page.screenshot(path=str(artifacts / "schedules-paused.png"), full_page=True)
    with live.ops.context():
        assert live.ops.defer.list_recurring()[0].paused
    row.get_by_role("button", name="Resume").click()
    expect(row).to_have_attribute("data-defer-state", "active")
    with live.ops.context():
        assert not live.ops.defer.list_recurring()[0].paused


@pytest.mark.docs_screenshot
@IN_EVERY_LAYOUT
def test_queues_page_pauses_and_resumes_a_queue_from_the_keyboard(
    live: Live,
    operator_page: Callable[..., Page],
    axe_violations: Callable[[Any], list[dict[str, Any]]],
    artifacts: Path,
    docs_screenshot: Callable[[Path, str], Path | None],
    scheme: str,
    width: int,
) -> None:
    with live.ops.context():
        live.ops.defer.schedule("send_digest", {"week": 1})  # one job waits in "digests"
        live.ops.db.session.commit()
    page = operator_page(
        color_scheme=scheme, device_scale_factor=2, viewport={"width": width, "height": 900}
    )
    # Keyboard only: the nav link, then the row's button, each focused and pressed.
    page.get_by_role("link", name="Queues", exact=True).focus()
    page.keyboard.press("Enter")
    expect(page).to_have_url(live.url + "/defer/queues")
    # The URL changes before the deferred scripts run: a key pressed before htmx has
    # bound the form posts it the no-script way (a full reload, focus on the page).
    page.wait_for_load_state("load")
    row = page.locator("tr[data-defer-queue='digests']")
    expect(row).to_have_attribute("data-defer-state", "active")
    expect(row.locator("td.defer-num").nth(1)).to_have_text("1")  # due
    pause = page.get_by_role("button", name="Pause queue digests")
    box = pause.bounding_box()
    # The row's action is where the thumb is, not past the table's sideways scroll.
    assert box is not None and box["x"] + box["width"] <= width, box
    pause.focus()
    page.keyboard.press("Enter")
    expect(page.locator("#defer-outcome")).to_contain_text("Queue digests paused")
    expect(row).to_have_attribute("data-defer-state", "paused")  # the table refreshed
    resume = page.get_by_role("button", name="Resume queue digests")
    expect(resume).to_be_focused()  # the swap kept the operator's place
    expect(row).to_contain_text("by admin")
    with live.ops.context():
        assert [p.label for p in live.ops.defer.paused()] == ["queue:digests"]

    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"{overflow}px of horizontal scroll at {width}px"
    assert axe_violations(page) == []
    suffix = ("-dark" if scheme == "dark" else "") + ("-375" if width == 375 else "")
    shot = artifacts / f"queues{suffix}.png"
    page.screenshot(path=str(shot), full_page=True)
    if width == 1280 and scheme == "light":
        docs_screenshot(shot, "queues.png")  # docs/dashboard.md shows it

    page.keyboard.press("Enter")
    expect(page.locator("#defer-outcome")).to_contain_text("Queue digests resumed")
    expect(row).to_have_attribute("data-defer-state", "active")
    expect(page.get_by_role("button", name="Pause queue digests")).to_be_focused()
    with live.ops.context():
        assert live.ops.defer.paused() == []


# -- the job's history timeline ------------------------------------------------------------


def screenshot_of_a_refreshing(element: Locator, path: Path, attempts: int = 5) -> None:
    """Screenshot *element* of a page that swaps it for a fresh copy every second.

    Playwright waits for the element to be stable before it shoots; on a loaded machine
    that wait can outlast the next refresh, which detaches the element it waited for
    ("Element is not attached to the DOM", or "Node is either not visible or not an
    HTMLElement" when the swap lands while Playwright scrolls the old copy into view). The
    refreshed copy is shot instead.
    """
    swapped = ("not attached to the DOM", "Node is either not visible or not an HTMLElement")
    for attempt in range(attempts):
        try:
            element.screenshot(path=str(path))
            return
        except PlaywrightError as error:
            if not any(sign in str(error) for sign in swapped) or attempt == attempts - 1:
                raise


@pytest.mark.docs_screenshot
@IN_EVERY_LAYOUT
def test_the_job_history_timeline(
    live: Live,
    operator_page: Callable[..., Page],
    axe_violations: Callable[[Any], list[dict[str, Any]]],
    artifacts: Path,
    docs_screenshot: Callable[[Path, str], Path | None],
    scheme: str,
    width: int,
) -> None:
    page = operator_page(
        color_scheme=scheme, device_scale_factor=2, viewport={"width": width, "height": 900}
    )
    (failed_id,) = live.jobs.failed
    # From the list, the row's History link opens the job page at its timeline.
    page.goto(f"{live.url}/defer/?name=sync_invoices")
    page.get_by_role("link", name=f"History of job {failed_id}").click()
    expect(page).to_have_url(f"{live.url}/defer/jobs/{failed_id}#defer-job-history")
    timeline = page.locator("#defer-job-history")
    items = timeline.get_by_role("listitem")
    expect(items).to_have_count(7)
    expect(items.nth(0)).to_contain_text("Scheduled")
    expect(items.nth(2)).to_contain_text("Attempt failed; will retry")
    expect(items.nth(2)).to_contain_text("attempt 1")
    expect(items.nth(6)).to_contain_text("Failed")

    # An attempt's full traceback opens from its summary, with the keyboard too.
    first_error = items.nth(2).locator("summary")
    first_error.focus()
    page.keyboard.press("Enter")
    expect(items.nth(2).locator("pre.defer-traceback")).to_be_visible()
    expect(items.nth(2).locator("pre.defer-traceback")).to_contain_text("in _post_invoices")

    # The operator retries it (and confirms): the timeline grows in place with who did it.
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Retry").click()
    expect(items).to_have_count(8)
    expect(items.nth(7)).to_contain_text("Retried by an operator")
    expect(items.nth(7)).to_contain_text("admin")

    # The job is live again, so its page refreshes every second, but not while the
    # operator reads the opened traceback: the swap would close it. Closed, it resumes.
    opened = items.nth(2).locator("details")
    opened.locator("summary").click()
    expect(opened).to_have_attribute("open", "")
    page.wait_for_timeout(2500)  # proving an absence: two refresh periods pass
    expect(opened).to_have_attribute("open", "")
    with page.expect_request(lambda r: r.url.endswith(f"/defer/jobs/{failed_id}"), timeout=5000):
        opened.locator("summary").click()

    # Nothing spills sideways at phone width; the page passes axe.
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    wide = page.evaluate(
        """() => [...document.querySelectorAll('body *')]
            .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
            .slice(0, 8).map(e => e.tagName + '.' + e.className + ' ' +
                Math.round(e.getBoundingClientRect().right))"""
    )
    assert overflow <= 0, f"{overflow}px of horizontal scroll at {width}px: {wide}"
    assert axe_violations(page) == []

    # The screenshot scrolls the timeline into view itself, retrying when a refresh
    # swapped it meanwhile (a separate scroll first raced that swap and failed).
    name = "job-history" + ("-dark" if scheme == "dark" else "") + ("-375" if width == 375 else "")
    shot = artifacts / f"{name}.png"
    screenshot_of_a_refreshing(timeline, shot)
    assert shot.stat().st_size > 20_000
    if width == 1280:
        docs_screenshot(shot, f"{name}.png")  # docs/history.md shows the desktop timeline


# -- workflows: a group's pages, and aborting a running job ----------------------------------


@IN_EVERY_LAYOUT
def test_a_groups_pages_link_members_and_callback_and_abort_works_from_the_keyboard(
    live: Live,
    operator_page: Callable[..., Page],
    axe_violations: Callable[[Any], list[dict[str, Any]]],
    artifacts: Path,
    scheme: str,
    width: int,
) -> None:
    with live.ops.context():
        group = live.ops.defer.group(
            "send_email", [{"to": f"reader{n}@example.com"} for n in range(3)],
            then="send_digest", then_payload={"week": 9},
        )  # fmt: skip
        live.ops.db.session.commit()
    page = operator_page(
        color_scheme=scheme, device_scale_factor=2, viewport={"width": width, "height": 900}
    )
    page.goto(f"{live.url}/defer/jobs/{group.id}")
    page.wait_for_load_state("load")
    workflow = page.locator(".defer-job__workflow")
    expect(workflow.locator("[data-defer-related=parents] li")).to_have_count(3)
    expect(page.locator("[data-defer-waiting]")).to_contain_text("3 jobs to settle")
    expect(page.locator("[data-defer-waiting-tag]")).to_be_visible()  # not "due"
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"{overflow}px of horizontal scroll at {width}px"
    assert axe_violations(page) == []
    suffix = ("-dark" if scheme == "dark" else "") + ("-375" if width == 375 else "")
    page.screenshot(path=str(artifacts / f"group{suffix}.png"), full_page=True)

    # Keyboard only: from the callback to its first member, then back up the link.
    first = group.jobs[0].id
    link = workflow.get_by_role("link", name=f"#{first} send_email")
    link.focus()
    expect(link).to_be_focused()  # so a miss below is the link's, not a lost focus
    page.keyboard.press("Enter")
    expect(page).to_have_url(f"{live.url}/defer/jobs/{first}")
    expect(page.locator("[data-defer-related=children]")).to_contain_text(f"#{group.id}")

    # A running job's Abort button: confirmed, then "abort requested" in place.
    (running_id,) = live.jobs.running
    page.goto(f"{live.url}/defer/jobs/{running_id}")
    page.wait_for_load_state("load")
    page.once("dialog", lambda dialog: dialog.accept())
    abort_button = page.get_by_role("button", name="Abort")
    abort_button.focus()
    page.keyboard.press("Enter")
    expect(page.locator("#defer-outcome")).to_contain_text(f"Abort of job {running_id} requested")
    expect(page.locator("[data-defer-abort-requested]")).to_be_visible()
    assert axe_violations(page) == []
    page.screenshot(path=str(artifacts / f"abort-requested{suffix}.png"), full_page=True)


@IN_EVERY_LAYOUT
@pytest.mark.docs_screenshot
def test_the_workers_page_from_the_keyboard(
    live: Live,
    operator_page: Callable[..., Page],
    axe_violations: Callable[[Any], list[dict[str, Any]]],
    artifacts: Path,
    docs_screenshot: Callable[[Path, str], Path | None],
    scheme: str,
    width: int,
) -> None:
    with live.ops.context():
        store = live.ops.defer.store
        busy = Presence(store, kind="worker", queues=["mail", "default"], concurrency=8,
                        heartbeat_seconds=30)  # fmt: skip
        busy.arrive(utcnow())
        busy.beat(utcnow(), live.jobs.running)
        gone = Presence(store, kind="worker", queues=None, concurrency=4, heartbeat_seconds=1)
        gone.arrive(utcnow() - timedelta(minutes=3))  # killed three minutes ago
    page = operator_page(
        color_scheme=scheme, device_scale_factor=2, viewport={"width": width, "height": 900}
    )
    page.get_by_role("link", name="Workers", exact=True).focus()
    page.keyboard.press("Enter")
    expect(page).to_have_url(live.url + "/defer/workers")
    page.wait_for_load_state("load")
    expect(page.locator("tr[data-defer-state=live]")).to_have_count(1)
    expect(page.locator("tr[data-defer-state=stale]")).to_have_count(1)
    (running_id,) = live.jobs.running
    link = page.get_by_role("link", name=f"#{running_id}")
    link.focus()
    page.keyboard.press("Enter")
    expect(page).to_have_url(f"{live.url}/defer/jobs/{running_id}")
    page.go_back()
    page.wait_for_load_state("load")
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"{overflow}px of horizontal scroll at {width}px"
    assert axe_violations(page) == []
    suffix = ("-dark" if scheme == "dark" else "") + ("-375" if width == 375 else "")
    shot = artifacts / f"workers{suffix}.png"
    page.screenshot(path=str(shot), full_page=True)
    if width == 1280 and scheme == "light":
        docs_screenshot(shot, "workers.png")  # docs/dashboard.md shows it


@IN_EVERY_LAYOUT
@pytest.mark.docs_screenshot
def test_the_activity_page_charts_and_their_table_from_the_keyboard(
    live: Live,
    operator_page: Callable[..., Page],
    axe_violations: Callable[[Any], list[dict[str, Any]]],
    artifacts: Path,
    docs_screenshot: Callable[[Path, str], Path | None],
    scheme: str,
    width: int,
) -> None:
    page = operator_page(
        color_scheme=scheme, device_scale_factor=2, viewport={"width": width, "height": 900}
    )
    page.get_by_role("link", name="Activity", exact=True).focus()
    page.keyboard.press("Enter")
    expect(page).to_have_url(live.url + "/defer/activity")
    page.wait_for_load_state("load")
    minute = page.locator("[data-defer-chart=minute]")
    expect(minute.locator("svg")).to_be_visible()
    # The seeded runs (done, retried, failed) are drawn in the last week's chart.
    expect(page.locator("[data-defer-chart=hour] rect")).not_to_have_count(0)
    summary = page.locator("details.defer-chart__figures summary").last
    summary.focus()
    page.keyboard.press("Enter")
    figures = page.locator("details.defer-chart__figures").last
    expect(figures.locator("tbody tr")).not_to_have_count(0)
    suffix = ("-dark" if scheme == "dark" else "") + ("-375" if width == 375 else "")
    shot = artifacts / f"activity{suffix}.png"
    page.screenshot(path=str(shot), full_page=True)  # every queue and name, figures open
    if width == 1280 and scheme == "light":
        docs_screenshot(shot, "activity.png")  # docs/dashboard.md shows it
    # Filter by a job name with the keyboard only.
    page.locator("select[name=name]").focus()
    page.keyboard.press("ArrowDown")
    page.get_by_role("button", name="Show").focus()
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"/defer/activity\?queue=&name=\w+"))
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"{overflow}px of horizontal scroll at {width}px"
    assert axe_violations(page) == []
    page.screenshot(path=str(artifacts / f"activity-filtered{suffix}.png"), full_page=True)


@pytest.mark.docs_screenshot
@IN_EVERY_LAYOUT
def test_the_job_page_says_why_a_pending_job_has_not_started(
    live: Live,
    operator_page: Callable[..., Page],
    axe_violations: Callable[[Any], list[dict[str, Any]]],
    artifacts: Path,
    docs_screenshot: Callable[[Path, str], Path | None],
    scheme: str,
    width: int,
) -> None:
    waiting = live.jobs.scheduled[0]  # due later, on a queue no live worker serves
    page = operator_page(
        color_scheme=scheme, device_scale_factor=2, viewport={"width": width, "height": 900}
    )
    page.goto(f"{live.url}/defer/jobs/{waiting}")
    page.wait_for_load_state("load")
    reasons = page.get_by_role("region", name="Why it has not started")
    expect(reasons).to_be_visible()
    expect(reasons.locator("[data-defer-reason=not_due]")).to_have_count(1)
    with live.ops.context():
        codes = [reason.code for reason in live.ops.defer.explain(waiting)]
    shown = reasons.locator("[data-defer-reason]").evaluate_all(
        "items => items.map(item => item.dataset.deferReason)"
    )
    assert shown == codes  # the page says what defer.explain() says, in its order
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"{overflow}px of horizontal scroll at {width}px"
    assert axe_violations(page) == []
    suffix = ("-dark" if scheme == "dark" else "") + ("-375" if width == 375 else "")
    shot = artifacts / f"why-waiting{suffix}.png"
    # A clip of the page at the panel's box, measured in one script run: the page's
    # timed refresh swaps the panel for a fresh copy (same place, same text), and an
    # element screenshot or bounding_box() that caught the swap found no element (seen
    # twice on a slow machine). Inside one script run the swap cannot happen halfway.
    box = page.evaluate(
        """() => {
            const r = document.querySelector('.defer-job__reasons').getBoundingClientRect();
            return {x: r.x, y: r.y, width: r.width, height: r.height};
        }"""
    )
    assert box["width"] > 0 and box["height"] > 0
    page.screenshot(path=str(shot), clip=box)
    if width == 1280 and scheme == "light":
        docs_screenshot(shot, "why-waiting.png")  # docs/dashboard.md shows it
