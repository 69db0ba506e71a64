"""The job history's reads and deletes; events are written by ``StoreBase.record_events``.

Every change of a job's state writes its event through :meth:`~flask_defer.store.
base.StoreBase.record_events` on the connection of the change itself, so the event commits or rolls
back with it: a history that says "cancelled by alice" is never wrong about the row.
It takes a list, so a batch of transitions (a claim, a flush of acknowledgements, a
bulk cancel) costs one INSERT, not one per job. With ``DEFER_HISTORY = False`` the
store has no history table and every call here does nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, delete, select

from ..jobs import Job, JobEvent
from .core import StoreBase
from .records import Ack


class HistoryStatements(StoreBase):
    """Writes and reads of the history table (no-ops when history is off)."""

    def history(self, conn: Connection, job_id: int) -> list[JobEvent]:
        """Every event of *job_id*, oldest first (by insertion: ties in ``at`` keep order)."""
        h = self.history_table
        if h is None:
            return []
        rows = conn.execute(
            select(h.c.event, h.c.at, h.c.actor, h.c.attempt, h.c.error, h.c.run_at)
            .where(h.c.job_id == job_id)
            .order_by(h.c.id)
        ).all()
        return [
            JobEvent(event=r[0], at=r[1], actor=r[2], attempt=r[3], error=r[4], run_at=r[5])
            for r in rows
        ]

    def _forget_history(self, conn: Connection, job_ids: Iterable[int]) -> None:
        """Delete the events of *job_ids* (their jobs are being deleted in *conn*)."""
        ids = list(job_ids)
        if self.history_table is None or not ids:
            return
        conn.execute(delete(self.history_table).where(self.history_table.c.job_id.in_(ids)))

    def _forget_started(self, conn: Connection, jobs: Sequence[Job]) -> None:
        """Delete the ``started`` events of claims being handed back unrun."""
        h = self.history_table
        if h is None or not jobs:
            return
        conn.execute(
            delete(h).where(
                h.c.job_id == bindparam("job"),
                h.c.event == "started",
                h.c.attempt == bindparam("tried"),
            ),
            [{"job": job.id, "tried": job.attempts} for job in jobs],
        )

    def _last_started_by(self, conn: Connection, job_ids: Sequence[int]) -> dict[int, str]:
        """Who started each of *job_ids* last (the worker holding its claim)."""
        h = self.history_table
        if h is None or not job_ids:
            return {}
        latest: Any = (
            select(h.c.job_id, h.c.actor)
            .where(h.c.job_id.in_(list(job_ids)), h.c.event == "started")
            .order_by(h.c.job_id, h.c.id)
        )
        # Ordered by id within each job: the last row seen per job is its latest start.
        return {int(job_id): str(actor) for job_id, actor in conn.execute(latest)}

    def acknowledged_before(
        self, acks: Sequence[tuple[Ack, datetime]], *, actor: str = "app"
    ) -> set[int]:
        """The ids of *acks* (each with the time its job was claimed) that an earlier
        try of the same acknowledgement wrote: for a batch retried after an error.

        A batch can commit and still raise in the writer (the database went away
        between its commit and its reply); tried again, its compare-and-set finds
        those rows settled and would report the claims lost. The evidence is the
        ack's own history event, matched whole: its kind, attempt, error and
        ``run_at``, by *actor*, since the claim. So a reclaim's ``failed`` (its error
        is the lease note) or an earlier snooze of a refunded attempt (another
        ``run_at``) is not taken for it. A caller asks only about acks it wrote once
        before, never about a handler's late outcome after its time-out. Without the
        history table the evidence is the row itself (:meth:`_settled_as`).
        """
        h = self.history_table
        if not acks:
            return set()
        if h is None:
            return self._settled_as(acks)
        wanted = {
            (ack.job_id, ack.event, ack.attempt, ack.last_error, ack.run_at): claimed
            for ack, claimed in acks
        }
        stmt = select(h.c.job_id, h.c.event, h.c.attempt, h.c.error, h.c.run_at, h.c.at).where(
            h.c.job_id.in_([ack.job_id for ack, _ in acks]),
            h.c.actor == actor,
            h.c.event.in_({ack.event for ack, _ in acks}),
        )
        with self.engine.connect() as conn:
            rows = conn.execute(stmt).all()
        return {
            int(row[0])
            for row in rows
            if (claimed := wanted.get(tuple(row[:5]))) is not None and row[5] >= claimed
        }

    def _settled_as(self, acks: Sequence[tuple[Ack, datetime]]) -> set[int]:
        """The ids of *acks* whose rows are as the ack left them: no claim, its status,
        attempts, error and ``run_at``, changed since the claim. Without the history,
        the next best evidence: a reclaim writes the lease note as its error, a later
        claim a token and another attempt, and an operator's retry or run-now another
        ``run_at``; only a change that wrote all the same values again (none does)
        could pass for the ack."""
        t = self.table
        stmt = select(
            t.c.id, t.c.claim_token, t.c.status, t.c.attempts, t.c.last_error, t.c.run_at,
            t.c.updated_at,
        ).where(t.c.id.in_([ack.job_id for ack, _ in acks]))  # fmt: skip
        with self.engine.connect() as conn:
            rows = {int(row[0]): row for row in conn.execute(stmt)}
        written = set()
        for ack, claimed in acks:
            row = rows.get(ack.job_id)
            if (
                row is not None
                and row.claim_token is None
                and (row.status, row.attempts, row.last_error)
                == (ack.status, ack.attempt + ack.attempts_delta, ack.last_error)
                and (ack.run_at is None or row.run_at == ack.run_at)
                and row.updated_at >= claimed
            ):
                written.add(ack.job_id)
        return written
