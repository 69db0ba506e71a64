"""The Undo facade: undoable(), undo(), toasts(), pending_for() and on_undo hooks.

Every test runs on SQLite and PostgreSQL (the ``kit`` fixture).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, select

from flask_defer import InvalidArgument, Job, JobNotFound, JobNotPending, JobStatus
from flask_defer.timeutil import utcnow
from flask_defer.undo import Toast, ToastState, UndoOutcome, announcement, state_text

from ..conftest import AppKit


@pytest.fixture
def mail(kit: AppKit) -> AppKit:
    """The kit with a ``send_email`` handler registered."""

    @kit.defer.job("send_email")
    def send_email(job: Job) -> None:
        pass

    return kit


def undoable(kit: AppKit, owner: str = "alice", **kwargs: object) -> Job:
    job = kit.defer.undoable("send_email", {"message_id": 7}, owner=owner, **kwargs)  # type: ignore[arg-type]
    kit.db.session.commit()
    return job


# -- undoable ---------------------------------------------------------------------------


def test_undoable_runs_one_margin_after_the_window(mail: AppKit) -> None:
    before = utcnow()
    job = undoable(mail, label="Message sent")
    assert job.status is JobStatus.PENDING
    assert job.owner == "alice" and job.label == "Message sent"
    assert job.undo_until is not None
    assert job.run_at - job.undo_until == timedelta(seconds=1)
    assert before + timedelta(seconds=5) <= job.undo_until <= utcnow() + timedelta(seconds=5)


def test_undoable_window_and_margin_come_from_arguments_and_config(
    make_app: Callable[..., AppKit],
) -> None:
    kit = make_app(DEFER_UNDO_MARGIN=timedelta(seconds=2), DEFER_UNDO_WINDOW=10)
    with kit.context():
        kit.db.create_all()

        @kit.defer.job("send_email")
        def send_email(job: Job) -> None:
            pass

        default = undoable(kit)
        assert default.undo_until is not None and default.created_at is not None
        assert default.undo_until - default.created_at == pytest.approx(
            timedelta(seconds=10), abs=timedelta(milliseconds=200)
        )
        custom = undoable(kit, window=timedelta(seconds=30))
        assert custom.undo_until is not None
        assert custom.run_at - custom.undo_until == timedelta(seconds=2)
        assert custom.undo_until - default.undo_until > timedelta(seconds=19)


@pytest.mark.parametrize("window", [0, -1, "5", True, timedelta(0)])
def test_undoable_refuses_a_bad_window(mail: AppKit, window: object) -> None:
    with pytest.raises(InvalidArgument) as raised:
        mail.defer.undoable("send_email", owner="alice", window=window)  # type: ignore[arg-type]
    assert raised.value.argument == "window"


def test_undoable_joins_the_callers_transaction(mail: AppKit) -> None:
    job = mail.defer.undoable("send_email", owner="alice")
    mail.db.session.rollback()
    assert mail.defer.get(job.id) is None
    assert mail.defer.toasts("alice") == []


def test_undoable_outside_a_request_needs_an_owner(mail: AppKit) -> None:
    with pytest.raises(InvalidArgument) as raised:
        mail.defer.undoable("send_email")
    assert raised.value.argument == "owner"


def test_undoable_takes_the_owner_from_the_owner_loader(mail: AppKit) -> None:
    mail.defer.owner_loader(lambda: "carol")
    with mail.app.test_request_context("/"):
        job = mail.defer.undoable("send_email")
        mail.db.session.commit()
    assert job.owner == "carol"


def test_undoable_with_a_key_replaces_the_pending_one(mail: AppKit) -> None:
    first = undoable(mail, key="message:7:send")
    second = undoable(mail, key="message:7:send", replace=True)
    assert mail.defer.get(first.id).status is JobStatus.CANCELLED  # type: ignore[union-attr]
    assert [toast.id for toast in mail.defer.toasts("alice")] == [second.id]


# -- undo -------------------------------------------------------------------------------


def test_undo_of_a_pending_job_cancels_it(mail: AppKit) -> None:
    job = undoable(mail)
    assert mail.defer.undo(job.id, owner="alice") is UndoOutcome.UNDONE
    assert mail.defer.get(job.id).status is JobStatus.CANCELLED  # type: ignore[union-attr]
    assert mail.defer.run_due(now=job.run_at + timedelta(seconds=1)).ran == 0


def test_undo_twice_answers_already_undone(mail: AppKit) -> None:
    job = undoable(mail)
    mail.defer.undo(job.id, owner="alice")
    assert mail.defer.undo(job.id, owner="alice") is UndoOutcome.ALREADY_UNDONE


def test_undo_of_a_running_job_is_too_late(mail: AppKit) -> None:
    job = undoable(mail)
    claimed = mail.defer.store.claim(
        now=job.run_at, limit=1, token="worker-1", lease_until=job.run_at + timedelta(seconds=30)
    )
    assert [c.id for c in claimed] == [job.id]
    assert mail.defer.undo(job.id, owner="alice") is UndoOutcome.RUNNING
    assert mail.defer.get(job.id).status is JobStatus.RUNNING  # type: ignore[union-attr]


def test_undo_of_a_job_that_ran_is_too_late(mail: AppKit) -> None:
    job = undoable(mail)
    assert mail.defer.run_due(now=job.run_at).done == 1
    assert mail.defer.undo(job.id, owner="alice") is UndoOutcome.ALREADY_RAN


def test_undo_of_a_failed_job_says_it_already_ran(kit: AppKit) -> None:
    @kit.defer.job("send_email", max_attempts=1)
    def send_email(job: Job) -> None:
        raise RuntimeError("smtp down")

    job = undoable(kit)
    kit.defer.run_due(now=job.run_at)
    assert kit.defer.get(job.id).status is JobStatus.FAILED  # type: ignore[union-attr]
    assert kit.defer.undo(job.id, owner="alice") is UndoOutcome.ALREADY_RAN


def test_undo_of_another_owners_job_is_not_found(mail: AppKit) -> None:
    job = undoable(mail, owner="alice")
    # Mallory is a real owner with a job of her own: her undo reaches the owner check.
    own = undoable(mail, owner="mallory")
    assert [toast.job.id for toast in mail.defer.toasts("mallory")] == [own.id]
    with pytest.raises(JobNotFound):
        mail.defer.undo(job.id, owner="mallory")
    assert mail.defer.get(job.id).status is JobStatus.PENDING  # type: ignore[union-attr]
    # Even once it ran: other owners never learn that the id exists.
    mail.defer.run_due(now=job.run_at)
    with pytest.raises(JobNotFound):
        mail.defer.undo(job.id, owner="mallory")


def test_undo_from_code_without_an_owner_undoes_any_owners_job(mail: AppKit) -> None:
    job = undoable(mail)
    assert mail.defer.undo(job.id) is UndoOutcome.UNDONE


@pytest.mark.parametrize("job_id", [0, -1, 10**6, 2**63 - 1, 2**63, 2**80])
def test_undo_of_unknown_or_impossible_ids_is_not_found(mail: AppKit, job_id: int) -> None:
    with pytest.raises(JobNotFound):
        mail.defer.undo(job_id, owner="alice")


@pytest.mark.parametrize("owner", ["", 7])
def test_undo_refuses_a_malformed_owner(mail: AppKit, owner: object) -> None:
    job = undoable(mail)
    with pytest.raises(InvalidArgument) as raised:
        mail.defer.undo(job.id, owner=owner)  # type: ignore[arg-type]
    assert raised.value.argument == "owner"
    assert mail.defer.get(job.id).status is JobStatus.PENDING  # type: ignore[union-attr]


@pytest.mark.parametrize("job_id", ["1", 1.0, True, None])
def test_undo_refuses_ids_that_are_not_integers(mail: AppKit, job_id: object) -> None:
    with pytest.raises(InvalidArgument):
        mail.defer.undo(job_id, owner="alice")  # type: ignore[arg-type]


def _restorations(kit: AppKit) -> Table:
    table = Table(
        "restorations", MetaData(), Column("id", Integer, primary_key=True), Column("job", String)
    )
    table.create(kit.db.engine)
    return table


def test_on_undo_hook_commits_with_the_cancel(mail: AppKit) -> None:
    restorations = _restorations(mail)

    @mail.defer.on_undo("send_email")
    def restore(job: Job) -> None:
        mail.db.session.execute(restorations.insert().values(job=str(job.id)))

    job = undoable(mail)
    assert mail.defer.undo(job.id, owner="alice") is UndoOutcome.UNDONE
    mail.db.session.remove()
    assert mail.db.session.execute(select(restorations.c.job)).scalars().all() == [str(job.id)]
    # Not run again for an Undo that changed nothing.
    assert mail.defer.undo(job.id, owner="alice") is UndoOutcome.ALREADY_UNDONE
    assert mail.db.session.execute(select(restorations.c.job)).scalars().all() == [str(job.id)]


def test_a_failing_on_undo_hook_rolls_the_cancel_back(mail: AppKit) -> None:
    restorations = _restorations(mail)

    @mail.defer.on_undo("send_email")
    def restore(job: Job) -> None:
        mail.db.session.execute(restorations.insert().values(job=str(job.id)))
        raise RuntimeError("cannot restore")

    job = undoable(mail)
    with pytest.raises(RuntimeError, match="cannot restore"):
        mail.defer.undo(job.id, owner="alice")
    assert mail.defer.get(job.id).status is JobStatus.PENDING  # type: ignore[union-attr]
    assert mail.db.session.execute(select(restorations.c.job)).scalars().all() == []


@pytest.mark.parametrize("actor", ["dashboard", "cli", "ops@example.com"])
def test_an_operators_cancel_runs_the_undo_hooks_and_names_the_operator(
    mail: AppKit, actor: str
) -> None:
    restorations = _restorations(mail)

    @mail.defer.on_undo("send_email")
    def restore(job: Job) -> None:
        mail.db.session.execute(restorations.insert().values(job=str(job.id)))

    job = undoable(mail)
    assert mail.defer.cancel(job.id, actor=actor) is True
    mail.db.session.remove()
    assert mail.db.session.execute(select(restorations.c.job)).scalars().all() == [str(job.id)]
    last = mail.defer.history(job.id)[-1]
    assert (last.event, last.actor) == ("cancelled", actor)
    # A second cancel changes nothing and runs nothing; the owner's Undo neither.
    assert mail.defer.cancel(job.id, actor=actor) is False
    assert mail.defer.undo(job.id, owner="alice") is UndoOutcome.ALREADY_UNDONE
    assert mail.db.session.execute(select(restorations.c.job)).scalars().all() == [str(job.id)]
    # A running job is refused, and its hooks do not run.
    running = undoable(mail)
    mail.defer.store.claim(
        now=running.run_at, limit=1, token="t" * 32,
        lease_until=running.run_at + timedelta(seconds=30),
    )
    assert mail.defer.cancel(running.id, actor=actor) is False
    assert mail.defer.get(running.id).status is JobStatus.RUNNING  # type: ignore[union-attr]
    assert mail.db.session.execute(select(restorations.c.job)).scalars().all() == [str(job.id)]
    with pytest.raises(JobNotFound):
        mail.defer.cancel(999_999, actor=actor)


def test_an_operators_cancel_by_key_runs_the_hooks_in_the_callers_transaction(
    mail: AppKit,
) -> None:
    restorations = _restorations(mail)

    @mail.defer.on_undo("send_email")
    def restore(job: Job) -> None:
        mail.db.session.execute(restorations.insert().values(job=str(job.id)))

    job = undoable(mail, key="message:7:send")
    assert mail.defer.cancel(key="message:7:send", actor="dashboard", commit=False) is True
    assert mail.db.session.execute(select(restorations.c.job)).scalars().all() == [str(job.id)]
    mail.db.session.rollback()  # takes back the cancel and the hook's write together
    assert mail.defer.get(job.id).status is JobStatus.PENDING  # type: ignore[union-attr]
    assert mail.db.session.execute(select(restorations.c.job)).scalars().all() == []
    # The app's own cancel (no actor) does its own bookkeeping: no hooks.
    assert mail.defer.cancel(key="message:7:send") is True
    assert mail.db.session.execute(select(restorations.c.job)).scalars().all() == []
    assert mail.defer.history(job.id)[-1].actor == "app"


def test_an_operators_bulk_cancel_runs_each_jobs_undo_hooks(mail: AppKit) -> None:
    undone: list[int] = []
    mail.defer.on_undo("send_email")(lambda job: undone.append(job.id))
    first = undoable(mail, key="booking:9:a")
    second = undoable(mail, key="booking:9:b")
    other = undoable(mail, key="booking:10:a")
    outcome = mail.defer.cancel_many(key_prefix="booking:9:", actor="cli")
    assert outcome == {"cancelled": 2, "in_flight": 0}
    assert sorted(undone) == sorted([first.id, second.id])
    assert mail.defer.history(first.id)[-1].actor == "cli"
    assert mail.defer.get(other.id).status is JobStatus.PENDING  # type: ignore[union-attr]
    # The app's own bulk cancel runs none.
    assert mail.defer.cancel_many(key_prefix="booking:10:") == {"cancelled": 1, "in_flight": 0}
    assert other.id not in undone


def test_a_failing_hook_leaves_every_job_of_an_operators_bulk_cancel_pending(
    mail: AppKit,
) -> None:
    seen: list[int] = []

    @mail.defer.on_undo("send_email")
    def restore(job: Job) -> None:
        seen.append(job.id)
        if len(seen) == 2:
            raise RuntimeError("cannot restore")

    jobs = [undoable(mail, key=f"booking:9:{n}") for n in range(3)]
    with pytest.raises(RuntimeError, match="cannot restore"):
        mail.defer.cancel_many(key_prefix="booking:9:", actor="dashboard")
    for job in jobs:
        assert mail.defer.get(job.id).status is JobStatus.PENDING  # type: ignore[union-attr]


def test_a_failing_hook_rolls_an_operators_cancel_back(mail: AppKit) -> None:
    @mail.defer.on_undo("send_email")
    def restore(job: Job) -> None:
        raise RuntimeError("cannot restore")

    job = undoable(mail)
    with pytest.raises(RuntimeError, match="cannot restore"):
        mail.defer.cancel(job.id, actor="dashboard")
    assert mail.defer.get(job.id).status is JobStatus.PENDING  # type: ignore[union-attr]


def test_on_undo_refuses_a_bad_name(mail: AppKit) -> None:
    with pytest.raises(InvalidArgument):
        mail.defer.on_undo("")


# -- toasts and the pending list --------------------------------------------------------


def test_toasts_are_the_owners_pending_jobs_with_an_open_window(mail: AppKit) -> None:
    old = undoable(mail, window=5)
    new = undoable(mail, window=60, label="Project deleted")
    undone = undoable(mail)
    mail.defer.undo(undone.id, owner="alice")
    undoable(mail, owner="bob")
    plain = mail.defer.schedule("send_email", delay=60, owner="alice")
    mail.db.session.commit()

    toasts = mail.defer.toasts("alice")
    assert [t.id for t in toasts] == [new.id, old.id]
    assert toasts[0].label == "Project deleted"
    assert 59 < toasts[0].seconds_left <= 60
    assert toasts[0].fraction_left == pytest.approx(1.0, abs=0.02)

    assert old.undo_until is not None
    later = mail.defer.toasts("alice", now=old.undo_until + timedelta(milliseconds=1))
    assert [t.id for t in later] == [new.id]
    assert plain.id not in [t.id for t in later]
    assert mail.defer.toasts("alice", limit=1)[0].id == new.id


def test_toast_seconds_left_come_from_the_row(mail: AppKit) -> None:
    job = undoable(mail, window=5)
    assert job.undo_until is not None
    toast = mail.defer.toasts("alice", now=job.undo_until - timedelta(seconds=3))[0]
    assert toast.seconds_left == pytest.approx(3.0)
    assert toast.fraction_left == pytest.approx(0.6, abs=0.01)
    assert Toast.from_job(job, job.undo_until).seconds_left == 0.0


def test_toasts_without_an_owner_are_empty(mail: AppKit) -> None:
    undoable(mail)
    assert mail.defer.toasts() == []
    assert mail.defer.pending_for() == []


def test_toasts_limit_defaults_to_the_config(make_app: Callable[..., AppKit]) -> None:
    kit = make_app(DEFER_TOAST_LIMIT=2)
    with kit.context():
        kit.db.create_all()

        @kit.defer.job("send_email")
        def send_email(job: Job) -> None:
            pass

        jobs = [undoable(kit) for _ in range(4)]
        assert [t.id for t in kit.defer.toasts("alice")] == [jobs[3].id, jobs[2].id]


def test_pending_for_lists_the_owners_pending_jobs_soonest_first(mail: AppKit) -> None:
    later = mail.defer.schedule("send_email", delay=3600, owner="alice", label="Publish post")
    soon = mail.defer.schedule("send_email", delay=600, owner="alice")
    soonest = undoable(mail, window=120)
    mail.defer.schedule("send_email", delay=10, owner="bob")
    ran = undoable(mail)
    mail.db.session.commit()
    mail.defer.run_due(now=ran.run_at)  # ran is settled; bob's is not alice's
    assert [j.id for j in mail.defer.pending_for("alice")] == [soonest.id, soon.id, later.id]


def test_undo_outcome_sentences_are_built_from_the_state_texts_without_quotes(
    mail: AppKit,
) -> None:
    job = undoable(
        mail, label="Message sent", done_label="Sent", undone_label="Sending undone."
    )
    assert UndoOutcome.UNDONE.describe(job) == "Sending undone."
    assert UndoOutcome.ALREADY_RAN.describe(job) == "Too late — already sent."
    assert UndoOutcome.RUNNING.describe(job) == "Too late — it is running now."
    assert UndoOutcome.ALREADY_UNDONE.describe(job) == "Already undone."
    plain = undoable(mail)
    assert UndoOutcome.UNDONE.describe(plain) == "Undone."
    assert UndoOutcome.ALREADY_RAN.describe(None) == "Too late — it already ran."
    # An acronym keeps its capitals inside the sentence.
    sms = undoable(mail, done_label="SMS sent")
    assert UndoOutcome.ALREADY_RAN.describe(sms) == "Too late — already SMS sent."
    assert UndoOutcome.ALREADY_UNDONE.undone and not UndoOutcome.RUNNING.undone
    assert UndoOutcome.for_status(JobStatus.FAILED) is UndoOutcome.ALREADY_RAN


def test_the_state_texts_are_stored_with_the_label_and_read_back(mail: AppKit) -> None:
    job = undoable(
        mail,
        label="Message sent",
        waiting_label="Sending…",
        done_label="Sent",
        failed_label="Couldn't send",
        undone_label="Sending undone.",
    )
    stored = mail.defer.get(job.id)
    assert stored is not None
    assert stored.label == "Message sent"
    assert (stored.waiting_label, stored.done_label) == ("Sending…", "Sent")
    assert (stored.failed_label, stored.undone_label) == ("Couldn't send", "Sending undone.")
    # The texts survive the job settling (the toast reads them then).
    mail.defer.run_due(now=job.run_at)
    ran = mail.defer.get(job.id)
    assert ran is not None and ran.status is JobStatus.DONE and ran.done_label == "Sent"
    # Only a label: the column holds exactly the label, as before.
    only = undoable(mail, label="Message sent")
    assert (only.label, only.done_label) == ("Message sent", None)


@pytest.mark.parametrize(
    ("argument", "value"),
    [("done_label", "x" * 256), ("failed_label", ""), ("waiting_label", 7), ("label", "x" * 256)],
)
def test_undoable_refuses_bad_state_texts(mail: AppKit, argument: str, value: object) -> None:
    texts: dict[str, object] = {"done_label": "Sent", argument: value}
    with pytest.raises(InvalidArgument) as caught:
        undoable(mail, **texts)
    assert caught.value.argument == argument


def test_each_state_text_has_its_own_column_and_any_character(mail: AppKit) -> None:
    # Each text may use its whole 255 characters, and a label may hold U+001F (once the
    # separator of the texts joined into one column): nothing splits it.
    job = undoable(mail, label="a\x1fb" + "x" * 250, done_label="d" * 255, undone_label="u\x1f")
    stored = mail.defer.get(job.id)
    assert stored is not None
    assert stored.label == "a\x1fb" + "x" * 250
    assert (stored.done_label, stored.undone_label) == ("d" * 255, "u\x1f")
    assert (stored.waiting_label, stored.failed_label) == (None, None)


def test_toast_state_comes_from_the_row_alone(mail: AppKit) -> None:
    job = undoable(mail)
    assert job.undo_until is not None
    assert ToastState.of(job, job.undo_until - timedelta(seconds=1)) is ToastState.OPEN
    # Window closed, not run yet: waiting, never done.
    assert ToastState.of(job, job.undo_until) is ToastState.WAITING
    assert ToastState.of(job, job.run_at + timedelta(hours=1)) is ToastState.WAITING
    mail.defer.run_due(now=job.run_at)
    ran = mail.defer.get(job.id)
    assert ran is not None and ToastState.of(ran, utcnow()) is ToastState.DONE
    other = undoable(mail)
    mail.defer.undo(other.id, owner="alice")
    undone = mail.defer.get(other.id)
    assert undone is not None and ToastState.of(undone, utcnow()) is ToastState.UNDONE


def test_no_default_state_text_claims_an_outcome(mail: AppKit) -> None:
    job = undoable(mail)
    assert state_text(job, ToastState.OPEN) == "Action scheduled"
    assert state_text(job, ToastState.WAITING) == "In progress…"
    assert "Done" not in state_text(job, ToastState.OPEN) + state_text(job, ToastState.WAITING)
    assert state_text(job, ToastState.DONE) == "Done."
    assert state_text(job, ToastState.FAILED) == "Failed."
    labelled = undoable(mail, label="Message sent", done_label="Sent", failed_label="Couldn't send")
    assert state_text(labelled, ToastState.DONE) == "Sent"
    assert state_text(labelled, ToastState.FAILED) == "Couldn't send"


def test_the_announcement_says_what_happened_and_how_to_undo(mail: AppKit) -> None:
    assert announcement(undoable(mail, label="Message sent")) == "Message sent. Press Z to undo."
    assert announcement(undoable(mail, label="Deleted!")) == "Deleted! Press Z to undo."


def test_toasts_with_waiting_include_closed_windows_until_the_job_settles(mail: AppKit) -> None:
    job = undoable(mail)
    assert job.undo_until is not None
    later = job.undo_until + timedelta(seconds=3)
    assert mail.defer.toasts("alice", now=later) == []
    waiting = mail.defer.toasts("alice", now=later, waiting=True)
    assert [(t.id, t.state) for t in waiting] == [(job.id, ToastState.WAITING)]
    mail.defer.run_due(now=job.run_at)
    assert mail.defer.toasts("alice", now=later, waiting=True) == []


# -- hold (hover or focus on a toast) ---------------------------------------------------


def test_hold_keeps_the_window_open_and_the_margin_after_it(mail: AppKit) -> None:
    job = undoable(mail)
    assert job.undo_until is not None
    before = utcnow()
    held = mail.defer.hold(job.id, seconds=8, owner="alice")
    assert held.undo_until is not None
    assert before + timedelta(seconds=8) <= held.undo_until <= utcnow() + timedelta(seconds=8)
    assert held.run_at - held.undo_until == timedelta(seconds=1)  # the margin holds
    assert held.due_at == job.due_at  # the first due time is what the cap counts from
    stored = mail.defer.get(job.id)
    assert stored is not None and stored.run_at == held.run_at


def test_hold_never_moves_a_job_earlier(mail: AppKit) -> None:
    job = undoable(mail, window=30)
    held = mail.defer.hold(job.id, seconds=2, owner="alice")
    assert (held.undo_until, held.run_at) == (job.undo_until, job.run_at)


def test_hold_is_capped_by_max_hold_per_job(make_app: Callable[..., AppKit]) -> None:
    kit = make_app(DEFER_UNDO_MAX_HOLD=timedelta(seconds=3))
    with kit.context():
        kit.db.create_all()

        @kit.defer.job("send_email")
        def send_email(job: Job) -> None:
            pass

        job = undoable(kit)
        for _ in range(3):
            held = kit.defer.hold(job.id, seconds=20, owner="alice")
        assert held.run_at == job.due_at + timedelta(seconds=3)
        assert held.run_at - held.undo_until == timedelta(seconds=1)  # type: ignore[operator]
        again = kit.defer.hold(job.id, seconds=20, owner="alice")
        assert again.run_at == held.run_at


def test_hold_of_a_closed_window_or_a_settled_job_is_not_pending(mail: AppKit) -> None:
    job = undoable(mail, window=0.05)
    import time

    time.sleep(0.1)
    with pytest.raises(JobNotPending):
        mail.defer.hold(job.id, seconds=5, owner="alice")
    other = undoable(mail)
    mail.defer.undo(other.id, owner="alice")
    with pytest.raises(JobNotPending):
        mail.defer.hold(other.id, seconds=5, owner="alice")


def test_hold_of_another_owners_job_is_not_found(mail: AppKit) -> None:
    job = undoable(mail, owner="alice")
    with pytest.raises(JobNotFound):
        mail.defer.hold(job.id, seconds=5, owner="mallory")
    with pytest.raises(JobNotFound):
        mail.defer.hold(2**62, seconds=5, owner="alice")
    stored = mail.defer.get(job.id)
    assert stored is not None and stored.run_at == job.run_at


@pytest.mark.parametrize("seconds", [0, -1, 7200, "soon"])
def test_hold_refuses_a_bad_duration(mail: AppKit, seconds: object) -> None:
    job = undoable(mail)
    with pytest.raises(InvalidArgument) as caught:
        mail.defer.hold(job.id, seconds=seconds, owner="alice")  # type: ignore[arg-type]
    assert caught.value.argument == "seconds"

def test_commit_clears_the_uncommitted_mark_for_every_new_app() -> None:
    """Regression: undo() once refused to run after a commit in a fresh app.

    SQLAlchemy keys its event registry by ``id()``; a new app's Session class reusing a
    collected one's address was taken as already listened to, so its commit never
    cleared the "jobs scheduled, not committed" mark.
    """
    import gc

    from flask import Flask
    from flask_sqlalchemy import SQLAlchemy
    from sqlalchemy.orm import DeclarativeBase

    from flask_defer import Defer

    stuck = 0
    # Only what the loop makes is collected: the rest of the suite's heap is frozen out
    # of the collections, which otherwise cost about a second each late in a full run.
    gc.freeze()
    try:
        for number in range(60):

            class Model(DeclarativeBase):
                pass

            db = SQLAlchemy(model_class=Model)
            defer = Defer()
            app = Flask(f"app_{number}")
            app.config.update(SQLALCHEMY_DATABASE_URI="sqlite://")
            db.init_app(app)
            defer.init_app(app, db=db)
            defer.job("noop")(lambda job: None)
            with app.app_context():
                db.create_all()
                defer.schedule("noop")
                db.session.commit()
                stuck += bool(db.session.info.get("flask_defer.uncommitted"))
                db.session.remove()
                for engine in db.engines.values():
                    engine.dispose()
            del db, defer, app, Model
            gc.collect()
    finally:
        gc.unfreeze()
    assert stuck == 0


def test_undoable_takes_the_scheduling_options_but_not_a_time_of_its_own(
    mail: AppKit,
) -> None:
    job = mail.defer.undoable(
        "send_email", owner="alice", queue="mail", priority=-5, key="message:1:send"
    )
    assert (job.queue, job.priority, job.key) == ("mail", -5, "message:1:send")
    for option in ("run_at", "delay"):
        with pytest.raises(InvalidArgument) as refused:
            mail.defer.undoable("send_email", owner="alice", **{option: 10})  # type: ignore[misc]
        assert refused.value.argument == option and "window" in str(refused.value)
    with pytest.raises(TypeError, match="'queues'"):
        mail.defer.undoable("send_email", owner="alice", queues="mail")  # type: ignore[call-arg]
