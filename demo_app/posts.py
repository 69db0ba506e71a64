"""Posts: scheduled publishing, and comments that notify the author in batches.

* **Publish at a chosen time**: ``defer.schedule`` with an aware ``run_at`` and the key
  ``post:<id>:publish``; ``defer.reschedule(key=...)`` moves it and
  ``defer.cancel(key=...)`` stops it, both only while it is still waiting.
* **Comments**: each one is added to a batch with ``defer.batch``; the author gets one
  notification ("3 new comments on …") a minute after the first comment.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, abort, current_app, flash, redirect, render_template, request, url_for
from sqlalchemy import or_, select

from flask_defer import JobNotFound, JobNotPending, JobStatus

from .jobs import NOTIFY_COMMENTS, PUBLISH_POST, comments_key, publish_key
from .models import Comment, Notification, Post, db, defer, utcnow
from .users import User, require_user
from .when import parse_local

bp = Blueprint("posts", __name__, url_prefix="/posts")
notifications_bp = Blueprint("notifications", __name__, url_prefix="/notifications")


def _visible_post(post_id: int, user: User) -> Post:
    post = db.session.get(Post, post_id)
    if post is None or (post.status != "published" and post.author != user.id):
        abort(404)
    return post


def _own_post(post_id: int, user: User) -> Post:
    post = db.session.get(Post, post_id)
    if post is None or post.author != user.id:
        abort(404)
    return post


def _post_context(post: Post) -> dict[str, Any]:
    batch = defer.get(key=comments_key(post.id))
    pending_batch = batch if batch is not None and batch.status is JobStatus.PENDING else None
    publish_job = defer.get(key=publish_key(post.id)) if post.status == "scheduled" else None
    return {
        "post": post,
        "batch": pending_batch,
        "batch_size": len(pending_batch.payload["items"]) if pending_batch else 0,
        "publish_job": publish_job,
        "batch_window": int(current_app.config["DEMO_BATCH_WINDOW"].total_seconds()),
        # The live panel refreshes while a notification or a publication is coming.
        "polling": pending_batch is not None or post.status == "scheduled",
        "now": utcnow(),
    }


@bp.get("/")
def index() -> Any:
    user = require_user()
    posts = db.session.scalars(
        select(Post)
        .where(or_(Post.status == "published", Post.author == user.id))
        .order_by(Post.published_at.desc().nulls_first(), Post.id.desc())
    ).all()
    return render_template("posts/index.html", posts=posts)


@bp.post("/")
def create() -> Any:
    user = require_user()
    title = request.form.get("title", "").strip()
    if not title:
        flash("Give the post a title.", "error")
        return redirect(url_for("posts.index"), code=303)
    post = Post(author=user.id, title=title[:200], body=request.form.get("body", ""))
    db.session.add(post)
    db.session.commit()
    return redirect(url_for("posts.show", post_id=post.id), code=303)


@bp.get("/<int:post_id>")
def show(post_id: int) -> Any:
    user = require_user()
    return render_template("posts/show.html", **_post_context(_visible_post(post_id, user)))


@bp.get("/<int:post_id>/live")
def live(post_id: int) -> Any:
    """The post's status and comments panel alone (htmx polls it)."""
    user = require_user()
    return render_template("posts/_live.html", **_post_context(_visible_post(post_id, user)))


@bp.post("/<int:post_id>/comments")
def comment(post_id: int) -> Any:
    user = require_user()
    post = _visible_post(post_id, user)
    text = request.form.get("text", "").strip()
    if not text:
        flash("Write something first.", "error")
        return redirect(url_for("posts.show", post_id=post.id), code=303)
    new = Comment(post_id=post.id, author=user.id, text=text[:2000])
    db.session.add(new)
    db.session.flush()  # for new.id
    defer.batch(
        NOTIFY_COMMENTS,
        key=comments_key(post.id),
        item={"post_id": post.id, "comment_id": new.id},
        window=current_app.config["DEMO_BATCH_WINDOW"],
    )
    db.session.commit()  # the comment and its place in the batch, together
    return redirect(url_for("posts.show", post_id=post.id, _anchor="comments"), code=303)


@bp.post("/<int:post_id>/schedule")
def schedule(post_id: int) -> Any:
    """Publish at the chosen time; if it is already scheduled, move it there."""
    user = require_user()
    post = _own_post(post_id, user)
    back = redirect(url_for("posts.show", post_id=post.id), code=303)
    if post.status == "published":
        flash("This post is already published.", "error")
        return back
    try:
        when = parse_local(request.form.get("publish_at"), request.form.get("tz_offset"))
    except ValueError as error:
        flash(str(error), "error")
        return back
    if when <= utcnow():
        flash("Choose a time in the future.", "error")
        return back
    key = publish_key(post.id)
    job = defer.get(key=key)
    if job is not None and job.status is JobStatus.PENDING:
        try:
            # One guarded UPDATE: it only moves a job that is still waiting.
            defer.reschedule(key=key, run_at=when)
        except (JobNotPending, JobNotFound):
            flash("Too late to reschedule: the post is being published.", "error")
            return back
        flash("Rescheduled.", "info")
    else:
        defer.schedule(
            PUBLISH_POST,
            {"post_id": post.id},
            run_at=when,
            key=key,
            owner=user.id,  # so it is listed, and cancellable, on /defer/pending
            label=f"Publish “{post.title}”",
        )
        post.status = "scheduled"
        flash("Scheduled.", "info")
    post.publish_at = when
    db.session.commit()
    return back


@bp.post("/<int:post_id>/cancel")
def cancel(post_id: int) -> Any:
    """Stop a scheduled publication; the post goes back to being a draft."""
    user = require_user()
    post = _own_post(post_id, user)
    try:
        stopped = defer.cancel(key=publish_key(post.id))
    except JobNotFound:
        stopped = False
    if stopped:
        post.status = "draft"
        post.publish_at = None
        db.session.commit()
        flash("Publishing cancelled; the post is a draft again.", "info")
    else:
        flash("Too late to cancel: the post is being published or already is.", "error")
    return redirect(url_for("posts.show", post_id=post.id), code=303)


@notifications_bp.get("/")
def index_notifications() -> Any:
    user = require_user()
    notifications = db.session.scalars(
        select(Notification)
        .where(Notification.user == user.id)
        .order_by(Notification.id.desc())
        .limit(50)
    ).all()
    page = render_template("notifications.html", notifications=notifications)
    for notification in notifications:
        notification.read = True
    db.session.commit()
    return page
