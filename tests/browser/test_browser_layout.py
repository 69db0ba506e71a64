"""Every demo and blueprint page on a phone and a desktop, light and dark, in Chromium.

A sweep, not a story: at 375×740 (a phone: ``is_mobile``, touch) and 1280×800, in
both colour schemes, each page must fit its viewport (no sideways scrolling: a phone
browser would zoom out and draw the fixed toast off screen), keep the live Undo toast
on screen and tappable, and pass axe-core with no serious or critical violation.

The demo serves the people's pages; the ops app of ``tests/dashboard_app`` serves the
dashboard, with a failed job's traceback and an HTTP job whose result is one very long
line, the two contents that used to widen the job page. The dashboard is swept once more
in German, whose long words ("Schlüsselpräfix", "Fehlgeschlagen") are what a narrow card
or button would let spill.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from demo_app.models import Notification, Post, db
from flask_defer import JobStatus

from ..dashboard_app import Seeded, create_app, seed
from ..demo_helpers import dispose, make_demo

pytestmark = [pytest.mark.browser, pytest.mark.long]

PHONE = {"viewport": {"width": 375, "height": 740}, "is_mobile": True, "has_touch": True}
DESKTOP = {"viewport": {"width": 1280, "height": 800}}
LAYOUTS = {"phone": PHONE, "desktop": DESKTOP}

#: A subject with no place to break: it must ellipsise, not widen the outbox.
LONG_SUBJECT = "Quarterly-report-for-the-whole-regional-sales-team-with-every-attachment-" * 2


def long_line_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    """A tiny HTTP endpoint answering one very long line (an HTTP job's result)."""
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"token=" + b"x" * 5000]


@dataclass
class Site:
    """Both apps being served, and the pages of each to sweep."""

    demo_url: str
    ops_url: str
    post_id: int
    jobs: Seeded
    http_job: int


@pytest.fixture
def site(tmp_path: Path, live_server: Callable[[Any], str]) -> Iterator[Site]:
    demo = make_demo(
        f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        tmp_path / "instance",
        DEMO_MAIL_UNDO_WINDOW=timedelta(minutes=10),  # the toast stays for the sweep
    )
    # Flask-Babel on: an English browser reads English, a German one the German dashboard.
    ops = create_app(
        f"sqlite:///{tmp_path / 'ops.sqlite3'}",
        babel=True,
        DEFER_HTTP_ALLOWED_NETWORKS=["127.0.0.1/32"],  # the long-line endpoint is local
    )
    try:
        jobs = seed(ops)
        target = live_server(long_line_app)
        with ops.context():
            http = ops.defer.schedule_http(target + "/hook", method="GET")
            ops.db.session.commit()
            ops.defer.run_due(now=datetime.now(UTC) + timedelta(seconds=1))
            assert ops.defer.get(http.id).status is JobStatus.DONE  # type: ignore[union-attr]
        with demo.app_context():
            post_id = db.session.scalars(db.select(Post.id)).first()
            # Unread notifications: the nav's Notifications link carries a badge.
            db.session.add_all(Notification(user="alice", text=f"News {n}") for n in range(12))
            db.session.commit()
        assert post_id is not None
        yield Site(live_server(demo), live_server(ops.app), post_id, jobs, http.id)
    finally:
        dispose(demo)
        ops.dispose()


def demo_paths(site: Site) -> list[str]:
    return [
        "/mail/",
        "/projects/",
        "/posts/",
        f"/posts/{site.post_id}",
        "/notifications/",
        "/automation/",
        "/defer/pending",
    ]


def dashboard_paths(site: Site) -> list[str]:
    jobs = site.jobs
    return [
        "/defer/",
        "/defer/?status=failed",
        f"/defer/jobs/{jobs.failed[0]}",  # a traceback
        f"/defer/jobs/{site.http_job}",  # a 5,000-character result line
        f"/defer/jobs/{jobs.scheduled[0]}",  # the reschedule form
        f"/defer/jobs/{jobs.cancelled[1]}",
        f"/defer/jobs/{jobs.scheduled[0]}/cancel",  # the no-JavaScript confirm step
        "/defer/jobs/cancel?name=publish_post",
        "/defer/queues",
    ]


