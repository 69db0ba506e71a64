"""The Undo blueprint over HTTP, on SQLite and PostgreSQL.

A real app (``tests/undo_app``) driven by Flask's test client: toasts, the Undo
endpoint for htmx and for plain forms, ownership, CSRF and hostile input.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from flask.testing import FlaskClient

from flask_defer import JobStatus
from flask_defer.web.redirects import safe_local_target

from ..undo_app import MailApp, create_app

HTMX = {"HX-Request": "true"}


@pytest.fixture
def make_mail(database_url: str) -> Iterator[Callable[..., MailApp]]:
    """Factory for the mail app on the backend under test."""
    made: list[MailApp] = []

    def make(**options: Any) -> MailApp:
        mail = create_app(database_url, TESTING=True, **options)
        made.append(mail)
        return mail

    yield make
    for mail in made:
        mail.dispose()


@pytest.fixture
def mail(make_mail: Callable[..., MailApp]) -> MailApp:
    return make_mail()


def token_of(client: FlaskClient, path: str = "/") -> str:
    """The CSRF token the page at *path* gives this browser."""
    html = client.get(path).get_data(as_text=True)
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found, "no CSRF token on the page"
    return found.group(1)


def send(client: FlaskClient, **form: str) -> int:
    """Click Send on the compose page; return the undoable job's id."""
    response = client.post("/send", data={"csrf_token": token_of(client), **form})
    assert response.status_code == 303
    return int(parse_qs(urlsplit(response.headers["Location"]).query)["sent"][0])


def status_of(mail: MailApp, job_id: int) -> JobStatus:
    with mail.context():
        job = mail.defer.get(job_id)
        assert job is not None
        return job.status


def run_due_at_run_at(mail: MailApp, job_id: int) -> None:
    with mail.context():
        job = mail.defer.get(job_id)
        assert job is not None
        mail.defer.run_due(now=job.run_at)


# -- toasts -------------------------------------------------------------------------------


def test_a_page_shows_the_toast_with_the_servers_remaining_seconds(mail: MailApp) -> None:
    client = mail.app.test_client()
    job_id = send(client, label="Message sent")
    html = client.get("/inbox").get_data(as_text=True)
    toast = re.search(rf'id="defer-toast-{job_id}".*?data-defer-remaining="([0-9.]+)"', html, re.S)
    assert toast, html
    assert 4.0 < float(toast.group(1)) <= 5.0
    assert "Message sent" in html
    assert f'action="/defer/undo/{job_id}"' in html
    assert html.count("defer/defer.css") == 1 and "htmx-2.0.11.min.js" in html
    assert 'aria-live="polite"' in html


def test_a_new_visitor_sees_no_toasts_and_gets_no_cookie(mail: MailApp) -> None:
    owner = mail.app.test_client()
    send(owner)
    visitor = mail.app.test_client()
    response = visitor.get("/defer/toasts")
    assert response.status_code == 200
    assert "defer-toast" not in response.get_data(as_text=True)
    assert "Set-Cookie" not in response.headers
    assert response.headers["Cache-Control"] == "no-store"


def test_the_toasts_fragment_lists_the_owners_live_toasts(mail: MailApp) -> None:
    client = mail.app.test_client()
    first = send(client, label="First")
    second = send(client, label="Second")
    html = client.get(
        "/defer/toasts", headers={**HTMX, "HX-Current-URL": "http://localhost/inbox?x=1"}
    ).get_data(as_text=True)
    # Oldest first, so the newest sits nearest the corner.
    assert html.index(f'data-defer-toast="{first}"') < html.index(f'data-defer-toast="{second}"')
    assert 'name="next" value="/inbox?x=1"' in html


def test_a_toast_is_gone_once_its_window_closed(mail: MailApp) -> None:
    client = mail.app.test_client()
    job_id = send(client)
    with mail.context():
        job = mail.defer.get(job_id)
        assert job is not None and job.undo_until is not None
        assert mail.defer.toasts(job.owner, now=job.undo_until) == []


def test_the_toast_limit_shows_the_newest(make_mail: Callable[..., MailApp]) -> None:
    mail = make_mail(DEFER_TOAST_LIMIT=2)
    client = mail.app.test_client()
    ids = [send(client) for _ in range(3)]
    html = client.get("/defer/toasts").get_data(as_text=True)
    assert f'data-defer-toast="{ids[0]}"' not in html
    assert f'data-defer-toast="{ids[2]}"' in html


def test_an_htmx_send_asks_the_page_to_refresh_its_toasts(mail: MailApp) -> None:
    client = mail.app.test_client()
    response = client.post("/send", data={"csrf_token": token_of(client)}, headers=HTMX)
    assert response.status_code == 204
    assert response.headers["HX-Trigger"] == "defer-toasts"
    plain = client.post("/send", data={"csrf_token": token_of(client)})
    assert "HX-Trigger" not in plain.headers


