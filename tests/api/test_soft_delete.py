"""Grace-period soft delete: hide, purge once, restore, and the restore-vs-purge race."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import ForeignKey, String, func, select
from sqlalchemy.orm import Mapped, mapped_column, relationship

from flask_defer import (
    INCLUDE_DELETED,
    Defer,
    InvalidArgument,
    Job,
    JobNotFound,
    JobStatus,
    NotConfigured,
    RestoreOutcome,
    SoftDeleteMixin,
    UndoOutcome,
    job_cancelled,
)
from flask_defer.engine.execution import Outcome
from flask_defer.features.soft_delete import PURGE_JOB

from ..conftest import AppKit

WITH_DELETED = {INCLUDE_DELETED: True}


@dataclass
class SoftKit:
    app: Flask
    db: SQLAlchemy
    defer: Defer
    Project: Any
    Task: Any
    Note: Any

    def new_project(self, tasks: int = 2) -> Any:
        project = self.Project(name="p", tasks=[self.Task(title=f"t{i}") for i in range(tasks)])
        self.db.session.add(project)
        self.db.session.commit()
        return project

    def load(self, project_id: int) -> Any:
        """The project row as the database has it now, deleted or not (None if gone)."""
        self.db.session.expunge_all()
        return self.db.session.get(self.Project, project_id, execution_options=WITH_DELETED)

    def task_count(self, project_id: int) -> int:
        stmt = select(func.count()).select_from(self.Task).where(self.Task.project_id == project_id)
        return int(self.db.session.scalar(stmt) or 0)


def define_models(db: SQLAlchemy) -> tuple[Any, Any, Any]:
    class Project(SoftDeleteMixin, db.Model):  # type: ignore[name-defined, misc]
        __tablename__ = "projects"
        id: Mapped[int] = mapped_column(primary_key=True)
        name: Mapped[str] = mapped_column(String(50))
        tasks: Mapped[list[Task]] = relationship(
            back_populates="project", cascade="all, delete-orphan"
        )
        notes: Mapped[list[Note]] = relationship(cascade="all, delete-orphan")

    class Task(db.Model):  # type: ignore[name-defined, misc]
        __tablename__ = "tasks"
        id: Mapped[int] = mapped_column(primary_key=True)
        project_id: Mapped[int] = mapped_column(ForeignKey("projects.id"))
        title: Mapped[str] = mapped_column(String(50))
        project: Mapped[Project] = relationship(back_populates="tasks")

    class Note(SoftDeleteMixin, db.Model):  # type: ignore[name-defined, misc]
        __tablename__ = "notes"
        id: Mapped[int] = mapped_column(primary_key=True)
        project_id: Mapped[int] = mapped_column(ForeignKey("projects.id"))

    return Project, Task, Note


@pytest.fixture
def sk(make_app: Callable[..., AppKit]) -> Iterator[SoftKit]:
    kit = make_app()
    project, task, note = define_models(kit.db)
    with kit.app.app_context():
        kit.db.create_all()
        yield SoftKit(kit.app, kit.db, kit.defer, project, task, note)
        kit.db.session.rollback()


def later(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


# -- soft delete and hiding ------------------------------------------------------------


def test_soft_delete_hides_the_row_and_schedules_an_undoable_purge(sk: SoftKit) -> None:
    project = sk.new_project()
    job = sk.defer.soft_delete(project, timedelta(seconds=30), label="Project deleted", owner="u1")
    sk.db.session.commit()

    assert job.name == PURGE_JOB and job.status is JobStatus.PENDING
    assert job.key == f"purge:projects:{project.id}"
    assert job.owner == "u1" and job.label == "Project deleted"
    assert job.undo_until is not None
    # The toast closes a margin before the purge may start, so a late click still lands.
    assert job.run_at - job.undo_until == timedelta(seconds=1)
    assert project.deleted_at is not None and project.is_deleted

    sk.db.session.expunge_all()
    assert sk.db.session.scalars(select(sk.Project)).all() == []
    assert sk.Project.query.count() == 0
    assert sk.db.session.get(sk.Project, project.id) is None
    hidden = select(sk.Project).execution_options(include_deleted=True)
    assert [p.id for p in sk.db.session.scalars(hidden)] == [project.id]
    assert sk.db.session.get(sk.Project, project.id, execution_options=WITH_DELETED) is not None


def test_soft_deleted_children_are_hidden_in_collections_but_purged_with_the_parent(
    sk: SoftKit,
) -> None:
    project = sk.new_project()
    pid = project.id
    project.notes = [sk.Note(), sk.Note()]
    sk.db.session.commit()
    sk.defer.soft_delete(project.notes[0], grace=3600)
    sk.db.session.commit()

    sk.db.session.expunge_all()
    [loaded] = sk.db.session.scalars(select(sk.Project)).all()
    assert len(loaded.notes) == 1  # the criteria travel into the lazy load
    everything = select(sk.Note).execution_options(include_deleted=True)
    assert len(sk.db.session.scalars(everything).all()) == 2

    sk.defer.soft_delete(loaded, grace=0)
    sk.db.session.commit()
    sk.defer.run_due(now=later(1))  # the project's purge; the note's waits an hour
    sk.db.session.expunge_all()
    assert sk.db.session.scalars(everything).all() == []  # the cascade saw both notes
    assert sk.load(pid) is None
    assert sk.defer.run_due(now=later(7200)).done == 1  # the note's purge: already gone


def test_soft_delete_joins_the_callers_transaction(sk: SoftKit) -> None:
    project = sk.new_project()
    job = sk.defer.soft_delete(project)
    sk.db.session.rollback()
    assert sk.defer.get(job.id) is None
    assert sk.load(project.id).deleted_at is None


def test_soft_deleting_twice_returns_the_waiting_purge(sk: SoftKit) -> None:
    project = sk.new_project()
    first = sk.defer.soft_delete(project)
    sk.db.session.commit()
    again = sk.defer.soft_delete(project)
    sk.db.session.commit()
    assert again.id == first.id
    assert len(sk.defer.list(name=PURGE_JOB)) == 1


def test_soft_delete_refuses_objects_it_cannot_handle(sk: SoftKit) -> None:
    with pytest.raises(InvalidArgument) as raised:
        sk.defer.soft_delete(sk.Task(title="x"))
    assert raised.value.argument == "obj"
    with pytest.raises(InvalidArgument, match="not in db.session"):
        sk.defer.soft_delete(sk.Project(name="new"))
    with pytest.raises(InvalidArgument) as raised:
        sk.defer.soft_delete(sk.new_project(), grace=-1)
    assert raised.value.argument == "grace"


def test_a_refused_soft_delete_leaves_the_row_visible_even_if_the_caller_commits(
    sk: SoftKit,
) -> None:
    project = sk.new_project()
    with pytest.raises(InvalidArgument) as raised:
        sk.defer.soft_delete(project, label="x" * 10_000)
    assert raised.value.argument == "label"
    sk.db.session.commit()  # a caller that reports the error and carries on
    assert project.deleted_at is None
    sk.db.session.expunge_all()
    assert sk.load(project.id).deleted_at is None  # not hidden without a purge
    assert sk.defer.list(name=PURGE_JOB) == []


def test_a_new_object_is_flushed_to_get_its_key(sk: SoftKit) -> None:
    project = sk.Project(name="fresh")
    sk.db.session.add(project)
    job = sk.defer.soft_delete(project)
    sk.db.session.commit()
    assert job.key == f"purge:projects:{project.id}"


# -- purge -----------------------------------------------------------------------------


def test_purge_hard_deletes_once_after_the_grace_with_cascades(sk: SoftKit) -> None:
    project = sk.new_project(tasks=3)
    pid = project.id
    job = sk.defer.soft_delete(project, grace=30)
    sk.db.session.commit()

    assert sk.defer.run_due(now=later(20)).ran == 0
    summary = sk.defer.run_due(now=later(31))
    assert summary.done == 1

    assert sk.load(pid) is None
    assert sk.task_count(pid) == 0
    purged = sk.defer.get(job.id)
    assert purged is not None and purged.status is JobStatus.DONE
    assert purged.result == {"purged": True}
    assert sk.defer.run_due(now=later(3600)).ran == 0


def test_purge_leaves_a_row_restored_behind_its_back(sk: SoftKit) -> None:
    project = sk.new_project()
    job = sk.defer.soft_delete(project, grace=5)
    sk.db.session.commit()
    project.deleted_at = None  # the app cleared it itself, without restore()
    sk.db.session.commit()

    assert sk.defer.run_due(now=later(10)).done == 1
    assert sk.load(project.id) is not None
    assert sk.task_count(project.id) == 2
    assert sk.defer.get(job.id).result == {"purged": False, "reason": "the row was restored"}


def test_purge_whose_claim_lapsed_deletes_nothing(sk: SoftKit) -> None:
    project = sk.new_project()
    sk.defer.soft_delete(project, grace=0)
    sk.db.session.commit()
    store = sk.defer.store
    now = later(1)
    [claimed] = store.claim(
        now=now, limit=1, token=uuid.uuid4().hex, lease_until=now + timedelta(seconds=30)
    )
    store.reclaim_lapsed(now=now + timedelta(seconds=31))  # another worker may take it now

    outcome = sk.app.extensions["defer"].executor.execute(claimed, lambda: now)
    assert outcome is Outcome.LOST
    assert sk.load(project.id) is not None
    assert sk.task_count(project.id) == 2


def test_purge_of_a_row_deleted_meanwhile_is_done_without_effect(sk: SoftKit) -> None:
    project = sk.new_project(tasks=0)
    job = sk.defer.soft_delete(project, grace=0)
    sk.db.session.commit()
    sk.db.session.delete(sk.load(project.id))
    sk.db.session.commit()
    assert sk.defer.run_due(now=later(1)).done == 1
    assert sk.defer.get(job.id).result == {"purged": False, "reason": "the row no longer exists"}


# -- restore and undo ---------------------------------------------------------------------


def test_undo_restores_the_row_and_cancels_the_purge(sk: SoftKit) -> None:
    project = sk.new_project()
    job = sk.defer.soft_delete(project, owner="u1")
    sk.db.session.commit()

    assert sk.defer.undo(job.id, owner="u1") is UndoOutcome.UNDONE
    restored = sk.load(project.id)
    assert restored is not None and restored.deleted_at is None
    assert sk.defer.get(job.id).status is JobStatus.CANCELLED
    assert sk.defer.run_due(now=later(3600)).ran == 0
    assert sk.task_count(project.id) == 2
    # A second click is harmless and says it did nothing.
    assert sk.defer.undo(job.id, owner="u1") is UndoOutcome.ALREADY_UNDONE


def test_soft_delete_in_a_request_belongs_to_the_current_owner(sk: SoftKit) -> None:
    sk.defer.owner_loader(lambda: "carol")
    project = sk.new_project()
    with sk.app.test_request_context("/projects/1/delete", method="POST"):
        job = sk.defer.soft_delete(project, label="Project deleted")
        sk.db.session.commit()
        assert job.owner == "carol"
        assert [toast.job.id for toast in sk.defer.toasts()] == [job.id]


def test_soft_delete_outside_a_request_has_no_owner_and_no_toast(sk: SoftKit) -> None:
    job = sk.defer.soft_delete(sk.new_project())
    sk.db.session.commit()
    assert job.owner is None


def test_undo_of_another_owners_purge_is_not_found(sk: SoftKit) -> None:
    project = sk.new_project()
    job = sk.defer.soft_delete(project, owner="u1")
    sk.db.session.commit()
    with pytest.raises(JobNotFound):
        sk.defer.undo(job.id, owner="u2")
    assert sk.defer.get(job.id).status is JobStatus.PENDING
    assert sk.load(project.id).deleted_at is not None


def test_undo_after_the_purge_ran_answers_already_ran(sk: SoftKit) -> None:
    project = sk.new_project()
    pid = project.id
    job = sk.defer.soft_delete(project, grace=1)
    sk.db.session.commit()
    sk.defer.run_due(now=later(2))
    assert sk.defer.undo(job.id) is UndoOutcome.ALREADY_RAN
    assert sk.defer.get(job.id).status is JobStatus.DONE
    assert sk.load(pid) is None


def test_restore_from_code_cancels_the_purge_in_the_same_transaction(sk: SoftKit) -> None:
    project = sk.new_project()
    job = sk.defer.soft_delete(project)
    sk.db.session.commit()

    assert sk.defer.restore(project) is RestoreOutcome.RESTORED
    sk.db.session.rollback()  # the caller changes their mind: both changes go
    assert sk.defer.get(job.id).status is JobStatus.PENDING
    assert sk.load(project.id).deleted_at is not None

    project = sk.load(project.id)
    assert sk.defer.restore(project) is RestoreOutcome.RESTORED
    sk.db.session.commit()
    assert sk.defer.get(job.id).status is JobStatus.CANCELLED
    assert sk.load(project.id).deleted_at is None
    assert sk.defer.restore(sk.load(project.id)) is RestoreOutcome.NOT_DELETED


def test_restore_signals_the_cancelled_purge_only_once_committed(sk: SoftKit) -> None:
    heard: list[int] = []
    project = sk.new_project()
    job = sk.defer.soft_delete(project)
    sk.db.session.commit()
    with job_cancelled.connected_to(lambda app, job: heard.append(job.id)):
        assert sk.defer.restore(project) is RestoreOutcome.RESTORED
        sk.db.session.rollback()
        assert heard == []  # rolled back: the purge was never cancelled
        assert sk.defer.restore(sk.load(project.id)) is RestoreOutcome.RESTORED
        assert heard == []
        sk.db.session.commit()
    assert heard == [job.id]


def test_restore_while_the_purge_runs_is_too_late(sk: SoftKit) -> None:
    project = sk.new_project()
    sk.defer.soft_delete(project, grace=0)
    sk.db.session.commit()
    now = later(1)
    sk.defer.store.claim(
        now=now, limit=1, token=uuid.uuid4().hex, lease_until=now + timedelta(seconds=30)
    )
    assert sk.defer.restore(project) is RestoreOutcome.PURGING
    sk.db.session.commit()
    assert sk.load(project.id).deleted_at is not None


def test_restore_after_the_purge_says_purged(sk: SoftKit) -> None:
    project = sk.new_project()
    sk.defer.soft_delete(project, grace=0)
    sk.db.session.commit()
    sk.defer.run_due(now=later(1))
    assert sk.defer.restore(project) is RestoreOutcome.PURGED


def test_restore_after_a_failed_purge_brings_the_row_back(sk: SoftKit) -> None:
    project = sk.new_project()
    job = sk.defer.soft_delete(project, grace=0)
    sk.db.session.commit()
    # The operator stopped the purge (a plain cancel runs no undo hooks).
    assert sk.defer.cancel(job.id) is True
    assert sk.load(project.id).deleted_at is not None
    assert sk.defer.restore(sk.load(project.id)) is RestoreOutcome.RESTORED
    sk.db.session.commit()
    assert sk.load(project.id).deleted_at is None


def test_an_undo_hook_that_raises_rolls_the_cancel_back(sk: SoftKit) -> None:
    @sk.defer.job("send")
    def send(job: Job) -> None:
        pass

    seen: list[int] = []

    @sk.defer.on_undo("send")
    def refuse(job: Job) -> None:
        seen.append(job.id)
        raise RuntimeError("cannot undo now")

    job = sk.defer.schedule("send", delay=60)
    sk.db.session.commit()
    with pytest.raises(RuntimeError):
        sk.defer.undo(job.id)
    assert seen == [job.id]
    assert sk.defer.get(job.id).status is JobStatus.PENDING


def test_undo_hooks_commit_with_the_cancel(sk: SoftKit) -> None:
    @sk.defer.job("archive")
    def archive(job: Job) -> None:
        pass

    @sk.defer.on_undo("archive")
    def rename(job: Job) -> None:
        project = sk.db.session.get(sk.Project, job.payload["project"])
        project.name = "kept"

    project = sk.new_project()
    job = sk.defer.schedule("archive", {"project": project.id}, delay=60, key="a:1")
    sk.db.session.commit()
    assert sk.defer.undo(key="a:1") is UndoOutcome.UNDONE
    assert sk.load(project.id).name == "kept"
    assert sk.defer.get(job.id).status is JobStatus.CANCELLED


# -- the race -------------------------------------------------------------------------------


def race_once(sk: SoftKit, pid: int, job_id: int, use_undo: bool, pauses: list[float]) -> Any:
    """Run a worker's run_due and a user's restore (or undo) at the same moment."""
    barrier = threading.Barrier(2)
    answers: dict[str, Any] = {}
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with sk.app.app_context():
                barrier.wait()
                threading.Event().wait(pauses[0])
                answers["purge"] = sk.defer.run_due(now=later(1))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    def user() -> None:
        try:
            with sk.app.app_context():
                row = sk.db.session.get(sk.Project, pid, execution_options=WITH_DELETED)
                barrier.wait()
                threading.Event().wait(pauses[1])
                if use_undo:
                    answers["user"] = sk.defer.undo(job_id)
                else:
                    answers["user"] = sk.defer.restore(row)
                    sk.db.session.commit()
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker), threading.Thread(target=user)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    return answers["user"]


def test_restore_racing_the_purge_exactly_one_wins(sk: SoftKit, backend: str) -> None:
    """Many trials of restore (or undo) against a worker claiming the due purge.

    Each trial ends in exactly one of two states: restored (row and all tasks there,
    deleted_at cleared, purge cancelled) or purged (row and all tasks gone, purge
    done). Never a row without tasks, never a restored row with a done purge.
    """
    trials = 60
    wins: Counter[str] = Counter()
    rng = random.Random(6)
    for trial in range(trials):
        project = sk.new_project(tasks=3)
        pid = project.id
        job = sk.defer.soft_delete(project, grace=0)
        sk.db.session.commit()
        pauses = [rng.uniform(0, 0.003), rng.uniform(0, 0.003)]
        answer = race_once(sk, pid, job.id, use_undo=trial % 2 == 1, pauses=pauses)

        final = sk.defer.get(job.id)
        row = sk.load(pid)
        tasks = sk.task_count(pid)
        if answer in (UndoOutcome.UNDONE, RestoreOutcome.RESTORED):
            assert final.status is JobStatus.CANCELLED
            assert row is not None and row.deleted_at is None and tasks == 3
            wins["restore"] += 1
        else:
            assert answer in (
                UndoOutcome.RUNNING,
                UndoOutcome.ALREADY_RAN,
                RestoreOutcome.PURGING,
                RestoreOutcome.PURGED,
            )
            assert final.status is JobStatus.DONE and final.result == {"purged": True}
            assert row is None and tasks == 0
            wins["purge"] += 1
    assert sum(wins.values()) == trials
    print(f"\n{backend}: restore-vs-purge over {trials} trials: {dict(wins)}")


def test_soft_delete_needs_the_apps_sqlalchemy(tmp_path: Any) -> None:
    app = Flask("no_db")
    app.config["DEFER_DATABASE_URI"] = f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
    defer = Defer(app)
    with app.app_context():
        with pytest.raises(NotConfigured, match="Flask-SQLAlchemy"):
            defer.soft_delete(object())
        defer.store.engine.dispose()


_HOOK_ONLY_WITH_MODELS = """
import sys
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import select
from sqlalchemy.orm import Mapped, mapped_column
from flask_defer import Defer, SoftDeleteMixin

