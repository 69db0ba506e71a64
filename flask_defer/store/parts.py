"""What a driver sees of its store: the tables, the portable statements it reuses.

A driver (:mod:`.sqlite`, :mod:`.postgres`) is handed its store at construction and
reaches it only through this Protocol, so the drivers import nothing of the store's
classes and :mod:`.driver`, which picks one, imports them without a circle.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Connection, Dialect, Engine, Table

from .claim_sql import ClaimTables
from .records import HistoryEvent


class StoreParts(Protocol):
    """The part of a :class:`~flask_defer.store.JobStore` its driver uses."""

    engine: Engine
    #: A direct connection's engine for the worker's LISTEN (behind a pooler), or None.
    listen_engine: Engine | None
    #: The jobs table (a copy typed with aware-UTC times).
    table: Table
    #: The history table, or None with ``DEFER_HISTORY = False``.
    history_table: Table | None
    pauses_table: Table

    @property
    def quoted_table(self) -> str:
        """The jobs table's name as the SQL text writes it."""

    def claim_tables(self) -> ClaimTables:
        """The names the claim statements use, with the driver's index hints."""

    def keyed_in_play(self, conn: Connection) -> bool:
        """Whether keyed jobs may be pending (a cheap, remembered look)."""

    def keyed_remembered(self) -> bool | None:
        """The remembered answer of :meth:`keyed_in_play`, or None when it must look."""

    def keyed_scheduled(self) -> None:
        """Keyed jobs are about: the claims look for them for a while."""

    def record_events(self, conn: Connection, events: Sequence[HistoryEvent]) -> None:
        """Insert history events in *conn*'s transaction."""

    def record_starts(self, conn: Connection, jobs: Sequence[Any], now: datetime) -> None:
        """Count just-claimed rate-limited jobs in their buckets (same transaction)."""

    def release_children(
        self, conn: Connection, parents: Collection[int], *, now: datetime, actor: str = "app"
    ) -> None:
        """Release (or cancel) the children of *parents*, settled in *conn*'s transaction."""

    def begin(self) -> AbstractContextManager[Connection]:
        """A short transaction of the store's own."""

    def autocommit(self) -> AbstractContextManager[Connection]:
        """A connection where each statement is its own transaction."""

    def row_values(self, new: Any, now: Any) -> dict[str, Any]:
        """The column values of a new job's row (in the table's column order)."""

    def job_insert(
        self, dialect: Dialect, *, keyed: bool = False
    ) -> tuple[str, list[str], list[tuple[int, Any]]]:
        """The compiled INSERT of one job (*keyed*: ``ON CONFLICT DO NOTHING`` on the
        live key), its bind order and conversions."""


def insert_values(
    order: Sequence[str],
    processors: Sequence[tuple[int, Any]],
    values: dict[str, Any],
    payload_json: str | None,
) -> list[Any]:
    """The one-job insert's parameters (:meth:`StoreParts.job_insert`'s *order* and
    conversions over *values*), the payload sent as *payload_json* when given: the text
    validation made of it, which the JSON column would have encoded the same."""
    row = [values[name] for name in order]
    as_is = order.index("payload") if payload_json is not None else -1
    for i, process in processors:
        row[i] = payload_json if i == as_is else process(row[i])
    return row