def overflow(page: Page) -> dict[str, int]:
    return dict(
        page.evaluate(
            "({scroll: document.documentElement.scrollWidth, inner: innerWidth,"
            " height: innerHeight})"
        )
    )


def assert_fits(page: Page, width: int, where: str) -> None:
    """No sideways scrolling; a phone has not zoomed out to fit something too wide."""
    sizes = overflow(page)
    assert sizes["scroll"] <= sizes["inner"], f"{where}: {sizes['scroll']} px wide, {sizes}"
    assert sizes["inner"] == width, f"{where}: the page was zoomed out to {sizes['inner']} px"


def assert_toast_on_screen_and_tappable(page: Page, where: str) -> None:
    """The newest live toast's Undo button lies in the viewport and is what a tap hits."""
    live = page.locator(".defer-toast[data-defer-state='open']").last
    undo = live.get_by_role("button", name="Undo")
    expect(undo).to_be_visible()
    hit = page.evaluate(
        """(button) => {
            const r = button.getBoundingClientRect();
            const x = r.left + r.width / 2, y = r.top + r.height / 2;
            const hit = document.elementFromPoint(x, y);
            return {
                inside: r.left >= 0 && r.top >= 0 && r.right <= innerWidth
                    && r.bottom <= innerHeight,
                rect: [r.left, r.top, r.right, r.bottom],
                viewport: [innerWidth, innerHeight],
                hits: hit !== null && button.contains(hit),
                hit: hit ? hit.tagName + "#" + hit.id + "." + hit.className : null,
            };
        }""",
        undo.element_handle(),
    )
    assert hit["inside"], f"{where}: the Undo button is off screen: {hit}"
    assert hit["hits"], f"{where}: a tap on Undo lands on {hit['hit']}"


def assert_accessible(
    page: Page, axe_violations: Callable[[Any], list[dict[str, Any]]], where: str
) -> None:
    found = axe_violations(page)
    summary = [(v["id"], v["impact"], [n["target"] for n in v["nodes"]][:3]) for v in found]
    assert not found, f"{where}: axe-core found {summary}"


