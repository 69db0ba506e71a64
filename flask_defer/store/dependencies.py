"""Jobs that run after other jobs: attaching a child to its parents, and releasing it.

A child (``schedule(..., after=...)``, a group's ``then`` job) is an ordinary pending
row whose ``waiting_for`` counts the parents that have not settled yet. While it is set
the row is in none of the claim's indexes (see ``schema``), so a waiting child costs
the claim, the worker's wake-up and health nothing.

Each (child, parent) edge is a row of the dependencies table, ``open`` until the parent
settles. Whatever settles a parent (an acknowledgement, a cancel or an Undo, the expiry
sweep, a lapsed lease out of attempts) calls :meth:`DependencyStatements.release_children`
in the same transaction when the parent's row says it has ``dependents``. The release
closes the parent's open edges with a guarded UPDATE (``... AND open``), so each edge is
counted once however many workers settle parents at the same moment, and lowers each
child's count in one UPDATE of the row itself (``waiting_for - n``): the database's row
lock orders two releases of one child, so its last parent releases it exactly once,
with no count read first and written later.

With the ``done`` policy (the default) a parent that settles other than ``done``
(failed, cancelled, expired) settles the child as ``cancelled`` instead, naming the
parent in ``last_error``; that cancel is a settlement too, so it goes on to the child's
own children, level by level, in the same transaction. With ``settled`` the child runs
whatever its parents' outcomes.

Attaching locks the parents first (``UPDATE ... SET dependents = true ... RETURNING
status``): a parent being acknowledged at that moment either settles before (and the
child counts it as settled) or after (and its acknowledgement sees the edge), never in
between. Should a worker die between a PostgreSQL acknowledgement and its release (they
are two transactions there, see the driver), the maintenance round's
:meth:`~DependencyStatements.release_stranded` finds the edges left open behind settled
parents.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Sequence
from dataclasses import replace
from datetime import datetime

from sqlalchemy import (
    Connection,
    delete,
    false,
    insert,
    literal_column,
    or_,
    select,
    true,
    update,
)

from ..errors import JobNotFound
from ..jobs import Job, JobStatus
from .history import HistoryStatements
from .records import HistoryEvent

#: Most parents one job may wait for (``after=``) and most members of one group.
MAX_PARENTS = 1000


class DependencyStatements(HistoryStatements):
    """Attach children to parents, release them as parents settle, and read the edges."""

    def check_parents(self, conn: Connection, parents: Sequence[int]) -> None:
        """Raise :class:`~flask_defer.JobNotFound` for a parent id no row has, before
        the child is written: a caller that catches the error and commits anyway must
        not commit a child that waits for nothing and runs at once.

        The parents found are held until *conn*'s transaction ends, so that none is
        pruned before :meth:`attach` links the child to it: ``FOR KEY SHARE`` on
        PostgreSQL (which blocks a delete, not a claim's or an outcome's update of the
        row), and on SQLite the write lock, taken here first (SQLAlchemy renders no
        ``FOR`` clause there).
        """
        t = self.table
        wanted = list(dict.fromkeys(parents))
        self.driver.begin_write(conn)
        found = set(
            conn.execute(
                select(t.c.id)
                .where(t.c.id.in_(wanted))
                .with_for_update(read=True, key_share=True)  # FOR KEY SHARE
            ).scalars()
        )
        for parent in wanted:
            if parent not in found:
                raise JobNotFound(parent)

    def attach(
        self,
        conn: Connection,
        child: Job,
        parents: Sequence[int],
        policy: str,
        *,
        now: datetime,
        actor: str = "app",
    ) -> Job:
        """Make the just-inserted *child* wait for *parents* (in *conn*'s transaction).

        The caller checked the parents first (:meth:`check_parents`), which holds
        them; :class:`~flask_defer.JobNotFound` here for a parent no row has would mean
        it did not, and the caller's transaction must then roll back. A parent
        already settled counts as settled: with the ``done`` policy, one that did not end
        ``done`` cancels the child at once. Returns the child as it now is.
        """
        t, d = self.table, self.dependencies_table
        wanted = list(dict.fromkeys(parents))
        locked = conn.execute(
            update(t)
            .where(t.c.id.in_(wanted))
            .values(dependents=True)
            .returning(t.c.id, t.c.status)
        ).all()
        status = {int(job_id): JobStatus(value) for job_id, value in locked}
        for parent in wanted:
            if parent not in status:
                raise JobNotFound(parent)
        live = [p for p in wanted if status[p].is_live]
        failed = [p for p in wanted if not status[p].is_live and status[p] is not JobStatus.DONE]
        doomed = policy == "done" and bool(failed)
        conn.execute(
            insert(d),
            [
                {"child_id": child.id, "parent_id": p, "policy": policy,
                 "open": p in live and not doomed}
                for p in wanted
            ],
        )  # fmt: skip
        if doomed:
            parent = failed[0]
            self._cancel_children(conn, {child.id: (parent, status[parent])}, now, actor)
            row = conn.execute(select(t).where(t.c.id == child.id)).mappings().one()
            return Job.from_row(row)
        if not live:
            return child
        conn.execute(update(t).where(t.c.id == child.id).values(waiting_for=len(live)))
        return replace(child, waiting_for=len(live))

    def release_children(
        self, conn: Connection, parents: Collection[int], *, now: datetime, actor: str = "app"
    ) -> None:
        """The children of *parents*, which settled in *conn*'s transaction: each closed
        edge lowers its child's count (released at zero), or, under the ``done`` policy
        behind a parent that did not end ``done``, cancels the child; cancelled children
        pass it on to their own children, level by level."""
        t, d = self.table, self.dependencies_table
        settled = sorted(set(parents))
        while settled:
            edges = conn.execute(
                update(d)
                .where(d.c.parent_id.in_(settled), d.c.open == true())
                .values(open=False)
                .returning(d.c.child_id, d.c.parent_id, d.c.policy)
            ).all()
            if not edges:
                return
            outcome = {
                int(job_id): JobStatus(value)
                for job_id, value in conn.execute(
                    select(t.c.id, t.c.status).where(t.c.id.in_({e[1] for e in edges}))
                )
            }
            doomed: dict[int, tuple[int, JobStatus]] = {}
            closed: Counter[int] = Counter()
            for child, parent, policy in sorted(edges):
                ended = outcome.get(int(parent), JobStatus.DONE)
                if policy == "done" and ended is not JobStatus.DONE:
                    doomed.setdefault(int(child), (int(parent), ended))
                closed[int(child)] += 1
            lowered = {c: n for c, n in closed.items() if c not in doomed}
            if len(set(doomed.values())) + len(set(lowered.values())) > 1:
                # More than one write: they go by cause and by count, an order another
                # release of other parents of the same children can cross (a deadlock
                # on PostgreSQL), so lock this level's children in id order first. A
                # cascade's next level can still cross another's; the children of a
                # release PostgreSQL aborts wait for release_stranded.
                self.driver.lock_in_order(conn, t, sorted(closed))
            settled = self._cancel_children(conn, doomed, now, actor)
            self._lower(conn, lowered, now, actor)

    def _cancel_children(
        self,
        conn: Connection,
        doomed: dict[int, tuple[int, JobStatus]],
        now: datetime,
        actor: str,
    ) -> list[int]:
        """Cancel each pending child in *doomed* because of its (parent, outcome); the
        ids of those that have children of their own (the next level)."""
        t = self.table
        by_cause: dict[tuple[int, JobStatus], list[int]] = defaultdict(list)
        for child, cause in doomed.items():
            by_cause[cause].append(child)
        next_level: list[int] = []
        events: list[HistoryEvent] = []
        for (parent, ended), children in sorted(by_cause.items()):
            note = f"parent job {parent} {ended.value}: not run (after_policy 'done')"
            rows = conn.execute(
                update(t)
                .where(
                    self.driver.ids_in(t.c.id, children),
                    t.c.status == literal_column("'pending'"),
                )
                .values(
                    {**self._settle_values(JobStatus.CANCELLED, now), "last_error": note,
                     "waiting_for": None}
                )
                .returning(t.c.id, t.c.attempts, t.c.dependents)
            ).all()  # fmt: skip
            events.extend(
                HistoryEvent(int(job_id), "cancelled", now, actor, attempts, note)
                for job_id, attempts, _ in rows
            )
            next_level.extend(int(job_id) for job_id, _, has_children in rows if has_children)
        self.record_events(conn, events)
        return next_level

    def _lower(self, conn: Connection, closed: dict[int, int], now: datetime, actor: str) -> None:
        """Lower each child's ``waiting_for`` by its closed edges; release it at zero.

        One UPDATE per distinct count (usually one), the driver's
        (:meth:`~.driver.Driver.lower_waiting`): ``waiting_for - n`` is computed by the
        database on the row it holds locked, never read here first. A released child is
        due from its ``run_at`` or now, whichever is later; it gets a ``released``
        event, and the workers of its queue are woken.
        """
        by_count: dict[int, list[int]] = defaultdict(list)
        for child, n in closed.items():
            by_count[n].append(child)
        for n, children in sorted(by_count.items()):
            released = self.driver.lower_waiting(conn, children, n, now=now, actor=actor)
            if self.driver.notifies:
                due = {queue for _, queue, run_at in released if self.wants_notify(run_at, now)}
                for queue in sorted(due):
                    self.notify(conn, queue)

    def release_stranded(self, *, now: datetime, actor: str = "app", limit: int = 500) -> int:
        """Release the children left behind settled parents; how many parents.

        An edge stays open past its parent's settlement only if the process died
        between a PostgreSQL acknowledgement and its release (two transactions there),
        or PostgreSQL aborted that release; the worker's maintenance round, ``run_due``
        and ``prune`` call this, so such a child waits one round at most.
        """
        t, d = self.table, self.dependencies_table
        stranded = (
            select(d.c.parent_id)
            .join(t, t.c.id == d.c.parent_id)
            .where(d.c.open == true(), t.c.status.not_in(["pending", "running"]))
            .distinct()
            .limit(limit)
        )
        # Looked for first: the usual round finds nothing and takes no write lock.
        with self.engine.connect() as conn:
            if not conn.execute(stranded).first():
                return 0
        with self.begin_immediate() as conn:
            parents = [int(p) for p in conn.execute(stranded).scalars()]
            if parents:
                self.release_children(conn, parents, now=now, actor=actor)
        return len(parents)

    def parents(self, conn: Connection, child_id: int) -> list[Job]:
        """The parents of *child_id*, oldest first (a pruned parent is left out)."""
        t, d = self.table, self.dependencies_table
        rows = conn.execute(
            select(t)
            .join(d, d.c.parent_id == t.c.id)
            .where(d.c.child_id == child_id)
            .order_by(t.c.id)
        ).mappings()
        return [Job.from_row(row) for row in rows]

    def open_parents(self, conn: Connection, child_id: int) -> list[int]:
        """The parents *child_id* still waits for (its open edges), oldest first."""
        d = self.dependencies_table
        rows = conn.execute(
            select(d.c.parent_id)
            .where(d.c.child_id == child_id, d.c.open == true())
            .order_by(d.c.parent_id)
        )
        return [int(parent) for parent in rows.scalars()]

    def children(self, conn: Connection, parent_id: int, *, limit: int = 100) -> list[Job]:
        """The children of *parent_id*, oldest first, at most *limit*."""
        t, d = self.table, self.dependencies_table
        rows = conn.execute(
            select(t)
            .join(d, d.c.child_id == t.c.id)
            .where(d.c.parent_id == parent_id)
            .order_by(t.c.id)
            .limit(limit)
        ).mappings()
        return [Job.from_row(row) for row in rows]

    def _forget_edges(self, conn: Connection, job_ids: Sequence[int]) -> None:
        """Delete the edges of *job_ids* (their jobs are being deleted in *conn*): all
        of a deleted child's, and a deleted parent's closed ones."""
        d = self.dependencies_table
        if not job_ids:
            return
        ids = list(job_ids)
        conn.execute(
            delete(d).where(
                or_(d.c.child_id.in_(ids), d.c.parent_id.in_(ids) & (d.c.open == false()))
            )
        )

