"""When the next job a claim could take is due: the worker's poll and its sleep.

It answers with the claim's own rules (``claim_sql``), so a worker never wakes for a
job it may not start: of a paused queue or name, expired, or of a concurrency key
with no free slot.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import BindParameter, Integer, bindparam, column, text
from sqlalchemy.exc import OperationalError

from .claim_sql import KEYED, next_keyed_sql, next_unkeyed_sql
from .history import HistoryStatements
from .schema import UTCDateTime


class DueStatements(HistoryStatements):
    """When the next claimable job is due."""

    def next_run_at(
        self, *, queues: Collection[str] | None = None, now: datetime | None = None
    ) -> datetime | None:
        """When the earliest job a claim could take is due (None: nothing pending).

        Jobs a claim leaves alone do not count: of a paused queue or name, expired (at
        *now*, default the current time), or of a ``concurrency_key`` with no free slot.
        This is the SQLite worker's poll, so it must cost the same with a million
        future rows as with ten: one step into the pending index per priority present
        (see ``claim_sql``), plus, while keyed jobs are about, a look at those.
        """
        params: dict[str, Any] = {"now": now if now is not None else datetime.now(UTC)}
        if queues:
            params["queues"] = list(queues)
        try:
            with self.engine.connect() as conn:
                # One round trip: the unkeyed answer and whether any keyed job is pending.
                row = conn.execute(self._next_statement("next", bool(queues)), params).one()
                found = [row.run_at]
                if row.keyed is not None or self._keyed_until > time.monotonic():
                    statement = self._next_statement("next-keyed", bool(queues))
                    found.append(conn.execute(statement, params).scalar())
        except OperationalError as error:
            if not self._lost_pending_index(error):
                raise
            return self.next_run_at(queues=queues, now=now)
        times = [at for at in found if at is not None]
        return min(times) if times else None

    def _next_statement(self, kind: str, queues: bool) -> Any:
        cached = self._claim_sql.get((kind, queues, None))
        if cached is not None:
            return cached
        tables = self.claim_tables()
        binds: list[BindParameter[Any]] = [bindparam("now", type_=UTCDateTime())]
        if queues:
            binds.append(bindparam("queues", expanding=True))
        columns: list[Any] = [column("run_at", UTCDateTime())]
        if kind == "next":
            sql = (
                f"SELECT ({next_unkeyed_sql(tables, queues=queues)}) AS run_at,"
                f" (SELECT 1 FROM {tables.jobs}{tables.keyed_hint} WHERE {KEYED} LIMIT 1)"
                " AS keyed"
            )
            columns.append(column("keyed", Integer()))
        else:
            sql = next_keyed_sql(tables, queues=queues)
        stmt = text(sql).bindparams(*binds).columns(*columns)
        self._claim_sql[(kind, queues, None)] = stmt
        return stmt
