"""Automation: a recurring schedule, a scheduled HTTP call, and a job that fails.

Three features that have no Undo button, so every one of them can still be tried
from a page: the weekly digest (``defer.recurring``: pause, resume, run it now), a
call to this demo's own webhook some seconds from now (``defer.schedule_http``, the
answer chosen in the form), and a sync with a partner API that is down (a handler
that always raises: retried with backoff, then a dead letter on the dashboard).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from flask import (
    Blueprint,
    abort,
    current_app,
    flash,
    redirect,
    render_template,
    request,
    url_for,
)
from sqlalchemy import select

from flask_defer import InvalidArgument, JobStatus, ScheduleNotFound
from flask_defer.features.http_jobs import HTTP_JOB

from .jobs import DIGEST_SCHEDULE, SYNC_PARTNER
from .models import WebhookCall, db, defer, utcnow
from .users import require_user

bp = Blueprint("automation", __name__, url_prefix="/automation")

#: What the demo's webhook can be told to answer, and what flask_defer then does.
ANSWERS = {
    200: "200 OK: the job is done",
    503: "503 Service Unavailable: retried with backoff",
    404: "404 Not Found: failed at once, no retry",
}

#: The header carrying the webhook's signature (an HMAC of the JSON body).
SIGNATURE = "X-Demo-Signature"


def sign(body: dict[str, Any]) -> str:
    """The webhook's signature of *body*: only this app's jobs can call it."""
    key = str(current_app.config["SECRET_KEY"]).encode()
    text = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, text, hashlib.sha256).hexdigest()


def _context(owner: str) -> dict[str, Any]:
    calls = defer.list(name=HTTP_JOB, owner=owner, limit=8)
    syncs = defer.list(name=SYNC_PARTNER, owner=owner, limit=5)
    received = list(
        db.session.scalars(
            select(WebhookCall)
            .where(WebhookCall.owner == owner)
            .order_by(WebhookCall.id.desc())
            .limit(8)
        )
    )
    digest = next((s for s in defer.list_recurring() if s.id == DIGEST_SCHEDULE), None)
    live = (JobStatus.PENDING, JobStatus.RUNNING)
    return {
        "digest": digest,
        "calls": calls,
        "syncs": syncs,
        "received": received,
        "answers": ANSWERS,
        "polling": any(job.status in live for job in [*calls, *syncs]),
        "now": utcnow(),
    }


@bp.get("/")
def index() -> Any:
    user = require_user()
    return render_template("automation/index.html", **_context(user.id))


@bp.get("/live")
def live() -> Any:
    """The job lists alone: polled every second while one of them is still live."""
    user = require_user()
    return render_template("automation/_live.html", **_context(user.id))


@bp.post("/digest/<action>")
def digest(action: str) -> Any:
    """Pause, resume or run the weekly digest now (an operator's controls, for anyone)."""
    require_user()
    try:
        if action == "pause":
            changed = defer.pause_recurring(DIGEST_SCHEDULE)
            flash("Weekly digest paused." if changed else "It was already paused.", "info")
        elif action == "resume":
            changed = defer.resume_recurring(DIGEST_SCHEDULE)
            flash("Weekly digest resumed." if changed else "It was not paused.", "info")
        elif action == "run-now":
            defer.run_recurring_now(DIGEST_SCHEDULE)
            flash("One extra digest is due now: see Notifications in a moment.", "info")
        else:
            abort(404)
    except ScheduleNotFound:  # pragma: no cover - declared at import, synced on demand
        abort(404)
    return redirect(url_for("automation.index"), code=303)


@bp.post("/call")
def schedule_call() -> Any:
    """Schedule a POST to this demo's own webhook, ``delay`` seconds from now."""
    user = require_user()
    try:
        delay = int(request.form.get("delay", "10"))
        answer = int(request.form.get("answer", "200"))
    except ValueError:
        delay, answer = -1, -1
    if not 1 <= delay <= 3600 or answer not in ANSWERS:
        flash("Pick a delay of 1 to 3600 seconds and one of the answers.", "error")
        return redirect(url_for("automation.index"), code=303)
    body = {"owner": user.id, "answer": answer, "note": f"scheduled {delay} s ahead"}
    try:
        defer.schedule_http(
            # This demo's own URL: DEFER_HTTP_ALLOWED_HOSTS lets calls go to localhost only.
            url_for("automation.webhook", _external=True),
            json=body,
            headers={SIGNATURE: sign(body)},
            delay=delay,
            owner=user.id,
            label=f"Calling the webhook (it will answer {answer})",
        )
    except InvalidArgument as error:  # the demo was reached under another host name
        db.session.rollback()
        flash(f"Not scheduled: {error}", "error")
        return redirect(url_for("automation.index"), code=303)
    db.session.commit()
    flash(f"The webhook will be called in {delay} s.", "info")
    return redirect(url_for("automation.index"), code=303)


@bp.post("/webhook")
def webhook() -> Any:
    """The receiving end: what another service's webhook would be. Signed calls only."""
    body = request.get_json(silent=True)
    if not isinstance(body, dict) or not hmac.compare_digest(
        request.headers.get(SIGNATURE, ""), sign(body)
    ):
        abort(403)
    answer = body.get("answer")
    if answer not in ANSWERS or not isinstance(body.get("owner"), str):
        abort(400)
    db.session.add(WebhookCall(owner=body["owner"], note=str(body.get("note", ""))[:200],
                               answered=answer))  # fmt: skip
    db.session.commit()
    return {"received": True, "answer": answer}, answer


@bp.post("/sync")
def sync() -> Any:
    """Start a sync with the partner API, which is down: watch it fail three times."""
    user = require_user()
    defer.schedule(SYNC_PARTNER, {"partner": "partner.example"}, owner=user.id,
                   label="Syncing with the partner API")  # fmt: skip
    db.session.commit()
    flash("Sync started. The partner is down: watch it retry, then fail.", "info")
    return redirect(url_for("automation.index"), code=303)
