"""A few projects and posts, so a first visit has something to delete and comment on."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func, select

from flask_defer import INCLUDE_DELETED

from .models import Post, Project, Task, db, utcnow


def seed() -> None:
    """Fill an empty database; a database that has any project or post is left alone."""
    has_data = db.session.scalar(select(func.count()).select_from(Post)) or db.session.scalar(
        select(func.count()).select_from(Project).execution_options(**{INCLUDE_DELETED: True})
    )
    if has_data:
        return
    projects = {
        "alice": ["Website relaunch", "Quarterly planning", "Team offsite"],
        "bob": ["Garden shed", "Book club"],
    }
    for owner, names in projects.items():
        for name in names:
            db.session.add(
                Project(
                    owner=owner,
                    name=name,
                    tasks=[Task(title="Kick-off", done=True), Task(title="First milestone")],
                )
            )
    now = utcnow()
    db.session.add_all(
        [
            Post(
                author="alice",
                title="Why our emails wait five seconds",
                body=(
                    "Every message you send here waits a few seconds before it leaves, "
                    "so you can take it back. The wait is a row in our database, not a "
                    "timer in a process: a restart cannot lose it, and Undo works from "
                    "any server."
                ),
                status="published",
                published_at=now - timedelta(hours=3),
            ),
            Post(
                author="bob",
                title="Notes from the book club",
                body="We read about queues this month. Comments welcome!",
                status="published",
                published_at=now - timedelta(hours=1),
            ),
            Post(
                author="alice",
                title="Launch announcement",
                body="The new website is live. Schedule me for launch day!",
            ),
            Post(author="bob", title="Spring planting plan", body="Tomatoes first."),
        ]
    )
    db.session.commit()