app = Flask("plain")
app.config.update(SQLALCHEMY_DATABASE_URI="sqlite:///" + sys.argv[1], SECRET_KEY="x")
db = SQLAlchemy(app)
defer = Defer(app, db=db)

class Post(db.Model):
    id: Mapped[int] = mapped_column(primary_key=True)

def hooks():
    with app.app_context():
        return len(db.session().dispatch.do_orm_execute)

before = hooks()

class Doc(SoftDeleteMixin, db.Model):  # declared after init_app, as in an app factory
    id: Mapped[int] = mapped_column(primary_key=True)

with app.app_context():
    db.create_all()
    kept, deleted = Doc(), Doc()
    db.session.add_all([kept, deleted])
    db.session.commit()
    defer.soft_delete(deleted, grace=60)
    db.session.commit()
    seen = [doc.id for doc in db.session.scalars(select(Doc))]
    print(before, hooks(), seen == [kept.id])
"""


def test_an_app_pays_for_the_query_hook_only_once_a_soft_delete_model_exists(
    tmp_path: Path,
) -> None:
    """Without a SoftDeleteMixin model no ORM query goes through the hook (it made every
    ORM select cost 2.8 times as much); a model declared after init_app installs it, and
    its deleted rows are hidden. A fresh interpreter: this one has such models already."""
    script = tmp_path / "app.py"
    script.write_text(_HOOK_ONLY_WITH_MODELS)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "app.sqlite3")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "1", "True"], done.stdout