def test_the_refresh_trigger_joins_the_apps_own_triggers(mail: MailApp) -> None:
    @mail.app.post("/send-with-trigger/<style>")
    def send_with_trigger(style: str) -> Any:
        mail.defer.undoable("send_email", label="x")
        mail.db.session.commit()
        header = '{"saved": {"id": 1}}' if style == "json" else "saved, other"
        return "", 204, {"HX-Trigger": header}

    client = mail.app.test_client()
    as_json = client.post("/send-with-trigger/json", headers=HTMX)
    assert as_json.headers["HX-Trigger"] == '{"saved": {"id": 1}, "defer-toasts": true}'
    as_list = client.post("/send-with-trigger/list", headers=HTMX)
    assert as_list.headers["HX-Trigger"] == "saved, other, defer-toasts"


# -- undo: outcomes ------------------------------------------------------------------------


def test_htmx_undo_cancels_and_answers_undone(mail: MailApp) -> None:
    client = mail.app.test_client()
    job_id = send(client, label="Message sent")
    token = token_of(client)
    response = client.post(f"/defer/undo/{job_id}", headers={**HTMX, "X-CSRFToken": token})
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    assert 'data-defer-outcome="undone"' in html
    assert "Undone." in html and "“" not in html
    assert status_of(mail, job_id) is JobStatus.CANCELLED
    # A double click: harmless, and says so.
    again = client.post(f"/defer/undo/{job_id}", headers={**HTMX, "X-CSRFToken": token})
    assert 'data-defer-outcome="already_undone"' in again.get_data(as_text=True)


def test_undo_of_a_running_job_answers_too_late(mail: MailApp) -> None:
    client = mail.app.test_client()
    job_id = send(client)
    with mail.context():
        job = mail.defer.get(job_id)
        assert job is not None
        mail.defer.store.claim(
            now=job.run_at, limit=1, token="w", lease_until=job.run_at + timedelta(seconds=30)
        )
    response = client.post(
        f"/defer/undo/{job_id}", headers={**HTMX, "X-CSRFToken": token_of(client)}
    )
    assert response.status_code == 200
    assert "Too late — it is running now." in response.get_data(as_text=True)
    assert status_of(mail, job_id) is JobStatus.RUNNING


def test_undo_of_a_job_that_ran_answers_already_ran(mail: MailApp) -> None:
    client = mail.app.test_client()
    job_id = send(client)
    run_due_at_run_at(mail, job_id)
    response = client.post(
        f"/defer/undo/{job_id}", headers={**HTMX, "X-CSRFToken": token_of(client)}
    )
    assert 'data-defer-outcome="already_ran"' in response.get_data(as_text=True)
    assert status_of(mail, job_id) is JobStatus.DONE
    assert len(mail.sent) == 1


@pytest.mark.parametrize(
    ("failed_label", "said"),
    [("Couldn't send", "Too late — couldn't send."), (None, "Too late — it ran and failed.")],
)
def test_undo_of_a_job_that_failed_says_it_failed_not_that_it_was_sent(
    mail: MailApp, failed_label: str | None, said: str
) -> None:
    client = mail.app.test_client()
    form = {"subject": "FAIL", "done_label": "Sent"}
    if failed_label is not None:
        form["failed_label"] = failed_label
    job_id = send(client, **form)
    run_due_at_run_at(mail, job_id)
    assert status_of(mail, job_id) is JobStatus.FAILED
    response = client.post(
        f"/defer/undo/{job_id}", headers={**HTMX, "X-CSRFToken": token_of(client)}
    )
    page = html.unescape(response.get_data(as_text=True))
    assert said in page and "already sent" not in page
    assert 'data-defer-outcome="already_ran"' in page and 'data-defer-state="failed"' in page


def test_a_toast_replaced_by_a_newer_request_of_its_key_says_so(mail: MailApp) -> None:
    client = mail.app.test_client()
    first = send(client, key="draft:1", undone_label="Sending undone.")
    second = send(client, key="draft:1", replace="1", undone_label="Sending undone.")
    assert status_of(mail, first) is JobStatus.CANCELLED
    [answer] = states(client, first)
    assert (answer["state"], answer["text"]) == ("undone", "Replaced by a newer request.")
    response = client.post(
        f"/defer/undo/{first}", headers={**HTMX, "X-CSRFToken": token_of(client)}
    )
    page = response.get_data(as_text=True)
    assert "Replaced by a newer request." in page and "Already undone." not in page
    assert status_of(mail, second) is JobStatus.PENDING  # the newer one still goes


def test_an_operators_run_now_closes_the_undo_window_and_a_later_move_keeps_it(
    mail: MailApp,
) -> None:
    client = mail.app.test_client()
    hurried = send(client, window="30")
    moved = send(client, window="30")
    with mail.context():
        mail.defer.run_now(hurried, actor="ops")
        mail.defer.reschedule(moved, delay=timedelta(hours=1))
    answer = {job["id"]: job for job in states(client, hurried, moved)}
    assert answer[hurried]["state"] == "waiting"  # a worker may claim it now
    assert answer[moved]["state"] == "open"  # its window was never past its run_at
    response = client.post(
        f"/defer/undo/{moved}", headers={**HTMX, "X-CSRFToken": token_of(client)}
    )
    assert 'data-defer-outcome="undone"' in response.get_data(as_text=True)


