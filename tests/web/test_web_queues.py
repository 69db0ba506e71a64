"""The dashboard's Queues page over HTTP (both backends): access, CSRF, pause and resume,
and the "paused" notes on the jobs list, a job's page and the health figures."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from flask.testing import FlaskClient

from flask_defer.web.queues import dom_id

from ..dashboard_app import OpsApp, create_app

HTMX = {"HX-Request": "true"}
PAGE = "/defer/queues"


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


def paused(ops: OpsApp) -> list[str]:
    with ops.context():
        return [pause.label for pause in ops.defer.paused()]


def row_of(html: str, kind: str, value: str) -> str:
    found = re.search(rf'<tr id="{dom_id(kind, value)}".*?</tr>', html, re.S)
    assert found, html
    return found.group(0)


def test_the_page_and_its_actions_are_closed_to_anonymous_users_and_non_operators(
    ops: OpsApp,
) -> None:
    assert ops.app.test_client().get(PAGE).status_code == 403
    client = signed_in(ops, "alice")
    assert client.get(PAGE).status_code == 403
    form = {"kind": "queue", "value": "digests"}
    assert client.post(f"{PAGE}/pause", data=form).status_code == 403
    assert ops.app.test_client().post(f"{PAGE}/pause", data=form).status_code == 403
    assert paused(ops) == []


def test_the_page_lists_queues_and_names_with_their_live_jobs(ops: OpsApp) -> None:
    with ops.context():
        for _ in range(2):
            ops.defer.schedule("send_digest")
        ops.defer.schedule("send_digest", delay=3600)
        ops.db.session.commit()
    html = signed_in(ops).get(PAGE).get_data(as_text=True)
    digests = row_of(html, "queue", "digests")
    assert 'data-defer-state="active"' in digests
    cells = re.findall(r'<td class="defer-num[^"]*">([^<]*)</td>', digests)
    assert cells == ["3", "2", "0"]  # pending, due, running
    assert "Pause" in digests and "queue digests" in digests
    name = row_of(html, "name", "send_digest")
    assert "<td>digests</td>" in name and 'href="/defer/?name=send_digest"' in name
    assert 'data-defer-queue="default"' in html


@pytest.mark.parametrize("htmx", [True, False], ids=["htmx", "plain-form"])
def test_pause_and_resume_a_queue_over_http_with_csrf(ops: OpsApp, htmx: bool) -> None:
    client = signed_in(ops)
    token = token_of(client)

    def post(action: str, **form: str) -> Any:
        url = f"{PAGE}/{action}"
        if htmx:
            return client.post(url, data=form, headers={**HTMX, "X-CSRFToken": token})
        return client.post(url, data={**form, "csrf_token": token, "next": PAGE})

    response = post("pause", kind="queue", value="digests")
    assert response.status_code == (200 if htmx else 303)
    assert paused(ops) == ["queue:digests"]
    with ops.context():
        (pause,) = ops.defer.paused()
    assert pause.actor == "admin"  # the signed-in operator
    if htmx:
        assert response.headers["HX-Trigger"] == "defer-jobs-changed"
        assert "Queue digests paused" in response.get_data(as_text=True)
        again = post("pause", kind="queue", value="digests").get_data(as_text=True)
        assert "Queue digests was already paused." in again
    else:
        assert response.headers["Location"].endswith(PAGE)
        page = client.get(PAGE).get_data(as_text=True)
        assert "Queue digests paused" in page
        assert 'data-defer-state="paused"' in row_of(page, "queue", "digests")
        assert "Resume" in row_of(page, "queue", "digests")
    response = post("resume", kind="queue", value="digests")
    assert paused(ops) == []
    if htmx:
        assert "Queue digests resumed" in response.get_data(as_text=True)
    else:
        assert "Queue digests resumed" in client.get(PAGE).get_data(as_text=True)


def test_a_job_name_pauses_from_its_row_and_names_are_sent_in_the_form(ops: OpsApp) -> None:
    client = signed_in(ops)
    headers = {**HTMX, "X-CSRFToken": token_of(client)}
    odd = "reports/q3 & more"  # any character: it travels in the form, not the URL
    response = client.post(f"{PAGE}/pause", data={"kind": "name", "value": odd}, headers=headers)
    assert response.status_code == 200
    assert f"Job name {odd} paused".replace("&", "&amp;") in response.get_data(as_text=True)
    html = client.get(PAGE).get_data(as_text=True)
    assert 'data-defer-state="paused"' in row_of(html, "name", odd)
    client.post(f"{PAGE}/resume", data={"kind": "name", "value": odd}, headers=headers)
    assert paused(ops) == []


@pytest.mark.parametrize("action", ["pause", "resume"])
def test_actions_without_a_valid_csrf_token_are_refused(ops: OpsApp, action: str) -> None:
    client = signed_in(ops)
    token_of(client)
    url = f"{PAGE}/{action}"
    form = {"kind": "queue", "value": "digests"}
    assert client.post(url, data=form, headers=HTMX).status_code == 400
    assert client.post(url, data={**form, "csrf_token": "forged"}).status_code == 400
    assert client.get(url).status_code == 405
    assert paused(ops) == []


@pytest.mark.parametrize(
    "form",
    [
        {"kind": "owner", "value": "x"},
        {"kind": "queue", "value": ""},
        {"value": "digests"},
        {"kind": "queue", "value": "q" * 101},
    ],
)
def test_a_bad_kind_or_value_answers_400(ops: OpsApp, form: dict[str, str]) -> None:
    client = signed_in(ops)
    headers = {**HTMX, "X-CSRFToken": token_of(client)}
    response = client.post(f"{PAGE}/pause", data=form, headers=headers)
    assert response.status_code == 400
    assert 'data-defer-result="refused"' in response.get_data(as_text=True)
    assert paused(ops) == []


def test_a_paused_queue_shows_on_the_jobs_list_the_job_page_and_the_health_figures(
    ops: OpsApp,
) -> None:
    with ops.context():
        waiting = ops.defer.schedule("send_digest")
        other = ops.defer.schedule("publish_post", {"post_id": 1})
        ops.db.session.commit()
        ops.defer.pause(queue="digests")
    client = signed_in(ops)
    html = client.get("/defer/").get_data(as_text=True)
    assert f'href="{PAGE}"' in html  # the nav links to the Queues page
    assert 'data-defer-figure="paused"' in html and "queue digests" in html
    rows = {
        int(m.group(1)): m.group(0)
        for m in re.finditer(r'<tr id="defer-row-(\d+)".*?</tr>', html, re.S)
    }
    assert "data-defer-paused" in rows[waiting.id]
    assert "Queue digests is paused" in rows[waiting.id]
    assert "data-defer-paused" not in rows[other.id]
    page = client.get(f"/defer/jobs/{waiting.id}").get_data(as_text=True)
    assert "data-defer-paused" in page
    with ops.context():
        ops.defer.resume(queue="digests")
    html = client.get("/defer/").get_data(as_text=True)
    assert "data-defer-paused" not in html and 'data-defer-figure="paused"' not in html
