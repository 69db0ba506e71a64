"""A worker's row in the live workers table: what it writes at start, on each heartbeat
and at its end (the store's ``WorkerStatements``), so ``defer.workers()``, the
dashboard's Workers page and ``health()`` see who is running.

No Flask here; the lease heartbeat (:mod:`.leases`) drives it.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from importlib import metadata
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from ..store import JobStore
from .logs import brief

logger = logging.getLogger("flask_defer.worker")


@functools.cache
def _version() -> str:
    # Cached: a look through every installed distribution, 2-3 ms each time.
    try:
        return metadata.version("flask-defer-jobs")
    except metadata.PackageNotFoundError:  # a source checkout, not installed
        return "unknown"


class Presence:
    """One worker's row: written by :meth:`arrive`, refreshed by :meth:`beat`, deleted
    by :meth:`leave`. A database error is logged, never raised: a worker whose row
    cannot be written still runs its jobs (a schema not upgraded yet, a blip).

    With ``at_first_beat`` (``run_due``), the row is first written by the first
    heartbeat, not on arrival: a call that is over within one heartbeat writes and
    deletes nothing. Those two extra write transactions (each a commit, an fsync on
    SQLite) were most of what a short ``run_due()`` cost beyond its jobs, and a row
    that lives less than a heartbeat is gone before a page could show it.
    """

    def __init__(
        self,
        store: JobStore,
        *,
        kind: str,
        queues: Collection[str] | None,
        concurrency: int,
        heartbeat_seconds: float,
        listening: Callable[[], bool | None] = lambda: None,
        names: Collection[str] = (),
        at_first_beat: bool = False,
    ) -> None:
        self.store = store
        self.at_first_beat = at_first_beat
        self.listening = listening
        host = socket.gethostname()
        self.id = f"{host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._row: dict[str, Any] = {
            "id": self.id,
            "kind": kind,
            "host": host[:255],
            "pid": os.getpid(),
            "queues": sorted(queues or ()),
            "concurrency": concurrency,
            "version": _version()[:32],
            "heartbeat_seconds": heartbeat_seconds,
            "running": [],
            "listening": None,
            "names": sorted(names),
        }
        self._here = False
        # Whether the row may be in the table (written, and not deleted since).
        self._written = False
        # A beat and the leave never interleave: a beat that found the row gone would
        # write it again after the stop deleted it.
        self._lock = threading.Lock()

    def arrive(self, now: datetime) -> None:
        """Write this worker's row."""
        row = {**self._row, "started_at": now, "last_seen": now, "listening": self.listening()}
        self._row = row
        if not self.at_first_beat:
            self._written = True
            self._try("write", lambda: self.store.register_worker(row))
        self._here = True

    def beat(self, now: datetime, running: Sequence[int]) -> None:
        """Refresh the row: seen now, holding *running*."""
        with self._lock:
            if not self._here:
                return
            # The refresh writes the row if it is missing (at_first_beat, or deleted).
            self._written = True
            self._try(
                "refresh",
                lambda: self.store.refresh_worker(
                    self.id, now=now, running=list(running), listening=self.listening(),
                    row=self._row,
                ),
            )  # fmt: skip

    def leave(self) -> None:
        """Delete the row (a graceful stop)."""
        with self._lock:
            if self._here:
                self._here = False
                if self._written:
                    self._try("delete", lambda: self.store.deregister_worker(self.id))

    def _try(self, what: str, action: Callable[[], None]) -> None:
        try:
            action()
        except SQLAlchemyError as error:
            logger.warning(
                "could not %s this worker's row in the workers table (%s); run "
                "`flask defer db upgrade` if the schema is behind",
                what,
                brief(error),
            )