def test_the_pending_page_keeps_cancel_for_a_job_due_that_no_worker_started(
    mail: MailApp,
) -> None:
    client = mail.app.test_client()
    job_id = send(client, window="30")
    with mail.context():
        mail.defer.run_now(job_id)  # due now; no worker runs here
    page = client.get("/defer/pending").get_data(as_text=True)
    row = page[page.index(f'id="defer-pending-{job_id}"') :]
    row = row[: row.index("</tr>")]
    assert "Due now, waiting to start" in row and ">Cancel</button>" in row
    assert 'data-defer-remaining="1000000000.000"' in row  # no countdown to "in progress"


def test_plain_post_undo_redirects_back_with_the_outcome_flashed(mail: MailApp) -> None:
    client = mail.app.test_client()
    job_id = send(client, label="Message sent")
    response = client.post(
        f"/defer/undo/{job_id}", data={"csrf_token": token_of(client), "next": "/inbox?page=2"}
    )
    assert response.status_code == 303
    assert response.headers["Location"] == "/inbox?page=2"
    page = client.get("/inbox?page=2").get_data(as_text=True)
    assert "Undone." in page
    assert 'data-defer-outcome="undone"' in page
    assert f'id="defer-toast-{job_id}"' not in page
    # Flashed once: the next page is clean.
    next_page = client.get("/inbox").get_data(as_text=True)
    assert "Undone." not in next_page and 'data-defer-outcome="undone"' not in next_page
    assert status_of(mail, job_id) is JobStatus.CANCELLED


def test_plain_post_undo_after_it_ran_flashes_too_late(mail: MailApp) -> None:
    client = mail.app.test_client()
    job_id = send(client, label="Message sent")
    run_due_at_run_at(mail, job_id)
    response = client.post(
        f"/defer/undo/{job_id}",
        data={"csrf_token": token_of(client), "next": "/"},
        follow_redirects=True,
    )
    assert "Too late — it already ran." in response.get_data(as_text=True)


# -- ownership -----------------------------------------------------------------------------


def test_another_owner_gets_404_and_cannot_see_the_toast(mail: MailApp) -> None:
    alice = mail.app.test_client()
    job_id = send(alice)
    # Mallory is a real owner with a job of her own, so the owner check is reached
    # (a visitor without an owner id is refused before it).
    mallory = mail.app.test_client()
    own_id = send(mallory)
    token = token_of(mallory)
    with mail.context():
        own, alices = mail.defer.get(own_id), mail.defer.get(job_id)
        assert own is not None and alices is not None and own.owner
        assert own.owner != alices.owner
    assert f"defer-toast-{own_id}" in mallory.get("/").get_data(as_text=True)
    assert f"defer-toast-{job_id}" not in mallory.get("/").get_data(as_text=True)
    assert f"defer-toast-{job_id}" not in mallory.get("/defer/toasts").get_data(as_text=True)
    for headers, data in (({**HTMX, "X-CSRFToken": token}, None), ({}, {"csrf_token": token})):
        response = mallory.post(f"/defer/undo/{job_id}", headers=headers, data=data)
        assert response.status_code == 404
    assert status_of(mail, job_id) is JobStatus.PENDING
    # After it ran, still 404 (never "too late") for someone else.
    run_due_at_run_at(mail, job_id)
    response = mallory.post(f"/defer/undo/{job_id}", headers={**HTMX, "X-CSRFToken": token})
    assert response.status_code == 404


def test_a_visitor_without_an_owner_id_gets_404(mail: MailApp) -> None:
    alice = mail.app.test_client()
    job_id = send(alice)
    stranger = mail.app.test_client()
    token = token_of(stranger)  # a CSRF token, but no owner id in the session yet
    response = stranger.post(f"/defer/undo/{job_id}", headers={**HTMX, "X-CSRFToken": token})
    assert response.status_code == 404


def test_flask_login_users_own_their_toasts(make_mail: Callable[..., MailApp]) -> None:
    mail = make_mail(login=True)
    client = mail.app.test_client()
    client.get("/login/alice")
    job_id = send(client)
    with mail.context():
        assert mail.defer.get(job_id).owner == "alice"  # type: ignore[union-attr]
    client.get("/login/bob")
    assert f"defer-toast-{job_id}" not in client.get("/").get_data(as_text=True)
    response = client.post(
        f"/defer/undo/{job_id}", headers={**HTMX, "X-CSRFToken": token_of(client)}
    )
    assert response.status_code == 404
    # Alice, from another browser, sees and undoes it.
    other_browser = mail.app.test_client()
    other_browser.get("/login/alice")
    assert f"defer-toast-{job_id}" in other_browser.get("/").get_data(as_text=True)
    response = other_browser.post(
        f"/defer/undo/{job_id}", headers={**HTMX, "X-CSRFToken": token_of(other_browser)}
    )
    assert 'data-defer-outcome="undone"' in response.get_data(as_text=True)


