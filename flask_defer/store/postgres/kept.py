"""The worker's autocommit connections, kept from one statement to the next.

A worker's loop claims, and its flusher acknowledges, every few milliseconds while
there is a backlog, each in autocommit on a connection from the app's pool. That pool
hands its connections out first in, first out, so those statements went round every
connection the pool had opened; and PostgreSQL plans a statement anew on each
connection until psycopg has prepared it there (its fifth run) and the server has
chosen the prepared statement's generic plan (five runs more). A 10,000-job drain
planned a fifth of its claims and nearly half of its acknowledgements, about 0.9 ms
of server CPU each (``pg_stat_statements``, ``track_planning``): a seventh of the
server's time a job.

So a thread that says it will write often (:meth:`KeptConnections.keeping`: the
worker's loop and its flusher) keeps its autocommit connection between statements.
It is kept only while it is busy: one unused for :data:`KEPT_IDLE` seconds, or held
for :data:`KEPT_AT_MOST`, goes back to the pool at the thread's next statement, which
checks one out again (so the pool's ``pool_pre_ping`` and ``pool_recycle`` still
apply to an idle worker and to a long backlog). One whose block raised is handed
back at once (invalidated by then if the server went away), so an error never
leaves a connection in doubt in use. Any other thread, and a nested block, check
out from the pool as before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy import Connection

#: Seconds a kept connection may sit unused and still be used again without the pool.
KEPT_IDLE = 1.0
#: Seconds a connection may be kept at most before it goes back to the pool.
KEPT_AT_MOST = 60.0


class _Kept:
    """One thread's kept connection and its times."""

    __slots__ = ("conn", "since", "used")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.since = self.used = time.monotonic()


class KeptConnections:
    """Per-thread autocommit connections, kept while their thread keeps writing.

    *checkout* opens a pooled connection already switched to autocommit, or returns
    None when it cannot be (a watched engine, one already in autocommit): that
    thread then goes the pool's way for every statement. *release* switches one back
    and returns it to the pool.
    """

    def __init__(
        self,
        checkout: Callable[[], Connection | None],
        release: Callable[[Connection], None],
    ) -> None:
        self._checkout = checkout
        self._release = release
        self._local = threading.local()

    @contextmanager
    def keeping(self) -> Iterator[None]:
        """Keep this thread's autocommit connection between its statements until the
        block ends (a worker's loop, its flusher), then hand it back to the pool."""
        local = self._local
        if getattr(local, "keeping", False):
            yield  # already kept by an outer block, which gives it back
            return
        local.keeping = True
        local.depth = 0
        local.unkeepable = False
        try:
            yield
        finally:
            local.keeping = False
            self._drop()

    @contextmanager
    def use(self) -> Iterator[Connection | None]:
        """This thread's kept connection for one autocommit block, or None when this
        thread keeps none (the caller then checks out from the pool)."""
        local = self._local
        if not getattr(local, "keeping", False) or local.depth or local.unkeepable:
            # Not a keeping thread, a block inside a block, or an engine whose
            # connections cannot be kept: the pool's.
            yield None
            return
        kept = self._fresh()
        if kept is None:
            yield None
            return
        local.depth += 1
        try:
            yield kept.conn
        except BaseException:
            self._drop()
            raise
        else:
            kept.used = time.monotonic()
        finally:
            local.depth -= 1

    def _fresh(self) -> _Kept | None:
        """The kept connection if still fit to use, else a new one from the pool."""
        local = self._local
        kept: _Kept | None = getattr(local, "kept", None)
        if kept is not None:
            now = time.monotonic()
            conn = kept.conn
            if (
                now - kept.used <= KEPT_IDLE
                and now - kept.since <= KEPT_AT_MOST
                and not conn.closed
                and not conn.invalidated
            ):
                return kept
            self._drop()
        fresh = self._checkout()
        if fresh is None:
            # Asked once per keeping block: each later block goes the pool's way at
            # once, without a checkout only to learn this again.
            local.unkeepable = True
            return None
        kept = local.kept = _Kept(fresh)
        return kept

    def _drop(self) -> None:
        """Hand this thread's kept connection back to the pool, if it keeps one."""
        local = self._local
        kept: _Kept | None = getattr(local, "kept", None)
        local.kept = None
        if kept is not None:
            self._release(kept.conn)

