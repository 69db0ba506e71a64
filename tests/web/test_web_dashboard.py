"""The operator dashboard over HTTP, on SQLite and PostgreSQL.

A real app (``tests/dashboard_app``: Flask-Login, the documented auth hook) driven by
Flask's test client: access, every action with and without htmx, refusals from the
wrong state, CSRF, and hostile input to every endpoint.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from flask.testing import FlaskClient

from flask_defer import JobStatus

from ..dashboard_app import OpsApp, Seeded, create_app, seed

HTMX = {"HX-Request": "true"}


@pytest.fixture
def make_ops(database_url: str) -> Iterator[Callable[..., OpsApp]]:
    """Factory for the ops app on the backend under test."""
    made: list[OpsApp] = []

    def make(**options: Any) -> OpsApp:
        ops = create_app(database_url, TESTING=True, **options)
        made.append(ops)
        return ops

    yield make
    for ops in made:
        ops.dispose()


@pytest.fixture
def ops(make_ops: Callable[..., OpsApp]) -> OpsApp:
    return make_ops()


@pytest.fixture
def jobs(ops: OpsApp) -> Seeded:
    return seed(ops)


def signed_in(ops: OpsApp, user: str = "admin") -> FlaskClient:
    client = ops.app.test_client()
    client.get(f"/login/{user}")
    return client


def token_of(client: FlaskClient, path: str = "/defer/") -> str:
    html = client.get(path).get_data(as_text=True)
    # A form's field, or the token htmx sends with every action of the page.
    found = re.search(r'name="csrf_token" value="([^"]+)"', html) or re.search(
        r'"X-CSRFToken": "([^"]+)"', html
    )
    assert found, "no CSRF token on the page"
    return found.group(1)


def act(
    client: FlaskClient, path: str, *, htmx: bool, token: str | None = None, **form: str
) -> Any:
    """POST an action as htmx would (header token) or as a plain form (field token)."""
    token = token if token is not None else token_of(client)
    if htmx:
        return client.post(path, data=form, headers={**HTMX, "X-CSRFToken": token})
    return client.post(path, data={"csrf_token": token, **form})


def outcome_text(html: str) -> str:
    found = re.search(r'data-defer-result="(\w+)">.*?<span>(.*?)</span>', html, re.S)
    assert found, html
    return f"{found.group(1)}: {found.group(2)}"


def follow_flash(client: FlaskClient, response: Any) -> str:
    """The outcome a plain-form action flashed, read from the page it redirected to."""
    assert response.status_code == 303
    return outcome_text(client.get(response.headers["Location"]).get_data(as_text=True))


def answer(client: FlaskClient, response: Any, *, htmx: bool) -> str:
    """What the operator is told, either way."""
    if htmx:
        assert response.status_code == 200
        assert response.headers["HX-Trigger"] == "defer-jobs-changed"
        return outcome_text(response.get_data(as_text=True))
    return follow_flash(client, response)


# -- access -------------------------------------------------------------------------------

ACTION_PATHS = [
    "/defer/jobs/{id}/cancel",
    "/defer/jobs/{id}/run-now",
    "/defer/jobs/{id}/reschedule",
    "/defer/jobs/{id}/retry",
    "/defer/jobs/cancel",
    "/defer/jobs/retry",
]


def test_without_an_auth_hook_the_dashboard_is_closed(make_ops: Callable[..., OpsApp]) -> None:
    ops = make_ops(auth=False, DEFER_METRICS=True)
    client = signed_in(ops)
    assert client.get("/defer/").status_code == 403
    assert client.get("/defer/jobs/1").status_code == 403
    assert client.get("/defer/metrics").status_code == 403
    for path in ACTION_PATHS:
        assert client.post(path.format(id=1), headers=HTMX).status_code == 403


def test_the_hook_decides_who_gets_in(ops: OpsApp) -> None:
    assert ops.app.test_client().get("/defer/").status_code == 403  # anonymous
    assert signed_in(ops, "alice").get("/defer/").status_code == 403
    response = signed_in(ops, "admin").get("/defer/")
    assert response.status_code == 200
    assert response.headers["Cache-Control"] == "no-store"


def test_debug_mode_opens_the_dashboard_without_a_hook(make_ops: Callable[..., OpsApp]) -> None:
    ops = make_ops(auth=False)
    ops.app.debug = True
    assert ops.app.test_client().get("/defer/").status_code == 200


@pytest.mark.parametrize("path", ACTION_PATHS)
def test_actions_without_authorisation_are_refused_and_change_nothing(
    ops: OpsApp, jobs: Seeded, path: str
) -> None:
    target = jobs.scheduled[0] if "retry" not in path else jobs.failed[0]
    admin = signed_in(ops)
    token = token_of(admin)
    for client in (ops.app.test_client(), signed_in(ops, "alice")):
        with client.session_transaction() as session:
            session["_defer_csrf"] = token  # a valid token does not replace authorisation
        for htmx in (True, False):
            # A bulk action's filter matches the target, so a refusal is what keeps it.
            name = "sync_invoices" if "retry" in path else "publish_post"
            response = act(client, path.format(id=target), htmx=htmx, token=token, name=name)
            assert response.status_code == 403
    assert ops.job(target).status is (JobStatus.FAILED if "retry" in path else JobStatus.PENDING)


# -- every action, with and without htmx ---------------------------------------------------


@pytest.mark.parametrize("htmx", [True, False], ids=["htmx", "form"])
def test_cancel_a_pending_job(ops: OpsApp, jobs: Seeded, htmx: bool) -> None:
    client = signed_in(ops)
    job_id = jobs.scheduled[0]
    response = act(client, f"/defer/jobs/{job_id}/cancel", htmx=htmx, next="/defer/?status=pending")
    if not htmx:
        assert response.headers["Location"] == "/defer/?status=pending"
    assert answer(client, response, htmx=htmx) == f"ok: Job {job_id} cancelled."
    assert ops.job(job_id).status is JobStatus.CANCELLED


@pytest.mark.parametrize("htmx", [True, False], ids=["htmx", "form"])
def test_run_now_makes_a_scheduled_job_due(ops: OpsApp, jobs: Seeded, htmx: bool) -> None:
    client = signed_in(ops)
    job_id = jobs.scheduled[1]  # due in three days
    before = datetime.now(UTC)
    response = act(client, f"/defer/jobs/{job_id}/run-now", htmx=htmx)
    assert answer(client, response, htmx=htmx) == (
        f"ok: Job {job_id} is due now; a worker will start it."
    )
    job = ops.job(job_id)
    assert job.status is JobStatus.PENDING
    assert before <= job.run_at <= datetime.now(UTC)
    with ops.context():
        assert job_id in [j.id for j in ops.defer.list(status="pending", limit=50)]
        assert ops.defer.run_due().done >= 1
    assert ops.job(job_id).status is JobStatus.DONE


@pytest.mark.parametrize("htmx", [True, False], ids=["htmx", "form"])
def test_reschedule_to_a_utc_time_or_by_a_delay(ops: OpsApp, jobs: Seeded, htmx: bool) -> None:
    client = signed_in(ops)
    job_id = jobs.scheduled[0]
    response = act(
        client, f"/defer/jobs/{job_id}/reschedule", htmx=htmx, run_at="2031-05-06T07:08:09"
    )
    assert answer(client, response, htmx=htmx).startswith(
        f"ok: Job {job_id} rescheduled to 2031-05-06 07:08:09 UTC"
    )
    assert ops.job(job_id).run_at == datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)

    # "or delay by 1 hour" counts from the job's own run time, not from now.
    response = act(
        client,
        f"/defer/jobs/{job_id}/reschedule",
        htmx=htmx,
        run_at="2031-01-01T00:00",
        delay="3600",
    )
    assert answer(client, response, htmx=htmx).startswith(f"ok: Job {job_id} rescheduled")
    assert ops.job(job_id).run_at == datetime(2031, 5, 6, 8, 8, 9, tzinfo=UTC)

    response = act(
        client, f"/defer/jobs/{job_id}/reschedule", htmx=htmx, run_at="2031-05-06T09:00+02:00"
    )
    assert answer(client, response, htmx=htmx).startswith("ok:")
    assert ops.job(job_id).run_at == datetime(2031, 5, 6, 7, 0, tzinfo=UTC)


@pytest.mark.parametrize("htmx", [True, False], ids=["htmx", "form"])
def test_retry_a_failed_job_resets_its_attempts(ops: OpsApp, jobs: Seeded, htmx: bool) -> None:
    client = signed_in(ops)
    (job_id,) = jobs.failed
    assert ops.job(job_id).attempts == 3
    response = act(client, f"/defer/jobs/{job_id}/retry", htmx=htmx)
    assert answer(client, response, htmx=htmx) == (
        f"ok: Job {job_id} is pending again, due now, attempts reset."
    )
    job = ops.job(job_id)
    assert job.status is JobStatus.PENDING and job.attempts == 0
    assert job.last_error is not None  # the history of why it failed is kept


@pytest.mark.parametrize("htmx", [True, False], ids=["htmx", "form"])
def test_bulk_cancel_cancels_the_pending_rows_of_the_filter(
    ops: OpsApp, jobs: Seeded, htmx: bool
) -> None:
    client = signed_in(ops)
    response = act(client, "/defer/jobs/cancel", htmx=htmx, name="publish_post")
    assert answer(client, response, htmx=htmx) == (
        "ok: Cancelled 1 pending job. 1 running job could not be stopped."
    )
    assert ops.job(jobs.scheduled[0]).status is JobStatus.CANCELLED  # publish_post, pending
    assert ops.job(jobs.running[0]).status is JobStatus.RUNNING
    assert ops.job(jobs.scheduled[1]).status is JobStatus.PENDING  # close_booking: untouched

    response = act(client, "/defer/jobs/cancel", htmx=htmx, owner="maria", status="pending")
    assert answer(client, response, htmx=htmx) == "ok: Cancelled 1 pending job."
    assert ops.job(jobs.scheduled[2]).status is JobStatus.CANCELLED

    # The status filter is honoured: no pending row is cancelled under "failed".
    response = act(client, "/defer/jobs/cancel", htmx=htmx, name="send_email", status="failed")
    assert answer(client, response, htmx=htmx) == (
        "refused: No pending jobs match this filter; nothing cancelled."
    )
    assert ops.job(jobs.due[0]).status is JobStatus.PENDING


@pytest.mark.parametrize("htmx", [True, False], ids=["htmx", "form"])
def test_bulk_retry_retries_the_failed_rows_of_the_filter(
    ops: OpsApp, jobs: Seeded, htmx: bool
) -> None:
    client = signed_in(ops)
    response = act(client, "/defer/jobs/retry", htmx=htmx, name="send_email")
    assert answer(client, response, htmx=htmx) == (
        "refused: No failed jobs match this filter; nothing retried."
    )
    response = act(client, "/defer/jobs/retry", htmx=htmx, key_prefix="account:")
    assert answer(client, response, htmx=htmx) == "ok: Retried 1 failed job, due now."
    job = ops.job(jobs.failed[0])
    assert job.status is JobStatus.PENDING and job.attempts == 0


def test_bulk_cancel_without_a_narrowing_filter_is_refused(ops: OpsApp, jobs: Seeded) -> None:
    client = signed_in(ops)
    response = act(client, "/defer/jobs/cancel", htmx=True, status="pending")
    assert response.status_code == 400
    assert outcome_text(response.get_data(as_text=True)).startswith(
        "refused: Filter by name, key prefix or owner first"
    )
    assert act(client, "/defer/jobs/cancel", htmx=False).status_code == 400
    assert ops.job(jobs.scheduled[0]).status is JobStatus.PENDING


# -- refused from the wrong state -----------------------------------------------------------

WRONG_STATE = [
    ("cancel", "running", "running; not cancelled", {}),
    ("cancel", "done", "done; not cancelled", {}),
    ("cancel", "cancelled", "cancelled; not cancelled", {}),
    ("run-now", "failed", "failed; not run now", {}),
    ("run-now", "running", "running; not run now", {}),
    ("reschedule", "done", "done; not rescheduled", {"delay": "60"}),
    ("reschedule", "cancelled", "cancelled; not rescheduled", {"run_at": "2031-01-01T00:00"}),
    ("retry", "scheduled", "pending; not retried (only a failed job can be)", {}),
    ("retry", "running", "running; not retried (only a failed job can be)", {}),
    ("retry", "done", "done; not retried (only a failed job can be)", {}),
]


@pytest.mark.parametrize("htmx", [True, False], ids=["htmx", "form"])
@pytest.mark.parametrize(("action", "kind", "text", "form"), WRONG_STATE)
def test_an_action_from_the_wrong_state_is_refused_with_the_real_state(
    ops: OpsApp,
    jobs: Seeded,
    htmx: bool,
    action: str,
    kind: str,
    text: str,
    form: dict[str, str],
) -> None:
    client = signed_in(ops)
    job_id = getattr(jobs, kind)[0]
    before = ops.job(job_id)
    response = act(client, f"/defer/jobs/{job_id}/{action}", htmx=htmx, **form)
    assert answer(client, response, htmx=htmx) == f"refused: Job {job_id} is {text}."
    assert ops.job(job_id) == before


# -- CSRF -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ACTION_PATHS)
def test_actions_without_a_valid_csrf_token_are_refused(
    ops: OpsApp, jobs: Seeded, path: str
) -> None:
    client = signed_in(ops)
    token_of(client)  # the session has a token; the request does not carry it
    target = jobs.failed[0] if "retry" in path else jobs.scheduled[0]
    before = ops.job(target)
    url = path.format(id=target)
    # A bulk action's filter matches the target, so a refusal is what keeps it.
    form = {"name": "sync_invoices" if "retry" in path else "publish_post", "delay": "60"}
    assert client.post(url, data=form, headers=HTMX).status_code == 400
    assert client.post(url, data=form).status_code == 400
    assert client.post(url, data={**form, "csrf_token": "forged"}).status_code == 400
    assert client.post(url, data=form, headers={**HTMX, "X-CSRFToken": "x" * 43}).status_code == 400
    other = signed_in(ops)
    assert act(other, url, htmx=True, token=token_of(client), **form).status_code == 400
    assert ops.job(target) == before


#: Destructive actions whose URL answers a GET with a confirm page (no JavaScript).
CONFIRMED_PATHS = {
    "/defer/jobs/{id}/cancel",
    "/defer/jobs/{id}/run-now",
    "/defer/jobs/{id}/retry",
    "/defer/jobs/cancel",
    "/defer/jobs/retry",
}


def test_a_get_never_acts_destructive_ones_answer_with_a_confirm_page(
    ops: OpsApp, jobs: Seeded
) -> None:
    client = signed_in(ops)
    before = {job_id: ops.job(job_id) for job_id in (jobs.scheduled[0], jobs.failed[0])}
    for path in ACTION_PATHS:
        response = client.get(path.format(id=jobs.scheduled[0]) + "?name=publish_post")
        assert response.status_code == (200 if path in CONFIRMED_PATHS else 405), path
        if path in CONFIRMED_PATHS:  # it carries the CSRF token and the job: never cached
            assert response.headers["Cache-Control"] == "no-store", path
    assert {job_id: ops.job(job_id) for job_id in before} == before


def test_the_job_page_hides_an_http_calls_plain_credentials_and_query_string(
    ops: OpsApp,
) -> None:
    call = {
        "url": "https://api.example.com/hooks/order?token=abc123&n=7",
        "method": "POST",
        "id": "order-7",
        "headers": {"authorization": "Bearer sekrit", "Cookie": "sid=s3", "X-Source": "shop"},
    }
    with ops.context():
        job = ops.defer.schedule("flask_defer.http", call, delay=3600)
        ops.db.session.commit()
    page = signed_in(ops).get(f"/defer/jobs/{job.id}").get_data(as_text=True)
    for secret in ("sekrit", "s3", "abc123", "n=7"):
        assert secret not in page, secret
    assert "https://api.example.com/hooks/order?(hidden)" in page
    assert "X-Source" in page and "shop" in page and "order-7" in page
    assert ops.job(job.id).payload == call  # stored as given; only the page hides it


def test_no_dashboard_page_lets_htmx_keep_a_copy_in_the_tabs_storage(
    ops: OpsApp, jobs: Seeded
) -> None:
    # htmx saves the page (its CSRF token and the rows) to the tab's sessionStorage
    # before it pushes a URL, and restores it on Back without asking the server;
    # hx-history="false" makes it ask instead.
    client = signed_in(ops)
    pages = [
        "/defer/", f"/defer/jobs/{jobs.scheduled[0]}", "/defer/activity", "/defer/queues",
        "/defer/schedules", "/defer/workers", f"/defer/jobs/{jobs.scheduled[0]}/cancel",
    ]  # fmt: skip
    for page in pages:
        response = client.get(page)
        assert response.status_code == 200, page
        root = re.search(r'<div class="defer-dash__root"[^>]*>', response.get_data(as_text=True))
        assert root and 'hx-history="false"' in root.group(0), page


def test_cancel_without_javascript_asks_first_then_cancels_from_the_confirm_form(
    ops: OpsApp, jobs: Seeded
) -> None:
    client = signed_in(ops)
    job_id = jobs.scheduled[0]
    page = client.get(f"/defer/jobs/{job_id}").get_data(as_text=True)
    # The Cancel button's form GETs the confirm page without JavaScript; htmx asks and POSTs.
    form = re.search(rf'<form[^>]*action="/defer/jobs/{job_id}/cancel"[^>]*>', page)
    assert form and 'method="get"' in form.group(0) and "hx-confirm=" in form.group(0)
    confirm = client.get(f"/defer/jobs/{job_id}/cancel?next=/defer/jobs/{job_id}")
    html = confirm.get_data(as_text=True)
    assert f"Cancel job {job_id} (publish_post, key post:93:publish)?" in html
    assert ops.job(job_id).status is JobStatus.PENDING
    token = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert token and f'action="/defer/jobs/{job_id}/cancel"' in html
    done = client.post(
        f"/defer/jobs/{job_id}/cancel", data={"csrf_token": token.group(1), "next": "/defer/"}
    )
    assert follow_flash(client, done) == f"ok: Job {job_id} cancelled."
    assert ops.job(job_id).status is JobStatus.CANCELLED


@pytest.mark.parametrize(
    ("action", "seeded", "question", "done"),
    [
        (
            "run-now",
            "scheduled",
            "Run job {id} (publish_post, key post:93:publish) now?",
            "ok: Job {id} is due now; a worker will start it.",
        ),
        (
            "retry",
            "failed",
            "Retry job {id} ({name}",
            "ok: Job {id} is pending again, due now, attempts reset.",
        ),
    ],
)
def test_run_now_and_retry_ask_first_with_and_without_javascript(
    ops: OpsApp, jobs: Seeded, action: str, seeded: str, question: str, done: str
) -> None:
    client = signed_in(ops)
    job_id = getattr(jobs, seeded)[0]
    before = ops.job(job_id)
    page = client.get(f"/defer/jobs/{job_id}").get_data(as_text=True)
    # The button's form GETs the confirm page without JavaScript; htmx asks and POSTs.
    pattern = rf'<form[^>]*action="/defer/jobs/{job_id}/{action}"[^>]*>(.*?)</form>'
    form = re.search(pattern, page, re.S)
    assert form and 'method="get"' in form.group(0) and "hx-confirm=" in form.group(0)
    assert "csrf_token" not in form.group(1)  # the GET carries no token to leak
    confirm = client.get(f"/defer/jobs/{job_id}/{action}?next=/defer/jobs/{job_id}")
    html = confirm.get_data(as_text=True)
    assert confirm.status_code == 200
    assert question.format(id=job_id, name=before.name) in html
    assert ops.job(job_id) == before  # asking changed nothing
    token = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert token and f'action="/defer/jobs/{job_id}/{action}"' in html
    acted = client.post(
        f"/defer/jobs/{job_id}/{action}", data={"csrf_token": token.group(1), "next": "/defer/"}
    )
    assert follow_flash(client, acted) == done.format(id=job_id)
    assert ops.job(job_id) != before
    assert client.get(f"/defer/jobs/999999/{action}").status_code == 404


def test_bulk_actions_without_javascript_confirm_with_the_same_filters(
    ops: OpsApp, jobs: Seeded
) -> None:
    client = signed_in(ops)
    page = client.get("/defer/?name=publish_post").get_data(as_text=True)
    bulk = re.search(r'<form[^>]*action="/defer/jobs/cancel"[^>]*>(.*?)</form>', page, re.S)
    assert bulk and 'method="get"' in bulk.group(0) and "csrf_token" not in bulk.group(1)
    confirm = client.get("/defer/jobs/cancel?name=publish_post&next=/defer/")
    html = confirm.get_data(as_text=True)
    assert "Cancel every pending job matching name &#39;publish_post&#39;?" in html
    assert '<input type="hidden" name="name" value="publish_post">' in html
    assert ops.job(jobs.scheduled[0]).status is JobStatus.PENDING
    retry = client.get("/defer/jobs/retry?next=/defer/").get_data(as_text=True)
    assert "Retry every failed job in the table?" in retry
    assert ops.job(jobs.failed[0]).status is JobStatus.FAILED


def test_confirm_pages_need_the_operator(ops: OpsApp, jobs: Seeded) -> None:
    for client in (ops.app.test_client(), signed_in(ops, "alice")):
        assert client.get(f"/defer/jobs/{jobs.scheduled[0]}/cancel").status_code == 403
        assert client.get("/defer/jobs/cancel?name=x").status_code == 403
    assert signed_in(ops).get("/defer/jobs/999999/cancel").status_code == 404


# -- the list -------------------------------------------------------------------------------


def ids_in(html: str) -> list[int]:
    return [int(n) for n in re.findall(r'<tr id="defer-row-(\d+)"', html)]


def test_the_list_is_newest_first_with_the_health_figures_on_top(ops: OpsApp, jobs: Seeded) -> None:
    html = signed_in(ops).get("/defer/").get_data(as_text=True)
    every = sorted(id for ids in vars(jobs).values() for id in ids)
    assert ids_in(html) == every[::-1]
    assert html.index('id="defer-health"') < html.index('id="defer-jobs"')
    assert re.search(r'data-defer-figure="owed">3<', html)  # 2 due + 1 running
    assert re.search(r'data-defer-figure="scheduled">3<', html)
    assert re.search(r'data-defer-figure="failed">1<', html)
    assert "oldest 4 min" in html
    names = re.findall(
        r'<th scope="row"><a id="defer-health-name-\d+" href="/defer/\?name=(\w+)"', html
    )
    assert names == ["send_email", "publish_post", "close_booking", "sync_invoices"]
    assert 'hx-trigger="every 5s, defer-jobs-changed from:body"' in html


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("status=failed", "failed"),
        ("status=pending", "due+scheduled"),
        ("name=close_booking", "close_booking"),
        ("key_prefix=user:10", "user"),
        ("owner=maria", "maria"),
        ("status=done&name=send_email&owner=li", "li"),
        ("key_prefix=user_10", ""),  # _ is no wildcard
        ("key_prefix=USER:", ""),  # case matters, on SQLite too
    ],
)
def test_filters(ops: OpsApp, jobs: Seeded, query: str, expected: str) -> None:
    wanted = {
        "failed": jobs.failed,
        "due+scheduled": jobs.due + jobs.scheduled,
        "close_booking": [jobs.cancelled[1], jobs.scheduled[1]],
        "user": jobs.done[:3] + [jobs.scheduled[2]],
        "maria": [jobs.done[0], jobs.scheduled[2]],
        "li": [jobs.done[2]],
        "": [],
    }[expected]
    html = signed_in(ops).get(f"/defer/?{query}").get_data(as_text=True)
    assert ids_in(html) == sorted(wanted, reverse=True)
    if not wanted:
        assert "No jobs match these filters." in html


def test_pages(make_ops: Callable[..., OpsApp]) -> None:
    ops = make_ops(DEFER_DASHBOARD_PAGE_SIZE=5)
    jobs = seed(ops)
    every = sorted((id for ids in vars(jobs).values() for id in ids), reverse=True)
    client = signed_in(ops)
    first = client.get("/defer/").get_data(as_text=True)
    assert ids_in(first) == every[:5] and "1–5 of 13" in first and "Page 1 of 3" in first
    third = client.get("/defer/?page=3").get_data(as_text=True)
    assert ids_in(third) == every[10:] and "11–13 of 13" in third
    assert 'rel="prev" href="/defer/?page=2"' in third and 'rel="next"' not in third
    beyond = client.get("/defer/?page=9")
    assert beyond.status_code == 200
    assert "No jobs on page 9." in beyond.get_data(as_text=True)


def test_htmx_gets_the_list_fragment_and_the_health_out_of_band(ops: OpsApp, jobs: Seeded) -> None:
    client = signed_in(ops)
    response = client.get("/defer/?status=failed", headers={**HTMX, "HX-Trigger": "defer-filters"})
    html = response.get_data(as_text=True)
    assert html.lstrip().startswith('<section id="defer-jobs"')
    assert re.search(r'<section id="defer-health"[^>]* hx-swap-oob="true">', html)
    assert "<html" not in html and ids_in(html) == jobs.failed
    assert response.headers["HX-Push-Url"] == "/defer/?status=failed"
    assert "HX-Request" in response.headers["Vary"]
    # The list's own refresh does not push a history entry.
    refresh = client.get("/defer/?status=failed", headers={**HTMX, "HX-Trigger": "defer-jobs"})
    assert "HX-Push-Url" not in refresh.headers
    # A history restore needs the whole page.
    restore = client.get(
        "/defer/?status=failed", headers={**HTMX, "HX-History-Restore-Request": "true"}
    )
    assert "<html" in restore.get_data(as_text=True)


def test_bulk_buttons_show_what_they_would_touch(ops: OpsApp, jobs: Seeded) -> None:
    client = signed_in(ops)
    html = client.get("/defer/").get_data(as_text=True)
    assert "Retry 1 failed" in html and 'id="defer-cancel-many"' not in html  # no filter
    html = client.get("/defer/?name=send_email").get_data(as_text=True)
    assert 'id="defer-retry-many"' not in html  # no failed send_email
    assert "Cancel 3 pending" in html
    assert 'name="name" value="send_email"' in html
    html = client.get("/defer/?owner=maria&status=done").get_data(as_text=True)
    assert 'id="defer-cancel-many"' not in html and 'id="defer-retry-many"' not in html


# -- the job page ---------------------------------------------------------------------------


def test_the_job_page_of_a_failed_job_shows_its_traceback_and_payload(
    ops: OpsApp, jobs: Seeded
) -> None:
    html = signed_in(ops).get(f"/defer/jobs/{jobs.failed[0]}").get_data(as_text=True)
    # Focusable, with a name: a keyboard user can scroll a long traceback.
    assert (
        '<pre class="defer-code defer-traceback" id="defer-job-error-text" tabindex="0" '
        'aria-label="Traceback of the last error">Traceback (most recent call last):'
    ) in html
    assert "BillingUnavailable: billing API refused the connection (account 4711)" in html
    assert (
        '<pre class="defer-code" id="defer-job-payload-text" tabindex="0"'
        ' aria-labelledby="defer-job-payload">'
        "{\n  &#34;account&#34;: 4711,\n  &#34;period&#34;: "
    ) in html
    assert "<dt>Attempts</dt><dd>3 of 3</dd>" in html
    assert "<dt>Finished</dt>" in html and "2 h 10 min ago" in html
    assert f'id="defer-dashboard-retry-{jobs.failed[0]}"' in html
    assert "Run now" not in html and "Reschedule" not in html


def test_the_job_page_of_a_done_job_shows_its_result(ops: OpsApp, jobs: Seeded) -> None:
    job_id = jobs.done[0]
    html = signed_in(ops).get(f"/defer/jobs/{job_id}").get_data(as_text=True)
    assert '<h2 id="defer-job-result">Result</h2>' in html
    assert f"&lt;{job_id}@mail.example&gt;" in html
    assert "Last error" not in html
    assert '<div class="defer-job__actions"></div>' in html  # nothing to do with a done job


def test_the_job_page_of_a_pending_job_offers_its_actions_and_refreshes(
    ops: OpsApp, jobs: Seeded
) -> None:
    client = signed_in(ops)
    job_id = jobs.scheduled[0]
    html = client.get(f"/defer/jobs/{job_id}").get_data(as_text=True)
    for action in ("run-now", "cancel", "reschedule"):
        assert f'action="/defer/jobs/{job_id}/{action}"' in html
    # Timed refresh, paused while a traceback is open or a field has focus; and after actions.
    assert re.search(r'hx-trigger="every 5s \[!this\.querySelector\(\'details\[open\]\'\)', html)
    assert 'defer-jobs-changed from:body"' in html
    fragment = client.get(f"/defer/jobs/{job_id}", headers=HTMX).get_data(as_text=True)
    assert fragment.lstrip().startswith('<article id="defer-job"') and "<html" not in fragment
    done = client.get(f"/defer/jobs/{jobs.done[0]}").get_data(as_text=True)
    assert 'hx-trigger="defer-jobs-changed from:body"' in done  # settled: no polling


def test_the_job_page_links_a_groups_members_and_its_callback(ops: OpsApp) -> None:
    with ops.context():
        group = ops.defer.group(
            "send_email", [{"to": f"user{n}@example.com"} for n in range(3)],
            then="send_digest", then_payload={"week": 5},
        )  # fmt: skip
        ops.db.session.commit()
    client = signed_in(ops)
    then_page = client.get(f"/defer/jobs/{group.id}").get_data(as_text=True)
    assert '<h2 id="defer-job-workflow">Workflow</h2>' in then_page
    assert "3 jobs to settle" in then_page and 'data-defer-waiting="3"' in then_page
    parents = then_page.split('data-defer-related="parents"')[1].split("</ul>")[0]
    for member in group.jobs:
        assert (
            f'<a id="defer-related-parents-{member.id}" href="/defer/jobs/{member.id}">'
            f"#{member.id} send_email</a>"
        ) in parents
    member_page = client.get(f"/defer/jobs/{group.jobs[0].id}").get_data(as_text=True)
    children = member_page.split('data-defer-related="children"')[1].split("</ul>")[0]
    assert (
        f'<a id="defer-related-children-{group.id}" href="/defer/jobs/{group.id}">'
        f"#{group.id} send_digest</a>"
    ) in children
    assert 'data-defer-related="parents"' not in member_page


@pytest.mark.parametrize("htmx", [True, False], ids=["htmx", "form"])
def test_the_abort_button_of_a_running_job_asks_its_worker_to_stop_it(
    ops: OpsApp, jobs: Seeded, htmx: bool
) -> None:
    client = signed_in(ops)
    job_id = jobs.running[0]
    page = client.get(f"/defer/jobs/{job_id}").get_data(as_text=True)
    assert f'action="/defer/jobs/{job_id}/abort"' in page and "abort requested" not in page
    confirm = client.get(f"/defer/jobs/{job_id}/abort").get_data(as_text=True)
    assert f"Abort job {job_id} (publish_post, key post:91:publish)?" in confirm
    assert act(client, f"/defer/jobs/{job_id}/abort", htmx=htmx, token="forged").status_code == 400
    response = act(client, f"/defer/jobs/{job_id}/abort", htmx=htmx)
    if htmx:
        assert outcome_text(response.get_data(as_text=True)) == (
            f"ok: Abort of job {job_id} requested; its worker stops it."
        )
    else:
        assert response.status_code == 303
    page = client.get(f"/defer/jobs/{job_id}").get_data(as_text=True)
    assert "data-defer-abort-requested" in page and "Abort requested by admin" in page
    assert f'action="/defer/jobs/{job_id}/abort"' not in page  # asked once
    with ops.context():
        assert [e.event for e in ops.defer.history(job_id)][-1] == "abort_requested"
    again = act(client, f"/defer/jobs/{job_id}/abort", htmx=True)
    assert outcome_text(again.get_data(as_text=True)).startswith("refused: ")


def test_an_abort_is_refused_to_a_visitor(ops: OpsApp, jobs: Seeded) -> None:
    client = ops.app.test_client()
    assert client.post(f"/defer/jobs/{jobs.running[0]}/abort").status_code == 403


def test_a_job_without_a_workflow_shows_no_workflow_panel(ops: OpsApp, jobs: Seeded) -> None:
    html = signed_in(ops).get(f"/defer/jobs/{jobs.done[0]}").get_data(as_text=True)
    assert "defer-job-workflow" not in html


def test_the_back_link_keeps_the_lists_filters(ops: OpsApp, jobs: Seeded) -> None:
    client = signed_in(ops)
    page = client.get(
        f"/defer/jobs/{jobs.failed[0]}",
        headers={"Referer": "http://localhost/defer/?status=failed"},
    ).get_data(as_text=True)
    assert '<a href="/defer/?status=failed">← Jobs</a>' in page
    hostile = client.get(
        f"/defer/jobs/{jobs.failed[0]}", headers={"Referer": "https://evil.example/defer/"}
    ).get_data(as_text=True)
    assert '<a href="/defer/">← Jobs</a>' in hostile


def test_user_text_is_escaped_everywhere(ops: OpsApp) -> None:
    with ops.context():
        job = ops.defer.schedule(
            "send_email",
            {"html": "<script>alert(1)</script>"},
            key="<img src=x onerror=alert(1)>",
            owner='"><script>alert(2)</script>',
            label="<b>label</b>",
            delay=60,
        )
        ops.db.session.commit()
    client = signed_in(ops)
    for path in ("/defer/", f"/defer/jobs/{job.id}", "/defer/?owner=%3Cscript%3E"):
        html = client.get(path).get_data(as_text=True)
        assert "<script>alert" not in html and "<img src=x" not in html and "<b>label" not in html


# -- hostile input --------------------------------------------------------------------------

HOSTILE_IDS = ["abc", "-1", "1.5", "0", "%00", "1%0a", "9" * 30, "9223372036854775808", "999999"]


@pytest.mark.parametrize("job_id", HOSTILE_IDS)
def test_hostile_job_ids_answer_404(ops: OpsApp, jobs: Seeded, job_id: str) -> None:
    client = signed_in(ops)
    token = token_of(client)
    assert client.get(f"/defer/jobs/{job_id}").status_code == 404
    for action in ("cancel", "run-now", "reschedule", "retry"):
        response = client.post(
            f"/defer/jobs/{job_id}/{action}",
            data={"delay": "5"},
            headers={**HTMX, "X-CSRFToken": token},
        )
        assert response.status_code == 404, action


def test_the_largest_job_id_is_not_found_rather_than_an_overflow(ops: OpsApp, jobs: Seeded) -> None:
    client = signed_in(ops)
    token = token_of(client)
    assert client.get("/defer/jobs/9223372036854775807").status_code == 404
    response = act(client, "/defer/jobs/9223372036854775807/retry", htmx=True, token=token)
    assert response.status_code == 404


@pytest.mark.parametrize(
    "query",
    [
        "status=bogus",
        "status=PENDING",
        "status=pending&status=failed",
        "name=a&name=b",
        "page=0",
        "page=-1",
        "page=abc",
        "page=1.5",
        "page=1e3",
        "page=" + "9" * 40,
        "page=1000001",
        "page=%EF%BC%91",  # a full-width digit one
        "name=" + "x" * 256,
        "owner=%00",
        "key_prefix=a%0Ab",
    ],
)
def test_bad_list_parameters_answer_400(ops: OpsApp, jobs: Seeded, query: str) -> None:
    client = signed_in(ops)
    assert client.get(f"/defer/?{query}").status_code == 400
    response = client.get(f"/defer/?{query}", headers=HTMX)
    assert response.status_code == 400
    assert outcome_text(response.get_data(as_text=True)).startswith("refused: ")


@pytest.mark.parametrize(
    "query", ["", "status=", "page=", "page=1", "name=%25", "key_prefix=%25_%5C", "foo=bar"]
)
def test_harmless_list_parameters_are_accepted(ops: OpsApp, jobs: Seeded, query: str) -> None:
    assert signed_in(ops).get(f"/defer/?{query}").status_code == 200


@pytest.mark.parametrize(
    "form",
    [
        {},
        {"run_at": "tomorrow"},
        {"run_at": "2031-13-01T00:00"},
        {"run_at": "9999-12-31T23:59:59-05:00"},
        {"run_at": "0001-01-01T00:00+01:00"},
        {"run_at": "9999-01-01T00:00"},
        {"delay": "-5"},
        {"delay": "abc"},
        {"delay": "1.5"},
        {"delay": "9" * 40},
        {"delay": "٣"},  # an Arabic-Indic digit three
    ],
)
def test_bad_reschedule_times_answer_400(ops: OpsApp, jobs: Seeded, form: dict[str, str]) -> None:
    client = signed_in(ops)
    job_id = jobs.scheduled[0]
    before = ops.job(job_id)
    for htmx in (True, False):
        response = act(client, f"/defer/jobs/{job_id}/reschedule", htmx=htmx, **form)
        assert response.status_code == 400
    assert ops.job(job_id) == before


def test_a_past_reschedule_time_means_now(ops: OpsApp, jobs: Seeded) -> None:
    client = signed_in(ops)
    job_id = jobs.scheduled[0]
    before = datetime.now(UTC)
    response = act(client, f"/defer/jobs/{job_id}/reschedule", htmx=True, run_at="2001-01-01T00:00")
    assert response.status_code == 200
    assert before <= ops.job(job_id).run_at <= datetime.now(UTC)


def test_a_bulk_action_with_a_bad_filter_answers_400(ops: OpsApp, jobs: Seeded) -> None:
    client = signed_in(ops)
    for path in ("/defer/jobs/cancel", "/defer/jobs/retry"):
        response = act(client, path, htmx=True, name="x", status="exploded")
        assert response.status_code == 400
    assert ops.job(jobs.failed[0]).status is JobStatus.FAILED


def test_the_hook_may_answer_itself_with_a_redirect_to_the_login_page(
    make_ops: Callable[..., OpsApp],
) -> None:
    from flask import abort, redirect, request
    from flask_login import current_user

    ops = make_ops(auth=False)

    @ops.defer.dashboard_auth
    def operators_only() -> bool:
        if not current_user.is_authenticated:
            abort(redirect(f"/login/admin?next={request.full_path}"))
        return bool(current_user.id == "admin")

    response = ops.app.test_client().get("/defer/?status=failed")
    assert response.status_code == 302
    assert response.headers["Location"] == "/login/admin?next=/defer/?status=failed"
    assert signed_in(ops, "alice").get("/defer/").status_code == 403
    assert signed_in(ops, "admin").get("/defer/").status_code == 200


@pytest.mark.parametrize(
    "target", ["https://evil.example/", "//evil.example/x", "/\\evil.example", "javascript:x"]
)
def test_an_action_never_redirects_off_the_site(ops: OpsApp, jobs: Seeded, target: str) -> None:
    client = signed_in(ops)
    response = act(client, f"/defer/jobs/{jobs.scheduled[0]}/run-now", htmx=False, next=target)
    assert response.status_code == 303
    assert response.headers["Location"] == "/defer/"


def test_past_the_settled_cap_figures_and_the_total_say_at_least(
    make_ops: Callable[..., OpsApp], monkeypatch: pytest.MonkeyPatch
) -> None:
    from flask_defer.store import JobStore
    from flask_defer.web import dashboard

    monkeypatch.setattr(JobStore, "settled_cap", 1)
    monkeypatch.setattr(dashboard, "LIST_COUNT_CAP", 4)
    ops = make_ops(DEFER_DASHBOARD_PAGE_SIZE=2)
    seed(ops)  # 13 jobs, several done and cancelled
    html = signed_in(ops).get("/defer/").get_data(as_text=True)
    assert re.search(r'data-defer-figure="done">2\+<', html), html
    assert "Figures with a + are lower bounds" in html
    assert "1–2 of 4+" in html and "Page 1 of 3+" in html


# -- job history -----------------------------------------------------------------------


@pytest.mark.parametrize("htmx", [True, False], ids=["htmx", "form"])
def test_a_dashboard_cancel_records_the_signed_in_operator(
    ops: OpsApp, jobs: Seeded, htmx: bool
) -> None:
    job_id = jobs.scheduled[0]
    act(signed_in(ops, "admin"), f"/defer/jobs/{job_id}/cancel", htmx=htmx)
    with ops.context():
        history = ops.defer.history(job_id)
    assert [(e.event, e.actor) for e in history] == [("scheduled", "app"), ("cancelled", "admin")]


def test_dashboard_actions_without_a_signed_in_user_record_dashboard(
    make_ops: Callable[..., OpsApp],
) -> None:
    ops = make_ops(auth=False)
    ops.app.debug = True  # open without a hook, and nobody signed in
    jobs = seed(ops)
    client = ops.app.test_client()
    job_id = jobs.scheduled[0]
    act(client, f"/defer/jobs/{job_id}/run-now", htmx=True)
    act(client, f"/defer/jobs/{job_id}/cancel", htmx=True)
    with ops.context():
        events = [(e.event, e.actor) for e in ops.defer.history(job_id)]
    assert events[-2:] == [("run_now", "dashboard"), ("cancelled", "dashboard")]


def test_the_job_page_shows_the_history_with_every_attempts_error(
    ops: OpsApp, jobs: Seeded
) -> None:
    client = signed_in(ops)
    job_id = jobs.failed[0]
    act(client, f"/defer/jobs/{job_id}/retry", htmx=True)
    html = client.get(f"/defer/jobs/{job_id}").get_data(as_text=True)

    section = html[html.index('id="defer-job-history"') :]
    found = re.findall(r'data-defer-event="(\w+)"', section)
    assert found == [
        "scheduled", "started", "retried", "started", "retried", "started", "failed",
        "retried_by_operator",
    ]  # fmt: skip
    # Three attempts, three errors kept: last_error alone would show only the third.
    assert (
        len(
            re.findall(
                r'<summary id="defer-event-\d+-error">BillingUnavailable: billing API refused',
                section,
            )
        )
        == 3
    )
    assert "Retried by an operator</strong>" in section
    assert '<span class="defer-timeline__actor">admin</span>' in section


def test_the_job_list_links_each_row_to_its_history(ops: OpsApp, jobs: Seeded) -> None:
    html = signed_in(ops).get("/defer/?name=sync_invoices").get_data(as_text=True)
    job_id = jobs.failed[0]
    assert f'href="/defer/jobs/{job_id}#defer-job-history"' in html


def test_the_job_page_shows_a_jobs_queue_controls(ops: OpsApp, jobs: Seeded) -> None:
    with ops.context():
        job = ops.defer.schedule(
            "send_email", {"to": "a@example.com"}, priority=-5, concurrency_key="acct:7",
            concurrency_limit=2, ttl=630,
        )  # fmt: skip
        ops.db.session.commit()
    html = signed_in(ops).get(f"/defer/jobs/{job.id}").get_data(as_text=True)
    assert "<dt>Priority</dt><dd>-5</dd>" in html
    assert "at most 2 running with key acct:7" in html
    # 10.5 min: it reads "in 10 min" however long a loaded machine takes to render it.
    assert "<dt>Expires</dt>" in html and "in 10 min" in html
    plain = signed_in(ops).get(f"/defer/jobs/{jobs.done[0]}").get_data(as_text=True)
    assert "<dt>Priority</dt><dd>0</dd>" in plain and "<dt>Expires</dt>" not in plain


def test_the_job_page_says_when_history_is_off(make_ops: Callable[..., OpsApp]) -> None:
    ops = make_ops(DEFER_HISTORY=False)
    jobs = seed(ops)
    html = signed_in(ops).get(f"/defer/jobs/{jobs.failed[0]}").get_data(as_text=True)
    assert "History is off for this app" in html
    assert "data-defer-event" not in html


# -- wording of the pages ------------------------------------------------------------------


def test_a_cancelled_jobs_page_does_not_say_when_it_will_run(ops: OpsApp, jobs: Seeded) -> None:
    client = signed_in(ops)
    # The booking was cancelled; its run time (two days ahead) will never come.
    html = client.get(f"/defer/jobs/{jobs.cancelled[1]}").get_data(as_text=True)
    assert "Was due" in html and "Run at" not in html
    assert not re.search(r"\bin \d+ (days?|h|min)", html), "a settled job's page promises a run"
    live = client.get(f"/defer/jobs/{jobs.scheduled[0]}").get_data(as_text=True)
    # Two hours ahead, read a moment after seeding: "in 2 h" or, a second later, "in 1 h 59 min".
    assert "Run at" in live and re.search(r"\bin (2 h|1 h 59 min)\b", live)


def test_the_refresh_note_is_hidden_until_the_script_shows_it(ops: OpsApp, jobs: Seeded) -> None:
    html = signed_in(ops).get("/defer/").get_data(as_text=True)
    assert re.search(r"<span data-defer-refresh-note hidden> · refreshes every 5 s</span>", html)


def test_the_dashboard_links_back_to_the_app_as_configured(
    make_ops: Callable[..., OpsApp],
) -> None:
    default = signed_in(make_ops()).get("/defer/").get_data(as_text=True)
    assert '<a href="/" id="defer-home-link">' in default
    ops = make_ops(DEFER_DASHBOARD_HOME_URL="/admin/")
    seeded = seed(ops)
    client = signed_in(ops)
    assert '<a href="/admin/" id="defer-home-link">' in client.get("/defer/").get_data(as_text=True)
    job_page = client.get(f"/defer/jobs/{seeded.done[0]}").get_data(as_text=True)
    assert 'href="/admin/" id="defer-home-link"' in job_page
    hidden = signed_in(make_ops(DEFER_DASHBOARD_HOME_URL=None)).get("/defer/")
    assert "defer-home-link" not in hidden.get_data(as_text=True)


def test_a_blank_home_url_is_refused_naming_the_setting(make_ops: Callable[..., OpsApp]) -> None:
    from flask_defer.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="DEFER_DASHBOARD_HOME_URL"):
        make_ops(DEFER_DASHBOARD_HOME_URL=" ")


#: What a German and a French operator read: headings, figures, actions, outcomes.
SPOKEN = {
    "de": {
        "list": [
            "<h1",
            ">Aufgaben</a></h1>",
            ">Überfällig<",
            ">Schlüsselpräfix<",
            ">Jetzt ausführen<",
            ">Wiederholen<",
            ">fehlgeschlagen<",
            "vor 4 Min.",
            "Alle Aufgaben",
            "Zeitpläne",
        ],
        "job": [
            ">Verlauf<",
            ">Nutzdaten<",
            ">Letzter Fehler<",
            ">Versuche<",
            "Versuch fehlgeschlagen; wird wiederholt",
            "3 von 3",
        ],
        "schedules": [">Zeitpläne</h1>", ">Pausieren<", ">Nächster Lauf<", ">aktiv<"],
        "cancelled": "ok: Aufgabe {id} abgebrochen.",
        "refused": "refused: Aufgabe {id} ist erledigt; nicht sofort ausgeführt.",
        "confirm": "Aufgabe {id} (publish_post, Schlüssel post:93:publish) abbrechen?",
    },
    "fr": {
        "list": [
            "<h1",
            ">Tâches</a></h1>",
            ">En retard<",
            ">Préfixe de clé<",
            ">Lancer maintenant<",
            ">Relancer<",
            ">en échec<",
            "il y a 4\xa0min",
            "Toutes les tâches",
            "Planifications",
        ],
        "job": [
            ">Historique<",
            ">Données<",
            ">Dernière erreur<",
            ">Tentatives<",
            "Tentative échouée\u202f; nouvel essai prévu",
            "3 sur 3",
        ],
        "schedules": [
            ">Planifications</h1>",
            ">Mettre en pause<",
            ">Prochaine exécution<",
            ">active<",
        ],
        "cancelled": "ok: Tâche {id} interrompue.",
        "refused": "refused: La tâche {id} est terminée\u202f; elle n’a pas été lancée.",
        "confirm": "Interrompre la tâche {id} (publish_post, clé post:93:publish)\u202f?",
    },
}
#: English words of the same pages that must not be left in a translated page.
ENGLISH = [
    ">Jobs<",
    ">Owed<",
    ">Run now<",
    ">Retry<",
    ">History<",
    ">Payload<",
    "min ago",
    ">Schedules</h1>",
    ">Pause<",
    "All jobs",
    "Key prefix",
]


@pytest.mark.parametrize("locale", sorted(SPOKEN))
def test_the_dashboard_speaks_the_operators_language(
    make_ops: Callable[..., OpsApp], locale: str
) -> None:
    ops = make_ops(babel=True)
    jobs = seed(ops)
    client = signed_in(ops)
    spoken, lang = SPOKEN[locale], {"Accept-Language": locale}

    def page(path: str) -> str:
        html: str = client.get(path, headers=lang).get_data(as_text=True)
        assert f'<html lang="{locale}">' in html
        return html

    pages = {
        "list": page("/defer/"),
        "job": page(f"/defer/jobs/{jobs.failed[0]}"),
        "schedules": page("/defer/schedules"),
    }
    for name, html in pages.items():
        missing = [text for text in spoken[name] if text not in html]
        assert missing == [], f"{locale} {name} page lacks {missing}"
        english = [text for text in ENGLISH if text in html]
        assert english == [], f"{locale} {name} page still says {english}"

    token = token_of(client)
    headers = {**HTMX, "X-CSRFToken": token, **lang}
    cancel = client.post(f"/defer/jobs/{jobs.due[0]}/cancel", headers=headers)
    assert outcome_text(cancel.get_data(as_text=True)) == spoken["cancelled"].format(id=jobs.due[0])
    refused = client.post(f"/defer/jobs/{jobs.done[0]}/run-now", headers=headers)
    assert outcome_text(refused.get_data(as_text=True)) == spoken["refused"].format(id=jobs.done[0])
    confirm = page(f"/defer/jobs/{jobs.scheduled[0]}/cancel?next=/defer/")
    assert spoken["confirm"].format(id=jobs.scheduled[0]) in confirm


def test_without_babel_the_dashboard_stays_english(ops: OpsApp, jobs: Seeded) -> None:
    html = signed_in(ops).get("/defer/", headers={"Accept-Language": "de"}).get_data(as_text=True)
    assert '<html lang="en">' in html and ">Owed<" in html and ">Run now<" in html
    assert "Überfällig" not in html


def test_an_open_dashboard_without_a_secret_key_answers_a_page_naming_the_setting(
    make_ops: Callable[..., OpsApp],
) -> None:
    ops = make_ops(auth=False, SECRET_KEY=None)
    ops.app.debug = True  # the dashboard opens to any request in debug mode
    response = ops.app.test_client().get("/defer/")
    body = response.get_data(as_text=True)
    assert response.status_code == 500
    assert "SECRET_KEY" in body and "dashboard" in body


def test_the_job_page_shows_a_done_jobs_result_excerpt_escaped(ops: OpsApp, jobs: Seeded) -> None:
    client = signed_in(ops)
    done = ops.job(jobs.done[0])
    assert done.result is not None and "<" in done.result["smtp_id"]
    html = client.get(f"/defer/jobs/{done.id}").get_data(as_text=True)
    assert 'class="defer-timeline__result"' in html
    assert "&lt;" in html.split('class="defer-timeline__result"', 1)[1].split("</p>", 1)[0]