# -- CSRF ----------------------------------------------------------------------------------


def test_undo_without_a_csrf_token_is_refused(mail: MailApp) -> None:
    client = mail.app.test_client()
    job_id = send(client)
    assert client.post(f"/defer/undo/{job_id}", headers=HTMX).status_code == 400
    assert client.post(f"/defer/undo/{job_id}", data={"next": "/"}).status_code == 400
    bad = client.post(f"/defer/undo/{job_id}", headers={**HTMX, "X-CSRFToken": "x" * 43})
    assert bad.status_code == 400
    assert status_of(mail, job_id) is JobStatus.PENDING


def test_a_csrf_token_of_another_browser_is_refused(mail: MailApp) -> None:
    alice = mail.app.test_client()
    job_id = send(alice)
    other_token = token_of(mail.app.test_client())
    response = alice.post(f"/defer/undo/{job_id}", headers={**HTMX, "X-CSRFToken": other_token})
    assert response.status_code == 400
    assert status_of(mail, job_id) is JobStatus.PENDING


def test_flask_wtf_tokens_are_used_when_csrfprotect_is_on(
    make_mail: Callable[..., MailApp],
) -> None:
    mail = make_mail(flask_wtf=True)
    client = mail.app.test_client()
    job_id = send(client)
    with client.session_transaction() as session:
        assert "_defer_csrf" not in session  # Flask-WTF's token, not ours
        assert "csrf_token" in session
    assert client.post(f"/defer/undo/{job_id}", headers=HTMX).status_code == 400
    response = client.post(
        f"/defer/undo/{job_id}", headers={**HTMX, "X-CSRFToken": token_of(client)}
    )
    assert 'data-defer-outcome="undone"' in response.get_data(as_text=True)
    second = send(client)
    form = client.post(f"/defer/undo/{second}", data={"csrf_token": token_of(client)})
    assert form.status_code == 303


# -- hostile input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/defer/undo/abc",
        "/defer/undo/-1",
        "/defer/undo/1.5",
        "/defer/undo/0",
        "/defer/undo/%00",
        "/defer/undo/1%0a",
        "/defer/undo/" + "9" * 30,
        "/defer/undo/9223372036854775808",
        "/defer/undo/9223372036854775807",
        "/defer/undo/1/../2",
    ],
)
def test_hostile_ids_answer_404(mail: MailApp, path: str) -> None:
    client = mail.app.test_client()
    send(client)
    response = client.post(path, headers={**HTMX, "X-CSRFToken": token_of(client)})
    assert response.status_code == 404


def test_undo_only_accepts_post(mail: MailApp) -> None:
    client = mail.app.test_client()
    job_id = send(client)
    assert client.get(f"/defer/undo/{job_id}").status_code == 405
    assert status_of(mail, job_id) is JobStatus.PENDING


@pytest.mark.parametrize(
    "target",
    [
        "https://evil.example/",
        "//evil.example/path",
        "///evil.example",
        "/\\evil.example",
        "\\\\evil.example",
        "javascript:alert(1)",
        "/ok\r\nSet-Cookie: a=b",
        "/tab\tnull",
        "evil.example",
        "",
        "/" + "a" * 5000,
    ],
)
def test_bad_redirect_targets_fall_back_to_the_pending_page(mail: MailApp, target: str) -> None:
    client = mail.app.test_client()
    job_id = send(client)
    response = client.post(
        f"/defer/undo/{job_id}", data={"csrf_token": token_of(client), "next": target}
    )
    assert response.status_code == 303
    assert response.headers["Location"] == "/defer/pending"


@pytest.mark.parametrize("target", ["/", "/inbox?page=2&q=%20x", "/a/b#frag"])
def test_local_redirect_targets_are_kept(target: str) -> None:
    assert safe_local_target(target) == target


# -- the pending page and the templates ----------------------------------------------------


def test_pending_page_lists_the_owners_undoable_and_scheduled_jobs(mail: MailApp) -> None:
    client = mail.app.test_client()
    undoable_id = send(client, label="Message sent")
    with client.session_transaction() as session:
        owner = session["_defer_owner"]
    with mail.context():
        scheduled = mail.defer.schedule(
            "send_email", delay=timedelta(hours=2), owner=owner, label="Publish post"
        )
        foreign = mail.defer.schedule("send_email", delay=60, owner="someone", label="Secret")
        mail.db.session.commit()
    html = client.get(
        "/defer/pending", headers={"Referer": "http://localhost/inbox?page=2"}
    ).get_data(as_text=True)
    assert '<a href="/inbox?page=2" id="defer-back-link">← Back</a>' in html
    assert "Message sent" in html and "Undo possible for" in html
    assert "Publish post" in html and "Runs in" in html and "2 h" in html
    assert "Secret" not in html and f"defer-pending-{foreign.id}" not in html
    token = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert token
    response = client.post(
        f"/defer/undo/{scheduled.id}",
        data={"csrf_token": token.group(1), "next": "/defer/pending"},
        follow_redirects=True,
    )
    assert "Undone." in response.get_data(as_text=True)
    assert status_of(mail, undoable_id) is JobStatus.PENDING


