"""The dashboard's Schedules page over HTTP (both backends): access, CSRF, actions."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from flask.testing import FlaskClient
from sqlalchemy import update

from flask_defer.recurring_rules import make_rule, make_spec
from flask_defer.timeutil import utcnow

from ..dashboard_app import OpsApp, create_app

HTMX = {"HX-Request": "true"}
PAGE = "/defer/schedules"
SCHEDULE = "nightly-invoices"


@pytest.fixture
def ops(database_url: str) -> Iterator[OpsApp]:
    ops = create_app(database_url, TESTING=True)
    yield ops
    ops.dispose()


def signed_in(ops: OpsApp, user: str = "admin") -> FlaskClient:
    client = ops.app.test_client()
    client.get(f"/login/{user}")
    return client


def token_of(client: FlaskClient) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', client.get(PAGE).get_data(as_text=True))
    assert found, "no CSRF token on the page"
    return found.group(1)


def paused(ops: OpsApp) -> bool:
    with ops.context():
        (row,) = [r for r in ops.defer.list_recurring() if r.id == SCHEDULE]
        return row.paused


def test_the_page_is_closed_to_anonymous_users_and_non_operators(ops: OpsApp) -> None:
    assert ops.app.test_client().get(PAGE).status_code == 403
    assert signed_in(ops, "alice").get(PAGE).status_code == 403
    client = signed_in(ops, "alice")
    assert client.post(f"{PAGE}/{SCHEDULE}/pause", data={}).status_code == 403
    assert not paused(ops)


def test_the_page_lists_each_schedule_with_its_rule_state_and_next_run(ops: OpsApp) -> None:
    html = signed_in(ops).get(PAGE).get_data(as_text=True)
    row = re.search(rf'<tr id="defer-schedule-{SCHEDULE}".*?</tr>', html, re.S)
    assert row, html
    text = row.group(0)
    assert 'data-defer-state="active"' in text
    assert "0 3 1 1 * (Europe/Berlin)" in text and "sync_invoices" in text
    assert "never" in text  # no last run yet
    assert "Pause" in text and "Run now" in text


@pytest.mark.parametrize("htmx", [True, False], ids=["htmx", "plain-form"])
def test_pause_and_resume_over_http_with_csrf(ops: OpsApp, htmx: bool) -> None:
    client = signed_in(ops)
    token = token_of(client)

    def post(action: str) -> Any:
        url = f"{PAGE}/{SCHEDULE}/{action}"
        if htmx:
            return client.post(url, headers={**HTMX, "X-CSRFToken": token})
        return client.post(url, data={"csrf_token": token, "next": PAGE})

    response = post("pause")
    assert response.status_code == (200 if htmx else 303)
    assert paused(ops)
    if htmx:
        assert f"Schedule {SCHEDULE} paused." in response.get_data(as_text=True)
        assert "was already paused" in post("pause").get_data(as_text=True)
    else:
        assert response.headers["Location"].endswith(PAGE)
        page = client.get(PAGE).get_data(as_text=True)
        assert f"Schedule {SCHEDULE} paused." in page and 'data-defer-state="paused"' in page
    post("resume")
    assert not paused(ops)


def test_run_now_writes_one_job_of_the_schedule(ops: OpsApp) -> None:
    client = signed_in(ops)
    response = client.post(
        f"{PAGE}/{SCHEDULE}/run-now", headers={**HTMX, "X-CSRFToken": token_of(client)}
    )
    assert response.status_code == 200
    with ops.context():
        (job,) = ops.defer.list(key_prefix=f"recurring:{SCHEDULE}:")
    assert job.name == "sync_invoices" and job.payload == {"account": 1}
    assert f"job {job.id} is due now" in response.get_data(as_text=True)


@pytest.mark.parametrize("action", ["pause", "resume", "run-now"])
def test_actions_without_a_valid_csrf_token_are_refused(ops: OpsApp, action: str) -> None:
    client = signed_in(ops)
    token_of(client)
    url = f"{PAGE}/{SCHEDULE}/{action}"
    assert client.post(url, headers=HTMX).status_code == 400
    assert client.post(url, data={"csrf_token": "forged"}).status_code == 400
    assert client.get(url).status_code == 405
    assert not paused(ops)
    with ops.context():
        assert ops.defer.list(key_prefix=f"recurring:{SCHEDULE}:") == []


@pytest.mark.parametrize("schedule_id", ["nope", "bad%20id", "x" * 300])
def test_unknown_or_malformed_ids_answer_404(ops: OpsApp, schedule_id: str) -> None:
    client = signed_in(ops)
    token = token_of(client)
    for action in ("pause", "resume", "run-now"):
        response = client.post(
            f"{PAGE}/{schedule_id}/{action}", headers={**HTMX, "X-CSRFToken": token}
        )
        assert response.status_code == 404


def test_the_jobs_dashboard_links_to_the_schedules_page(ops: OpsApp) -> None:
    assert f'href="{PAGE}"' in signed_in(ops).get("/defer/").get_data(as_text=True)




def test_the_jobs_dashboard_warns_of_a_late_schedule(ops: OpsApp) -> None:
    client = signed_in(ops)
    assert "data-defer-figure=\"late-schedules\"" not in client.get("/defer/").get_data(
        as_text=True
    )
    with ops.context():
        ops.defer.list_recurring()  # synced
        ticker = ops.app.extensions["defer"].recurring
        table = ticker.store.table
        with ticker.store.engine.begin() as conn:  # no worker wrote the tick an hour ago
            conn.execute(
                update(table).values(next_run_at=utcnow() - timedelta(hours=1))
            )
    html = client.get("/defer/").get_data(as_text=True)
    assert 'data-defer-figure="late-schedules"' in html
    assert "1 recurring schedule</strong>" in html


def test_the_jobs_dashboard_names_schedules_no_running_code_declares(ops: OpsApp) -> None:
    client = signed_in(ops)
    assert 'data-defer-figure="undeclared-schedules"' not in client.get("/defer/").get_data(
        as_text=True
    )
    with ops.context():
        ops.defer.list_recurring()  # synced: its own schedules are declared by it
        ticker = ops.app.extensions["defer"].recurring
        rule = make_rule("0 9 * * *", None, "UTC")
        gone = make_spec("gone-report", "sync_invoices", rule, {}, "latest")
        # Declared an hour ago by a release that no longer runs.
        an_hour_ago = utcnow() - timedelta(hours=1)
        ticker.store.sync([gone], now=an_hour_ago, orphan_grace=timedelta(days=1))
    html = client.get("/defer/").get_data(as_text=True)
    assert 'data-defer-figure="undeclared-schedules"' in html
    assert "1 recurring schedule</strong>" in html
    assert "not declared by any running code" in html
