"""Mail: compose, Send with a few seconds to Undo, and an outbox that shows what happened.

Send marks the message "sending" and schedules ``send_message`` with
``defer.undoable``, in one transaction. The toast's Undo cancels the job and the
``on_undo`` hook turns the message back into a draft; if nobody clicks, the worker runs
the handler and the message becomes "sent".
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, abort, current_app, flash, redirect, render_template, request, url_for
from sqlalchemy import select

from .jobs import SEND_MESSAGE, message_key
from .models import Message, OutboxEntry, db, defer
from .users import require_user

bp = Blueprint("mail", __name__, url_prefix="/mail")


def _messages(owner: str) -> list[Message]:
    return list(
        db.session.scalars(
            select(Message).where(Message.owner == owner).order_by(Message.id.desc()).limit(20)
        )
    )


def _outbox_context(owner: str) -> dict[str, Any]:
    messages = _messages(owner)
    deliveries = {
        entry.message_id: entry
        for entry in db.session.scalars(
            select(OutboxEntry).where(OutboxEntry.message_id.in_([m.id for m in messages]))
        )
    }
    return {"messages": messages, "deliveries": deliveries}


def _send(message: Message) -> None:
    """Mark *message* as sending and give its owner a few seconds to take it back."""
    message.status = "sending"
    db.session.flush()  # for message.id
    defer.undoable(
        SEND_MESSAGE,
        {"message_id": message.id},
        window=current_app.config["DEMO_MAIL_UNDO_WINDOW"],
        # The label shows while the job waits: it names the action, not an outcome.
        label=f"Sending “{_short(message.subject)}”",
        waiting_label="Sending…",
        done_label="Sent",
        failed_label="Couldn't send",
        undone_label="Sending undone.",
        key=message_key(message.id),
    )
    db.session.commit()  # the status and the job commit together, or neither does


def _short(text: str, limit: int = 32) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _own_draft(message_id: int, owner: str) -> Message:
    message = db.session.get(Message, message_id)
    if message is None or message.owner != owner:
        abort(404)
    return message


@bp.get("/")
def index() -> Any:
    """The compose form and the outbox; ``?edit=ID`` opens a draft in the form."""
    user = require_user()
    editing = None
    edit_id = request.args.get("edit", "")
    if edit_id.isdigit():
        editing = _own_draft(int(edit_id), user.id)
        if editing.status != "draft":
            flash("That message is not a draft any more.", "error")
            editing = None
    form = None
    if editing is not None:
        form = {"to": editing.recipient, "subject": editing.subject, "body": editing.body}
    return render_template(
        "mail/index.html", form=form, editing=editing, **_outbox_context(user.id)
    )


@bp.get("/outbox")
def outbox() -> Any:
    """The outbox alone: htmx fetches it when the toast says a job settled."""
    user = require_user()
    return render_template("mail/_outbox.html", **_outbox_context(user.id))


@bp.post("/send")
def send() -> Any:
    """Send a new message, or (with ``message_id``) an edited draft."""
    user = require_user()
    recipient = request.form.get("to", "").strip()
    subject = request.form.get("subject", "").strip()
    draft_id = request.form.get("message_id", "")
    editing = _own_draft(int(draft_id), user.id) if draft_id.isdigit() else None
    if not recipient or not subject:
        flash("A message needs a recipient and a subject.", "error")
        return render_template(
            "mail/index.html", form=request.form, editing=editing, **_outbox_context(user.id)
        ), 422
    if editing is not None and editing.status != "draft":
        flash("That message is not a draft any more.", "error")
        return redirect(url_for("mail.index"), code=303)
    message = editing or Message(owner=user.id)
    message.recipient = recipient[:200]
    message.subject = subject[:200]
    message.body = request.form.get("body", "")
    db.session.add(message)
    _send(message)
    return redirect(url_for("mail.index"), code=303)


@bp.post("/<int:message_id>/send")
def send_again(message_id: int) -> Any:
    """Send a draft (one brought back by Undo) again, with a fresh Undo window."""
    user = require_user()
    message = db.session.get(Message, message_id)
    if message is None or message.owner != user.id:
        abort(404)
    if message.status != "draft":
        flash("That message is not a draft any more.", "error")
    else:
        _send(message)
    return redirect(url_for("mail.index"), code=303)