def test_pending_page_of_a_new_visitor_is_empty(mail: MailApp) -> None:
    response = mail.app.test_client().get(
        "/defer/pending", headers={"Referer": "https://evil.example/"}
    )
    assert response.status_code == 200
    assert "evil.example" not in response.get_data(as_text=True)
    assert "Nothing is waiting." in response.get_data(as_text=True)


def test_the_apps_templates_override_the_blueprints(
    make_mail: Callable[..., MailApp], tmp_path: Path
) -> None:
    folder = tmp_path / "templates"
    (folder / "defer").mkdir(parents=True)
    base = Path(__file__).parent.parent / "undo_app" / "templates"
    for name in ("base.html", "compose.html", "inbox.html"):
        (folder / name).write_text((base / name).read_text())
    (folder / "defer" / "_toast.html").write_text(
        '<p class="my-toast">{{ toast.label }}: {{ toast.seconds_left|round|int }} s</p>'
    )
    mail = make_mail(template_folder=folder)
    client = mail.app.test_client()
    send(client, label="Custom")
    html = client.get("/").get_data(as_text=True)
    # The app's own toast, counting down the 5 s window (4 once a loaded machine took
    # more than half a second between the send and the page).
    shown = re.search(r'<p class="my-toast">Custom: (\d+) s</p>', html)
    assert shown is not None, html
    assert 1 <= int(shown.group(1)) <= 5


def test_the_url_prefix_is_configurable(make_mail: Callable[..., MailApp]) -> None:
    mail = make_mail(DEFER_URL_PREFIX="/jobs/ui")
    client = mail.app.test_client()
    job_id = send(client)
    html = client.get("/").get_data(as_text=True)
    assert f'action="/jobs/ui/undo/{job_id}"' in html
    assert "/jobs/ui/static/defer/defer.js" in html
    asset = client.get("/jobs/ui/static/defer/defer.js")
    assert asset.status_code == 200
    asset.close()
    assert client.get("/defer/toasts").status_code == 404


def test_the_blueprint_serves_its_assets(mail: MailApp) -> None:
    client = mail.app.test_client()
    for name in ("defer.css", "defer.js", "htmx-2.0.11.min.js", "htmx.LICENSE"):
        response = client.get(f"/defer/static/defer/{name}")
        assert response.status_code == 200, name
        response.close()


def test_defer_toasts_links_its_assets_once_per_page(mail: MailApp) -> None:
    with mail.app.test_request_context("/"):
        from flask import render_template_string

        html = render_template_string(
            "{{ defer_toasts() }}{{ defer_toasts() }}{{ defer_toasts(htmx=False) }}"
        )
    assert html.count("defer/defer.css") == 1
    assert html.count("defer/defer.js") == 1


# -- states, hold, translations ------------------------------------------------------------


def states(client: FlaskClient, *ids: int) -> list[dict[str, Any]]:
    query = "&".join(f"id={i}" for i in ids)
    response = client.get(f"/defer/toasts/state?{query}")
    assert response.status_code == 200
    assert response.headers["Cache-Control"] == "no-store"
    jobs: list[dict[str, Any]] = response.get_json()["jobs"]
    return jobs


def test_a_toast_carries_its_state_and_the_texts_of_the_others(mail: MailApp) -> None:
    client = mail.app.test_client()
    job_id = send(client, done_label="Sent", failed_label="Couldn't send", waiting_label="Sending…")
    html = client.get("/").get_data(as_text=True)
    assert f'data-defer-toast="{job_id}"' in html and 'data-defer-state="open"' in html
    assert 'data-defer-text-done="Sent"' in html
    assert 'data-defer-text-failed="Couldn&#39;t send"' in html
    assert 'data-defer-text-announce="Message sent. Press Z to undo."' in html


def test_after_the_window_a_reload_renders_the_toast_waiting_not_done(mail: MailApp) -> None:
    client = mail.app.test_client()
    job_id = send(client, window="0.2", waiting_label="Sending…")
    import time

    time.sleep(0.3)
    html = client.get("/").get_data(as_text=True)
    assert f'data-defer-toast="{job_id}"' in html
    assert 'data-defer-state="waiting"' in html and "Sending…</p>" in html
    assert "defer-toast__form" not in html  # no Undo once the window closed
    assert [j["state"] for j in states(client, job_id)] == ["waiting"]
    run_due_at_run_at(mail, job_id)
    assert f'data-defer-toast="{job_id}"' not in client.get("/").get_data(as_text=True)


