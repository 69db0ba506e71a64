"""Projects: delete with a grace period. Hidden at once, purged later, unless restored.

``defer.soft_delete`` sets ``deleted_at`` (so every ordinary query stops seeing the
project) and schedules the built-in purge job, undoable from the toast. After the
grace period the worker deletes the row, and its tasks with it, for good.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from flask import Blueprint, abort, current_app, flash, redirect, render_template, request, url_for
from sqlalchemy import select

from flask_defer import INCLUDE_DELETED, RestoreOutcome

from .models import Project, Task, db, defer, utcnow
from .users import require_user

bp = Blueprint("projects", __name__, url_prefix="/projects")


def _grace() -> timedelta:
    grace: timedelta = current_app.config["DEMO_DELETE_GRACE"]
    return grace


def _context(owner: str) -> dict[str, Any]:
    # Soft-deleted projects are filtered out of this query by flask_defer.
    projects = db.session.scalars(
        select(Project).where(Project.owner == owner).order_by(Project.id)
    ).all()
    # The bin: an explicit opt-in to see soft-deleted rows.
    deleted = db.session.scalars(
        select(Project)
        .where(Project.owner == owner, Project.deleted_at.is_not(None))
        .order_by(Project.deleted_at.desc())
        .execution_options(**{INCLUDE_DELETED: True})
    ).all()
    # The moment Restore stops being offered: the toast counts down to the same one
    # (the purge runs DEFER_UNDO_MARGIN later, so a last-moment click still lands).
    restorable = _grace() - defer.config.undo_margin
    purge_at: dict[int, datetime] = {
        project.id: project.deleted_at + restorable for project in deleted if project.deleted_at
    }
    return {
        "projects": projects,
        "deleted": deleted,
        "purge_at": purge_at,
        "grace_seconds": int(_grace().total_seconds()),
        # The page refreshes its lists while something waits in the bin.
        "polling": bool(deleted),
        "now": utcnow(),
    }


def _own_project(project_id: int, owner: str, *, include_deleted: bool = False) -> Project:
    project = db.session.get(
        Project, project_id, execution_options={INCLUDE_DELETED: include_deleted}
    )
    if project is None or project.owner != owner:
        abort(404)
    return project


@bp.get("/")
def index() -> Any:
    user = require_user()
    return render_template("projects/index.html", **_context(user.id))


@bp.get("/lists")
def lists() -> Any:
    user = require_user()
    return render_template("projects/_lists.html", **_context(user.id))


@bp.post("/")
def create() -> Any:
    user = require_user()
    name = request.form.get("name", "").strip()
    if not name:
        flash("Give the project a name.", "error")
        return redirect(url_for("projects.index"), code=303)
    project = Project(owner=user.id, name=name[:120])
    project.tasks = [Task(title="Kick-off"), Task(title="First milestone")]
    db.session.add(project)
    db.session.commit()
    return redirect(url_for("projects.index"), code=303)


@bp.post("/<int:project_id>/delete")
def delete(project_id: int) -> Any:
    user = require_user()
    project = _own_project(project_id, user.id)
    defer.soft_delete(
        project,
        grace=_grace(),
        label=f"Project “{project.name}” deleted",
        owner=user.id,  # whose toast offers the Undo
    )
    db.session.commit()  # the deleted_at mark and the purge job, together
    return redirect(url_for("projects.index"), code=303)


@bp.post("/<int:project_id>/restore")
def restore(project_id: int) -> Any:
    """Restore from the bin (the same as the toast's Undo, from a button of our own)."""
    user = require_user()
    project = _own_project(project_id, user.id, include_deleted=True)
    outcome = defer.restore(project)
    db.session.commit()
    messages = {
        RestoreOutcome.RESTORED: f"“{project.name}” is back.",
        RestoreOutcome.NOT_DELETED: f"“{project.name}” was not deleted.",
        RestoreOutcome.PURGING: "Too late: it is being deleted right now.",
        RestoreOutcome.PURGED: "Too late: it is gone for good.",
    }
    flash(messages[outcome], "info" if outcome is RestoreOutcome.RESTORED else "error")
    return redirect(url_for("projects.index"), code=303)