@pytest.fixture(params=["light", "dark"])
def scheme(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.docs_screenshot
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_demo_pages_fit_keep_the_toast_tappable_and_pass_axe(
    site: Site,
    new_browser_context: Callable[..., BrowserContext],
    axe_violations: Callable[[Any], list[dict[str, Any]]],
    artifacts: Path,
    docs_screenshot: Callable[[Path, str], Path | None],
    layout: str,
    scheme: str,
) -> None:
    options = LAYOUTS[layout]
    width = options["viewport"]["width"]  # type: ignore[index]
    page = new_browser_context(**options, color_scheme=scheme).new_page()
    page.goto(site.demo_url + "/mail/")
    assert_fits(page, width, "sign-in")
    assert_accessible(page, axe_violations, "sign-in")
    page.click("#sign-in-alice")
    page.fill("#subject", LONG_SUBJECT)
    page.click("#send")
    expect(page.locator(".defer-toast[data-defer-state='open']")).to_have_count(1)
    for path in demo_paths(site):
        where = f"{path} at {layout}, {scheme}"
        page.goto(site.demo_url + path)
        expect(page.locator(".defer-toast[data-defer-state='open']")).to_have_count(1)
        page.wait_for_timeout(250)  # the toast's entry animation
        assert_fits(page, width, where)
        assert_toast_on_screen_and_tappable(page, where)
        assert_accessible(page, axe_violations, where)
    if layout == "phone":
        # The README's phone pictures: the mail page with its open toast.
        page.goto(site.demo_url + "/mail/")
        expect(page.locator(".defer-toast[data-defer-state='open']")).to_have_count(1)
        page.wait_for_timeout(250)
        name = "phone-demo" + ("-dark" if scheme == "dark" else "") + ".png"
        page.screenshot(path=str(artifacts / name))
        docs_screenshot(artifacts / name, name)


def test_the_desktop_toast_leaves_the_newest_outbox_row_uncovered(
    site: Site, new_browser_context: Callable[..., BrowserContext]
) -> None:
    page = new_browser_context(**DESKTOP).new_page()
    page.goto(site.demo_url + "/mail/")
    page.click("#sign-in-alice")
    for subject in ("First", "Second", "Third"):
        page.fill("#subject", subject)
        page.click("#send")
        expect(page.locator("#outbox .row", has_text=subject)).to_have_count(1)
    newest = page.locator("#outbox .row").first.bounding_box()
    assert newest is not None
    for toast in page.locator(".defer-toast[data-defer-state='open']").all():
        box = toast.bounding_box()
        assert box is not None
        apart = (
            box["x"] >= newest["x"] + newest["width"]
            or box["x"] + box["width"] <= newest["x"]
            or box["y"] >= newest["y"] + newest["height"]
            or box["y"] + box["height"] <= newest["y"]
        )
        assert apart, f"a toast {box} covers the newest outbox row {newest}"


@pytest.mark.docs_screenshot
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_dashboard_pages_fit_and_pass_axe(
    site: Site,
    new_browser_context: Callable[..., BrowserContext],
    axe_violations: Callable[[Any], list[dict[str, Any]]],
    artifacts: Path,
    docs_screenshot: Callable[[Path, str], Path | None],
    layout: str,
    scheme: str,
) -> None:
    options = LAYOUTS[layout]
    width = options["viewport"]["width"]  # type: ignore[index]
    page = new_browser_context(**options, color_scheme=scheme).new_page()
    page.goto(site.ops_url + "/login/admin")
    for path in dashboard_paths(site):
        where = f"{path} at {layout}, {scheme}"
        page.goto(site.ops_url + path)
        page.wait_for_load_state("networkidle")
        assert_fits(page, width, where)
        assert_accessible(page, axe_violations, where)
    if layout == "phone":
        page.goto(site.ops_url + "/defer/")  # the README's phone pictures of the dashboard
        page.wait_for_load_state("networkidle")
        name = "phone-dashboard" + ("-dark" if scheme == "dark" else "") + ".png"
        page.screenshot(path=str(artifacts / name), full_page=True)
        docs_screenshot(artifacts / name, name)


def test_the_phone_nav_keeps_its_badge_on_one_line_and_shows_more_links_lie_beyond(
    site: Site, new_browser_context: Callable[..., BrowserContext]
) -> None:
    page = new_browser_context(**PHONE).new_page()
    page.goto(site.demo_url + "/mail/")
    page.click("#sign-in-alice")
    nav = page.get_by_role("navigation", name="Main")
    badge = nav.locator(".badge")
    expect(badge).to_have_text("12")
    link = nav.get_by_role("link", name="Notifications")
    mail = nav.get_by_role("link", name="Mail")
    link_box, mail_box, badge_box = link.bounding_box(), mail.bounding_box(), badge.bounding_box()
    assert link_box and mail_box and badge_box
    # One line: the link is as tall as its neighbours and the badge sits inside it.
    assert abs(link_box["height"] - mail_box["height"]) < 2, (link_box, mail_box)
    assert link_box["y"] <= badge_box["y"] and badge_box["y"] + badge_box["height"] <= (
        link_box["y"] + link_box["height"]
    )
    # More links lie to the right: a fade says so until the nav is scrolled to its end.
    expect(nav).to_have_attribute("data-more", "")
    nav.evaluate("nav => nav.scrollTo({left: nav.scrollWidth})")
    expect(nav).not_to_have_attribute("data-more", "")
    expect(nav.get_by_role("link", name="Dashboard")).to_be_in_viewport()


#: The dashboard's own words in boxes (figures, headers, badges, buttons, labels): with a
#: long German word, any of them could push its text past its edge.
WORDED_BOXES = (
    ".defer-card__label, .defer-card__foot, .defer-card__value, .defer-badge, th, dt, "
    ".defer-btn, .defer-field > span, .defer-dash__title, .defer-jobs__title, "
    ".defer-pages__at, .defer-alert, .defer-note"
)


def assert_no_text_spills(page: Page, where: str) -> None:
    """No worded box's text is wider than the box (cut off, or drawn over its neighbour)."""
    spilled = page.evaluate(
        """(selector) => [...document.querySelectorAll(selector)]
            .filter(e => e.getClientRects().length && e.scrollWidth > e.clientWidth + 1)
            .map(e => e.tagName + "." + e.className + " " + JSON.stringify(
                e.textContent.trim().slice(0, 40)) + " " + e.scrollWidth + ">" + e.clientWidth)""",
        WORDED_BOXES,
    )
    assert spilled == [], f"{where}: text spills out of {spilled}"


def assert_links_in_view(page: Page, where: str) -> None:
    """Every link of the dashboard's header rows lies in the viewport (they wrap)."""
    outside = page.evaluate(
        """() => [...document.querySelectorAll(
                '.defer-dash__header a, .defer-back a, .defer-dash__meta a')]
            .filter(a => a.getClientRects().length)
            .filter(a => { const r = a.getBoundingClientRect();
                           return r.left < 0 || r.right > innerWidth; })
            .map(a => a.textContent.trim())"""
    )
    assert outside == [], f"{where}: links off screen: {outside}"


def assert_scrolling_panels_hint_at_more(page: Page, where: str) -> None:
    """A panel whose table scrolls sideways draws an edge shadow that says so."""
    silent = page.evaluate(
        """() => [...document.querySelectorAll('.defer-panel')]
            .filter(p => p.scrollWidth > p.clientWidth + 1)
            .filter(p => !getComputedStyle(p).backgroundImage.includes('radial-gradient'))
            .map(p => p.className + ' ' + p.scrollWidth + '>' + p.clientWidth)"""
    )
    assert silent == [], f"{where}: these panels scroll sideways without a hint: {silent}"


def assert_panel_titles_whole(page: Page, where: str) -> None:
    """The by-name table's title ("Nach Aufgabenname größter Rückstand zuerst") is
    shown whole at rest, not cut off at its panel's edge."""
    cut = page.evaluate(
        """(text) => [...document.querySelectorAll('.defer-panel *')]
            .filter(e => e.children.length === 0 && e.textContent.trim() === text)
            .filter(e => e.getBoundingClientRect().right >
                         e.closest('.defer-panel').getBoundingClientRect().right + 0.5)
            .map(e => e.tagName)""",
        "größter Rückstand zuerst",
    )
    assert cut == [], f"{where}: the by-name title is cut off: {cut}"


@pytest.mark.docs_screenshot
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_german_dashboard_fits_its_long_words_and_passes_axe(
    site: Site,
    new_browser_context: Callable[..., BrowserContext],
    axe_violations: Callable[[Any], list[dict[str, Any]]],
    artifacts: Path,
    docs_screenshot: Callable[[Path, str], Path | None],
    layout: str,
    scheme: str,
) -> None:
    options = LAYOUTS[layout]
    width = options["viewport"]["width"]  # type: ignore[index]
    page = new_browser_context(
        **options, color_scheme=scheme, locale="de-DE", device_scale_factor=2
    ).new_page()
    page.goto(site.ops_url + "/login/admin")
    for path in [*dashboard_paths(site), "/defer/schedules"]:
        where = f"{path} in German at {layout}, {scheme}"
        page.goto(site.ops_url + path)
        page.wait_for_load_state("networkidle")
        expect(page.locator("html")).to_have_attribute("lang", "de")
        assert_fits(page, width, where)
        assert_no_text_spills(page, where)
        assert_links_in_view(page, where)
        assert_scrolling_panels_hint_at_more(page, where)
        if path == "/defer/":
            assert_panel_titles_whole(page, where)
        if layout == "desktop":
            # A desktop has room for every column: no table scrolls inside its panel.
            scrolled = page.evaluate(
                """() => [...document.querySelectorAll('.defer-panel')]
                    .filter(p => p.scrollWidth > p.clientWidth + 1)
                    .map(p => p.className + ' ' + p.scrollWidth + '>' + p.clientWidth)"""
            )
            assert scrolled == [], f"{where}: a table scrolls sideways: {scrolled}"
        assert_accessible(page, axe_violations, where)
    page.goto(site.ops_url + "/defer/")
    expect(page.get_by_role("heading", name="Aufgaben", exact=True)).to_be_visible()
    shot = artifacts / f"dashboard-de-{layout}-{scheme}.png"
    page.screenshot(path=str(shot), full_page=True)
    if layout == "desktop" and scheme == "light":
        docs_screenshot(shot, "dashboard-de.png")  # the README's German dashboard