def test_the_state_endpoint_answers_the_owners_jobs_only(mail: MailApp) -> None:
    alice = mail.app.test_client()
    sent_id = send(alice, done_label="Sent")
    failing_id = send(alice, subject="FAIL", failed_label="Couldn't send")
    bob = mail.app.test_client()
    send(bob)
    run_due_at_run_at(mail, sent_id)
    run_due_at_run_at(mail, failing_id)
    answer = {j["id"]: j for j in states(alice, sent_id, failing_id, 999999, 0)}
    assert set(answer) == {sent_id, failing_id}
    assert answer[sent_id]["state"] == "done" and answer[sent_id]["text"] == "Sent"
    assert answer[sent_id]["status"] == "done"
    assert answer[failing_id]["state"] == "failed"
    assert answer[failing_id]["text"] == "Couldn't send"
    assert states(bob, sent_id, failing_id) == []  # someone else's ids: like missing ones
    assert mail.app.test_client().get(f"/defer/toasts/state?id={sent_id}").get_json() == {
        "jobs": []
    }


HOSTILE_LABEL = "<img src=x onerror=\"document.title='pwned'\"> & <script>alert(1)</script>"


def test_the_state_json_escapes_html_in_labels(mail: MailApp) -> None:
    client = mail.app.test_client()
    job_id = send(client, label=HOSTILE_LABEL, undone_label=HOSTILE_LABEL)
    response = client.get(f"/defer/toasts/state?id={job_id}")
    body = response.get_data(as_text=True)
    assert response.mimetype == "application/json"
    for raw in "<>&'":
        assert raw not in body, raw
    assert "\\u003cscript\\u003e" in body and "\\u0026" in body
    # ... and any JSON parser reads the label back exactly.
    assert response.get_json()["jobs"][0]["text"] == HOSTILE_LABEL
    token = token_of(client)
    client.post(f"/defer/undo/{job_id}", headers={**HTMX, "X-CSRFToken": token})
    undone = client.get(f"/defer/toasts/state?id={job_id}")
    assert "<" not in undone.get_data(as_text=True)
    assert undone.get_json()["jobs"][0]["text"] == HOSTILE_LABEL


ARABIC_INDIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")


@pytest.mark.parametrize(
    "hostile",
    [
        "0",
        "-1",
        str(2**63),
        "9" * 5000,
        "١",  # an Arabic-Indic one: int() reads it as job 1
        "arabic-indic own id",  # the real id in Arabic-Indic digits
        "²",  # a superscript two: str.isdigit() says yes, int() raises
        "１",  # a fullwidth one
        "1e3",
        "abc",
        "+1",
        " 1",
        "1_0",
        "",
    ],
    ids=lambda value: value if value.isascii() and len(value) < 30 else ascii(value)[:30],
)
def test_the_state_endpoint_ignores_values_that_are_not_ids(mail: MailApp, hostile: str) -> None:
    client = mail.app.test_client()
    first = send(client)
    second = send(client)
    if hostile == "arabic-indic own id":
        hostile = str(first).translate(ARABIC_INDIC)
    response = client.get("/defer/toasts/state", query_string=[("id", hostile), ("id", second)])
    assert response.status_code == 200
    # Only the well-formed own id is answered, even where the hostile value names
    # another of this owner's jobs in another script.
    assert [job["id"] for job in response.get_json()["jobs"]] == [second]


def test_a_dashboard_cancel_runs_the_undo_hooks_and_tells_the_owner(
    make_mail: Callable[..., MailApp],
) -> None:
    mail = make_mail(DEBUG=True)  # debug mode opens the dashboard without an auth hook
    undone: list[int] = []
    mail.defer.on_undo("send_email")(lambda job: undone.append(job.id))
    alice = mail.app.test_client()
    job_id = send(alice, undone_label="Sending undone.")
    german = send(alice)
    operator = mail.app.test_client()
    token = token_of(operator)  # the same session token the dashboard sends
    for each in (job_id, german):
        response = operator.post(
            f"/defer/jobs/{each}/cancel", headers={**HTMX, "X-CSRFToken": token}
        )
        assert response.status_code == 200
    assert undone == [job_id, german]  # the same hooks as the owner's Undo
    with mail.context():
        assert mail.defer.history(job_id)[-1].event == "cancelled"
    [answer] = states(alice, job_id)
    assert answer["state"] == "undone" and answer["status"] == "cancelled"
    assert answer["text"] == "Cancelled by an operator."  # not "Sending undone."
    response = alice.get(f"/defer/toasts/state?id={german}", headers={"Accept-Language": "de"})
    assert response.get_json()["jobs"][0]["text"] == "Von einem Operator abgebrochen."
    response = alice.get(f"/defer/toasts/state?id={german}", headers={"Accept-Language": "fr"})
    assert response.get_json()["jobs"][0]["text"] == "Annulé par un opérateur."
    # A late click on Undo says who got there first, and runs nothing again.
    undo = alice.post(f"/defer/undo/{job_id}", headers={**HTMX, "X-CSRFToken": token_of(alice)})
    assert "Cancelled by an operator." in undo.get_data(as_text=True)
    assert undone == [job_id, german]
    # The owner's own Undo still reads as theirs.
    own = send(alice, undone_label="Sending undone.")
    alice.post(f"/defer/undo/{own}", headers={**HTMX, "X-CSRFToken": token_of(alice)})
    assert states(alice, own)[0]["text"] == "Sending undone."


