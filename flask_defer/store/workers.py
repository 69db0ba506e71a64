"""The live workers table: who is running, serving which queues, holding which jobs.

Each worker (and each ``run_due`` while it holds jobs) writes its row when its lease
heartbeat starts, refreshes it with each beat and deletes it when it stops
(:class:`~flask_defer.engine.leases.LeaseHeartbeat` does all three). A worker killed
with ``kill -9`` cannot delete its row: readers call it stale after two missed
heartbeats, and maintenance deletes it after :data:`WORKER_RETENTION`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, insert, select, update

from .history import HistoryStatements
from .records import WorkerInfo

#: How long the row of a worker that stopped without deleting it is kept.
WORKER_RETENTION = timedelta(days=1)
#: Heartbeats a worker may miss before it is called stale.
MISSED_HEARTBEATS = 2


class WorkerStatements(HistoryStatements):
    """Write, refresh, delete and read the workers' rows."""

    def register_worker(self, row: dict[str, Any]) -> None:
        """Write a starting worker's row (*row*: the table's columns)."""
        with self.begin() as conn:
            conn.execute(insert(self.workers_table).values(row))

    def refresh_worker(
        self, worker_id: str, *, now: datetime, running: Sequence[int], listening: bool | None,
        row: dict[str, Any],
    ) -> None:
        """A heartbeat: ``last_seen``, the jobs it holds and whether it hears; writes
        *row* again if maintenance deleted it meanwhile (a stall longer than a day)."""
        w = self.workers_table
        values = {"last_seen": now, "running": list(running), "listening": listening}
        with self.begin() as conn:
            changed = conn.execute(update(w).where(w.c.id == worker_id).values(values)).rowcount
            if not changed:
                conn.execute(insert(w).values({**row, **values}))

    def deregister_worker(self, worker_id: str) -> None:
        """Delete a stopping worker's row."""
        w = self.workers_table
        with self.begin() as conn:
            conn.execute(delete(w).where(w.c.id == worker_id))

    def workers(self, *, now: datetime) -> list[WorkerInfo]:
        """Every row, live ones first, then by start; ``stale`` judged at *now*."""
        w = self.workers_table
        with self.engine.connect() as conn:
            rows = conn.execute(select(w).order_by(w.c.started_at, w.c.id)).mappings().all()
        found = [
            WorkerInfo(
                id=r["id"], kind=r["kind"], host=r["host"], pid=r["pid"],
                queues=tuple(r["queues"] or ()), concurrency=r["concurrency"],
                version=r["version"], started_at=r["started_at"], last_seen=r["last_seen"],
                heartbeat_seconds=r["heartbeat_seconds"],
                running=tuple(int(i) for i in r["running"] or ()),
                stale=now - r["last_seen"]
                > timedelta(seconds=r["heartbeat_seconds"] * MISSED_HEARTBEATS),
                listening=r["listening"], names=tuple(r["names"] or ()),
            )  # fmt: skip
            for r in rows
        ]
        return sorted(found, key=lambda info: info.stale)

    def forget_workers(self, *, now: datetime) -> int:
        """Delete the rows of workers unseen for :data:`WORKER_RETENTION`; how many."""
        w = self.workers_table
        old = w.c.last_seen < now - WORKER_RETENTION
        with self.engine.connect() as conn:
            if conn.execute(select(w.c.id).where(old).limit(1)).first() is None:
                return 0
        with self.begin_immediate() as conn:
            return int(conn.execute(delete(w).where(old)).rowcount)
