"""The demo's data: mail, projects, posts with comments, notifications.

Plain Flask-SQLAlchemy models. The only flask_defer-specific line is the
``SoftDeleteMixin`` on ``Project``: it adds the ``deleted_at`` column that
``defer.soft_delete`` sets and hides soft-deleted projects from ordinary queries.
"""

from __future__ import annotations

from datetime import UTC, datetime

from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import ForeignKey, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from flask_defer import Defer, SoftDeleteMixin
from flask_defer.store.schema import UTCDateTime  # aware UTC on SQLite and PostgreSQL alike


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)
# The jobs table joins db.metadata here, so db.create_all() creates it too.
defer = Defer(db=db)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Message(db.Model):
    """A message someone wrote. ``status``: sending → sent, or draft after an Undo."""

    __tablename__ = "messages"

    id: Mapped[int] = mapped_column(primary_key=True)
    owner: Mapped[str] = mapped_column(String(40), index=True)
    recipient: Mapped[str] = mapped_column(String(200))
    subject: Mapped[str] = mapped_column(String(200))
    body: Mapped[str] = mapped_column(Text, default="")
    status: Mapped[str] = mapped_column(String(20), default="draft")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class OutboxEntry(db.Model):
    """What the fake mail server received: one row per delivered message."""

    __tablename__ = "outbox"

    id: Mapped[int] = mapped_column(primary_key=True)
    message_id: Mapped[int] = mapped_column(ForeignKey("messages.id"), unique=True)
    recipient: Mapped[str] = mapped_column(String(200))
    subject: Mapped[str] = mapped_column(String(200))
    delivered_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Project(SoftDeleteMixin, db.Model):
    """A project with tasks; deleting it hides it at once and purges it after a grace."""

    __tablename__ = "projects"

    id: Mapped[int] = mapped_column(primary_key=True)
    owner: Mapped[str] = mapped_column(String(40), index=True)
    name: Mapped[str] = mapped_column(String(120))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # The purge deletes through the ORM, so this cascade removes the tasks too.
    tasks: Mapped[list[Task]] = relationship(
        cascade="all, delete-orphan", order_by="Task.id", back_populates="project"
    )


class Task(db.Model):
    __tablename__ = "tasks"

    id: Mapped[int] = mapped_column(primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id"), index=True)
    title: Mapped[str] = mapped_column(String(200))
    done: Mapped[bool] = mapped_column(default=False)
    project: Mapped[Project] = relationship(back_populates="tasks")


class Post(db.Model):
    """A blog post. ``status``: draft → scheduled → published (or back to draft)."""

    __tablename__ = "posts"

    id: Mapped[int] = mapped_column(primary_key=True)
    author: Mapped[str] = mapped_column(String(40), index=True)
    title: Mapped[str] = mapped_column(String(200))
    body: Mapped[str] = mapped_column(Text, default="")
    status: Mapped[str] = mapped_column(String(20), default="draft")
    publish_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    published_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    comments: Mapped[list[Comment]] = relationship(
        cascade="all, delete-orphan", order_by="Comment.id", back_populates="post"
    )


class Comment(db.Model):
    __tablename__ = "comments"

    id: Mapped[int] = mapped_column(primary_key=True)
    post_id: Mapped[int] = mapped_column(ForeignKey("posts.id"), index=True)
    author: Mapped[str] = mapped_column(String(40))
    text: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    post: Mapped[Post] = relationship(back_populates="comments")


class Notification(db.Model):
    """What a user is told: "3 new comments on …", "Your post … is live"."""

    __tablename__ = "notifications"

    id: Mapped[int] = mapped_column(primary_key=True)
    user: Mapped[str] = mapped_column(String(40), index=True)
    text: Mapped[str] = mapped_column(String(300))
    detail: Mapped[str] = mapped_column(String(300), default="")
    post_id: Mapped[int | None] = mapped_column(ForeignKey("posts.id"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    read: Mapped[bool] = mapped_column(default=False)


class WebhookCall(db.Model):
    """A call the demo's own webhook received from a scheduled HTTP job."""

    __tablename__ = "webhook_calls"

    id: Mapped[int] = mapped_column(primary_key=True)
    owner: Mapped[str] = mapped_column(String(40), index=True)
    note: Mapped[str] = mapped_column(String(200), default="")
    answered: Mapped[int] = mapped_column(default=200)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