def hold(client: FlaskClient, job_id: int, seconds: float, token: str | None) -> Any:
    headers = {"X-CSRFToken": token} if token else {}
    return client.post(f"/defer/hold/{job_id}", data={"seconds": seconds}, headers=headers)


def test_hold_keeps_the_owners_window_open(mail: MailApp) -> None:
    client = mail.app.test_client()
    job_id = send(client)
    with mail.context():
        before = mail.defer.get(job_id)
    assert before is not None
    response = hold(client, job_id, 9, token_of(client))
    assert response.status_code == 200
    body = response.get_json()
    assert body["state"] == "open" and body["capped"] is False
    assert 8.5 < body["seconds_left"] <= 9
    with mail.context():
        after = mail.defer.get(job_id)
    assert after is not None and after.run_at > before.run_at + timedelta(seconds=3)


def test_hold_of_another_owners_job_answers_404_like_a_missing_one(mail: MailApp) -> None:
    alice = mail.app.test_client()
    job_id = send(alice)
    mallory = mail.app.test_client()
    send(mallory)  # mallory is an owner too
    token = token_of(mallory)
    foreign = hold(mallory, job_id, 9, token)
    missing = hold(mallory, 10**9, 9, token)
    assert foreign.status_code == missing.status_code == 404
    assert foreign.get_data() == missing.get_data()
    with mail.context():
        job = mail.defer.get(job_id)
    assert job is not None and job.undo_until is not None
    assert job.undo_until < job.created_at + timedelta(seconds=5.1)  # type: ignore[operator]


def test_hold_without_a_valid_csrf_token_is_refused(mail: MailApp) -> None:
    client = mail.app.test_client()
    job_id = send(client)
    assert hold(client, job_id, 9, None).status_code == 400
    assert hold(client, job_id, 9, "forged").status_code == 400
    assert hold(client, job_id, "soon", token_of(client)).status_code == 400  # type: ignore[arg-type]


def test_hold_of_a_job_that_is_not_open_answers_409_with_its_state(mail: MailApp) -> None:
    client = mail.app.test_client()
    job_id = send(client)
    token = token_of(client)
    client.post(f"/defer/undo/{job_id}", headers={**HTMX, "X-CSRFToken": token})
    response = hold(client, job_id, 9, token)
    assert response.status_code == 409
    assert response.get_json() == {"state": "undone"}
    ran_id = send(client)
    run_due_at_run_at(mail, ran_id)
    assert hold(client, ran_id, 9, token).get_json() == {"state": "done"}


def test_hold_stops_at_the_cap(make_mail: Callable[..., MailApp]) -> None:
    mail = make_mail(DEFER_UNDO_MAX_HOLD=timedelta(seconds=2))
    client = mail.app.test_client()
    job_id = send(client)
    response = hold(client, job_id, 30, token_of(client))
    assert response.status_code == 200 and response.get_json()["capped"] is True
    with mail.context():
        job = mail.defer.get(job_id)
    assert job is not None and job.run_at == job.due_at + timedelta(seconds=2)


def test_a_german_browser_reads_german_toasts_and_pages(mail: MailApp) -> None:
    client = mail.app.test_client()
    german = {"Accept-Language": "de-DE,de;q=0.9"}
    response = client.post(
        "/send", data={"csrf_token": token_of(client), "label": "Nachricht gesendet"}
    )
    job_id = int(parse_qs(urlsplit(response.headers["Location"]).query)["sent"][0])
    html = client.get("/", headers=german).get_data(as_text=True)
    assert "Rückgängig<span" in html
    announce = "Nachricht gesendet. Drücken Sie Z zum Rückgängigmachen."
    assert f'data-defer-text-announce="{announce}"' in html
    assert 'data-defer-locale="de"' in html
    assert 'data-defer-text-more="+{count} weitere"' in html  # the collapsed stack
    pending = client.get("/defer/pending", headers=german).get_data(as_text=True)
    assert "Ausstehende Aktionen" in pending and '<html lang="de">' in pending
    assert "← Zurück zur App</a>" in pending  # no referrer: the way back goes home
    token = token_of(client)
    answer = client.post(
        f"/defer/undo/{job_id}", headers={**HTMX, "X-CSRFToken": token, **german}
    ).get_data(as_text=True)
    assert "Rückgängig gemacht." in answer
    french = client.get("/defer/pending", headers={"Accept-Language": "fr"}).get_data(as_text=True)
    assert "Actions en attente" in french


def test_without_flask_babel_the_texts_are_english(make_mail: Callable[..., MailApp]) -> None:
    mail = make_mail(babel=False)
    client = mail.app.test_client()
    send(client)
    html = client.get("/", headers={"Accept-Language": "de"}).get_data(as_text=True)
    assert "Undo<span" in html and "data-defer-locale" not in html


# -- clickjacking ----------------------------------------------------------------------------


