"""The demo's job handlers: what happens *later*, run by a flask_defer worker.

Every handler re-checks the state it acts on, because jobs run at least once (a
worker can die after the work and before recording it). ``atomic=True`` makes the
handler's ``db.session`` work commit in the same transaction as the job's ``done``
mark, so for these database-only effects a job takes effect exactly once.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy import func, select

from flask_defer import Job

from .models import Comment, Message, Notification, OutboxEntry, Post, db, defer, utcnow
from .users import USERS

log = logging.getLogger("demo_app")

SEND_MESSAGE = "send_message"
NOTIFY_COMMENTS = "notify_comments"
PUBLISH_POST = "publish_post"
WEEKLY_DIGEST = "weekly_digest"
SYNC_PARTNER = "sync_partner"

#: The recurring schedule of the weekly digest (``defer.recurring`` below).
DIGEST_SCHEDULE = "weekly-digest"


def message_key(message_id: int) -> str:
    return f"message:{message_id}:send"


def comments_key(post_id: int) -> str:
    return f"post:{post_id}:comments"


def publish_key(post_id: int) -> str:
    return f"post:{post_id}:publish"


@defer.job(SEND_MESSAGE, atomic=True, max_attempts=5)
def send_message(job: Job) -> None:
    """Hand the message to the (fake) mail server: a row in ``outbox`` and a log line."""
    message = db.session.get(Message, job.payload["message_id"])
    if message is None or message.status != "sending":
        # Undone (draft again) or already sent by an earlier run: nothing to do.
        log.info(
            "message %s: not sending (status %s)",
            job.payload["message_id"],
            message.status if message else "gone",
        )
        return
    db.session.add(
        OutboxEntry(message_id=message.id, recipient=message.recipient, subject=message.subject)
    )
    message.status = "sent"
    message.sent_at = utcnow()
    log.info("delivered message %s to %s: %r", message.id, message.recipient, message.subject)


@defer.on_undo(SEND_MESSAGE)
def keep_as_draft(job: Job) -> None:
    """Undo of a send: the message goes back to being a draft (same transaction)."""
    message = db.session.get(Message, job.payload["message_id"])
    if message is not None and message.status == "sending":
        message.status = "draft"


@defer.job(NOTIFY_COMMENTS, atomic=True)
def notify_comments(job: Job) -> None:
    """One notification for a whole batch of comments: "3 new comments on …"."""
    items = job.payload["items"]
    post = db.session.get(Post, items[0]["post_id"])
    if post is None:
        return
    ids = [item["comment_id"] for item in items]
    comments = db.session.scalars(select(Comment).where(Comment.id.in_(ids))).all()
    if not comments:
        return
    authors: list[str] = []
    for comment in comments:
        name = USERS[comment.author].name if comment.author in USERS else comment.author
        if name not in authors:
            authors.append(name)
    count = len(comments)
    db.session.add(
        Notification(
            user=post.author,
            text=f"{count} new comment{'s' if count != 1 else ''} on “{post.title}”",
            detail="from " + " and ".join(authors),
            post_id=post.id,
        )
    )
    log.info("notified %s: %d comments on post %s", post.author, count, post.id)


@defer.job(PUBLISH_POST, atomic=True)
def publish_post(job: Job) -> None:
    """Publish a scheduled post, and tell its author."""
    post = db.session.get(Post, job.payload["post_id"])
    if post is None or post.status != "scheduled":
        return
    post.status = "published"
    post.published_at = utcnow()
    post.publish_at = None
    db.session.add(
        Notification(user=post.author, text=f"Your post “{post.title}” is live", post_id=post.id)
    )
    log.info("published post %s: %r", post.id, post.title)


@defer.on_undo(PUBLISH_POST)
def unschedule(job: Job) -> None:
    """Cancelled from the pending page (/defer/pending): the post is a draft again."""
    post = db.session.get(Post, job.payload["post_id"])
    if post is not None and post.status == "scheduled":
        post.status = "draft"
        post.publish_at = None


@defer.job(WEEKLY_DIGEST, atomic=True)
def weekly_digest(job: Job) -> None:
    """Every Monday morning: tell each person what they sent in the past week."""
    since = utcnow() - timedelta(days=7)
    for user in USERS.values():
        sent = db.session.scalar(
            select(func.count())
            .select_from(Message)
            .where(Message.owner == user.id, Message.status == "sent", Message.sent_at >= since)
        )
        db.session.add(
            Notification(
                user=user.id,
                text=f"Your week: {sent or 0} message{'s' if sent != 1 else ''} sent",
                detail="the weekly digest (a recurring job)",
            )
        )
    log.info("weekly digest written for %d people", len(USERS))


# A recurring schedule is declared in code, next to its handler. Monday 09:00 in Berlin
# stays 09:00 local across DST. A digest missed while no worker ran is skipped ("skip"):
# the next Monday's covers the same ground.
defer.recurring(
    DIGEST_SCHEDULE, WEEKLY_DIGEST, cron="0 9 * * MON", tz="Europe/Berlin", catch_up="skip"
)


class PartnerDown(ConnectionError):
    """The (imaginary) partner API the demo syncs with never answers."""


@defer.job(SYNC_PARTNER, max_attempts=3)
def sync_partner(job: Job) -> None:
    """A job that always fails: retried with backoff, then kept as a dead letter."""
    log.info("syncing with the partner API (attempt %d of 3)", job.attempts)
    raise PartnerDown("partner.example is not answering (connection refused)")