def blueprint_responses(mail: MailApp, client: FlaskClient) -> dict[str, Any]:
    """One response of each kind the blueprint serves: pages, fragments, errors, assets."""
    job_id = send(client)
    token = token_of(client)
    return {
        "dashboard": client.get("/defer/"),
        "job page": client.get(f"/defer/jobs/{job_id}"),
        "pending": client.get("/defer/pending"),
        "toasts": client.get("/defer/toasts"),
        "undo": client.post(f"/defer/undo/{job_id}", headers={**HTMX, "X-CSRFToken": token}),
        "404": client.post("/defer/undo/999999", headers={**HTMX, "X-CSRFToken": token}),
        "asset": client.get("/defer/static/defer/defer.js"),
    }


def test_every_blueprint_response_forbids_foreign_frames(make_mail: Callable[..., MailApp]) -> None:
    mail = make_mail(DEBUG=True)  # debug mode opens the dashboard without an auth hook
    for what, response in blueprint_responses(mail, mail.app.test_client()).items():
        assert response.headers.get("Content-Security-Policy") == "frame-ancestors 'self'", what
        assert response.headers.get("X-Frame-Options") == "SAMEORIGIN", what
        response.close()
    # The app's own pages are the app's business.
    assert "Content-Security-Policy" not in mail.app.test_client().get("/").headers


def every_blueprint_request(mail: MailApp, client: FlaskClient) -> dict[str, Any]:
    """A response of every route and method of the blueprint, and of its error paths.

    Built from the app's URL map, so a route added later is walked too.
    """
    job_id = send(client)
    plain_id = send(client)
    token = token_of(client)
    values = {"job_id": job_id, "schedule_id": "no-such-schedule", "filename": "defer/defer.js"}
    responses: dict[str, Any] = {}
    for rule in mail.app.url_map.iter_rules():
        if not rule.endpoint.startswith("defer."):
            continue
        path = rule.build({name: values[name] for name in rule.arguments})[1]
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            headers = {**HTMX, "X-CSRFToken": token} if method == "POST" else {}
            form = {"seconds": "1", "delay": "60"} if method == "POST" else None
            responses[f"{method} {path}"] = client.open(
                path, method=method, headers=headers, data=form
            )
    responses |= {
        "303 (plain-form Undo)": client.post(f"/defer/undo/{plain_id}", data={"csrf_token": token}),
        "404 (no route)": client.get("/defer/no-such-page"),
        "404 (no asset)": client.get("/defer/static/defer/no-such.js"),
        "404 (unknown id)": client.post(
            "/defer/undo/999999", headers={**HTMX, "X-CSRFToken": token}
        ),
        "405": client.get(f"/defer/undo/{job_id}"),
        "400 (no CSRF token)": client.post(f"/defer/hold/{job_id}", data={"seconds": "1"}),
        "JSON": client.get(f"/defer/toasts/state?id={job_id}"),
    }
    return responses


def test_every_route_of_the_blueprint_sends_nosniff_and_frame_headers(
    make_mail: Callable[..., MailApp],
) -> None:
    mail = make_mail(DEBUG=True, DEFER_METRICS=True)  # debug opens the dashboard
    responses = every_blueprint_request(mail, mail.app.test_client())
    assert len(responses) > 25
    statuses = set()
    for what, response in responses.items():
        statuses.add(response.status_code)
        assert response.headers.get("X-Content-Type-Options") == "nosniff", what
        assert response.headers.get("Content-Security-Policy") == "frame-ancestors 'self'", what
        assert response.headers.get("X-Frame-Options") == "SAMEORIGIN", what
        response.close()
    assert {200, 303, 400, 404, 405} <= statuses  # pages, redirects and errors alike
    # A refused dashboard (no auth hook outside debug mode) too.
    closed = make_mail().app.test_client().get("/defer/")
    assert closed.status_code == 403
    assert closed.headers.get("X-Content-Type-Options") == "nosniff"
    assert closed.headers.get("X-Frame-Options") == "SAMEORIGIN"
    # The app's own pages, and paths that only begin like the prefix, are left alone.
    for path in ("/", "/deferred", "/inbox"):
        response = mail.app.test_client().get(path)
        assert "X-Content-Type-Options" not in response.headers, path
        assert "Content-Security-Policy" not in response.headers, path


def test_frame_ancestors_is_configurable(make_mail: Callable[..., MailApp]) -> None:
    mail = make_mail(DEBUG=True, DEFER_FRAME_ANCESTORS="'self' https://admin.example.com")
    response = mail.app.test_client().get("/defer/")
    expected = "frame-ancestors 'self' https://admin.example.com"
    assert response.headers["Content-Security-Policy"] == expected
    assert "X-Frame-Options" not in response.headers  # it cannot name other hosts
    off = make_mail(DEBUG=True, DEFER_FRAME_ANCESTORS=None).app.test_client().get("/defer/")
    assert "Content-Security-Policy" not in off.headers


@pytest.mark.parametrize("value", ["'self'; script-src *", "", 7])
def test_frame_ancestors_refuses_values_that_would_change_other_directives(
    make_mail: Callable[..., MailApp], value: object
) -> None:
    from flask_defer import InvalidArgument

    with pytest.raises(InvalidArgument, match="DEFER_FRAME_ANCESTORS"):
        make_mail(DEFER_FRAME_ANCESTORS=value)
