"""Sleeping until there is work: a deadline, a local nudge, or a PostgreSQL NOTIFY.

The worker computes how long it may sleep (until the next job's ``run_at``, bounded by
``DEFER_MAX_SLEEP``) and asks a :class:`Waker` to sleep that long. Three things end the
sleep early:

* a local :meth:`Waker.wake` — a handler finished and a thread is free, or a signal
  asked the worker to stop. It writes a byte to a socket pair, which is safe from a
  signal handler and from any thread, and is what ``select`` waits on;
* on PostgreSQL a ``NOTIFY`` on :data:`~flask_defer.store.NOTIFY_CHANNEL`, which the
  scheduling transaction sends and the server delivers when it commits;
* the timeout.

Notifications are an optimisation and the timed wake is the floor: if the LISTEN
connection drops (server restart), the waker says so (:attr:`Waker.listening` is False,
so the worker polls every ``DEFER_POLL_INTERVAL``) and reconnects with a backoff.

A LISTEN can also open and hear nothing: behind a transaction-mode pooler (PgBouncer,
Supavisor, Neon's pooled URL) the server connection that listens is handed to other
clients after each transaction. So every time it opens, the waker sends itself a
notification through the app's own engine (*probe*) and counts as listening only once
that arrives; until then, and for good if it does not arrive within
:data:`PROBE_TIMEOUT`, the worker polls, and a warning names
``DEFER_LISTEN_DATABASE_URI`` (a direct connection for the LISTEN).
"""

from __future__ import annotations

import enum
import logging
import selectors
import socket
import time
import uuid
from collections.abc import Callable, Collection
from typing import Any

logger = logging.getLogger("flask_defer.worker")

#: Longest wait between two attempts to re-open a dropped LISTEN connection.
MAX_RECONNECT_DELAY = 5.0
#: How long a new LISTEN has to hear its own test notification before it counts as deaf.
PROBE_TIMEOUT = 1.0
#: The PostgreSQL channel of that test notification (``store.records.PROBE_CHANNEL``).
PROBE_CHANNEL = "flask_defer_probe"


class Wake(enum.Enum):
    """Why :meth:`Waker.wait` returned."""

    TIMEOUT = "timeout"
    LOCAL = "local"  # wake() was called
    NOTIFY = "notify"  # a PostgreSQL notification for one of our queues
    RECONNECTED = "reconnected"  # LISTEN is back; notifications may have been missed


class Waker:
    """Sleeps for the worker; wakes on a deadline, :meth:`wake`, or a NOTIFY.

    *open_listener* (PostgreSQL only) returns a psycopg connection already LISTENing;
    without it the waker only sleeps and wakes locally (SQLite). *queues* limits which
    notifications wake it (the payload is the job's queue); ``None`` means all.
    """

    def __init__(
        self,
        open_listener: Callable[[], Any] | None = None,
        *,
        queues: Collection[str] | None = None,
        probe: Callable[[str], None] | None = None,
        probe_timeout: float = PROBE_TIMEOUT,
    ) -> None:
        self._reader: socket.socket | None = None
        self._writer: socket.socket | None = None
        # selectors (epoll/kqueue), not select(): a web process running the embedded
        # worker may well have file descriptors above select()'s limit of 1024.
        self._selector: selectors.BaseSelector | None = None
        self._open_listener = open_listener
        self._queues = frozenset(queues) if queues else None
        self._listener: Any = None
        self._listener_fd: int | None = None
        self._reconnect_at = 0.0
        self._reconnect_delay = 0.1
        self._ever_listened = False
        self.notifications = 0
        # The LISTEN self-test: the token sent, whether it came back, and when to give up.
        self._probe = probe
        self._probe_timeout = probe_timeout
        self._probe_token: str | None = None
        self._probe_deadline = 0.0
        self._heard = probe is None
        #: True once a LISTEN opened and did not hear its own test notification in time.
        self.deaf = False
        # Set by wake() until the loop takes the wake: one syscall per wake-up, not per
        # finished handler. Cleared before the socket is drained, and a wait that finds
        # it set returns at once, so a wake is never lost between the two.
        self._woken = False

    @property
    def listening(self) -> bool:
        """True while a LISTEN connection is up and has heard its own test notification
        (so polling is unnecessary)."""
        return self._listener is not None and self._heard

    def start(self) -> None:
        """Open the wake-up socket pair and the LISTEN connection (errors are logged)."""
        if self._reader is None:
            self._reader, self._writer = socket.socketpair()
            self._reader.setblocking(False)
            self._writer.setblocking(False)
            self._selector = selectors.DefaultSelector()
            self._selector.register(self._reader, selectors.EVENT_READ, "local")
        if self._open_listener is not None and self._listener is None:
            self._try_listen()

    def wake(self) -> None:
        """End the current or next :meth:`wait` at once (thread- and signal-safe).

        Before :meth:`start` there is nothing to wake; the caller's own stop flag is
        checked before the first wait.
        """
        writer = self._writer
        if writer is None:
            return
        if self._woken:
            return  # a wake is on its way already: handlers finishing together send one
        self._woken = True
        try:
            writer.send(b"\0")
        except (BlockingIOError, OSError):
            # The buffer is full of earlier wakes, or we are closed: either way the
            # reader has (or needs) nothing more.
            pass

    def wait(self, timeout: float) -> Wake:
        """Sleep up to *timeout* seconds; return why the sleep ended."""
        if self._selector is None:
            raise RuntimeError("Waker.start() first")
        deadline = time.monotonic() + max(timeout, 0.0)
        self._check_probe()
        if self._woken and self._reader is not None:
            self._woken = False
            self._drain_local()
            return Wake.LOCAL
        while True:
            if self._open_listener is not None and self._listener is None:
                if time.monotonic() >= self._reconnect_at and self._try_listen():
                    return Wake.RECONNECTED
            remaining = deadline - time.monotonic()
            if self._listener is None and self._open_listener is not None:
                # Come back in time to try reconnecting again.
                remaining = min(remaining, max(self._reconnect_at - time.monotonic(), 0.0))
            ready = {key.data for key, _ in self._selector.select(max(remaining, 0.0))}
            if "local" in ready:
                self._woken = False
                self._drain_local()
                return Wake.LOCAL
            if "listener" in ready and self._receive_notifications():
                self.notifications += 1
                return Wake.NOTIFY
            if time.monotonic() >= deadline:
                return Wake.TIMEOUT

    def close(self) -> None:
        """Close the LISTEN connection and the socket pair."""
        self._drop_listener()
        if self._selector is not None:
            self._selector.close()
            self._selector = None
        reader, writer = self._reader, self._writer
        self._reader = self._writer = None
        for sock in (reader, writer):
            if sock is not None:
                sock.close()

    # -- internals ----------------------------------------------------------------

    def _drain_local(self) -> None:
        assert self._reader is not None
        try:
            while self._reader.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _receive_notifications(self) -> bool:
        """Read what arrived on the LISTEN connection; True if one is for our queues."""
        import psycopg

        pgconn = self._listener.pgconn
        try:
            pgconn.consume_input()
            if pgconn.status != psycopg.pq.ConnStatus.OK:
                # The server said goodbye (e.g. "terminating connection due to
                # administrator command") without the socket failing yet.
                raise psycopg.OperationalError("the server closed the connection")
        except psycopg.OperationalError as error:
            logger.warning(
                "LISTEN connection lost (%s); polling every poll interval until it is back",
                str(error).strip() or type(error).__name__,
            )
            self._drop_listener()
            self._schedule_reconnect()
            return False
        relevant = False
        while (notice := pgconn.notifies()) is not None:
            text = bytes(notice.extra).decode("utf-8", "replace")
            if bytes(notice.relname).decode("utf-8", "replace") == PROBE_CHANNEL:
                if text == self._probe_token and not self._heard:
                    self._heard = True
                    if self.deaf:
                        logger.info("LISTEN hears notifications now; polling stops")
                    self.deaf = False
                continue
            if self._queues is None or text in self._queues:
                relevant = True
        return relevant

    def _send_probe(self) -> None:
        """Send the new LISTEN its test notification through the app's own engine."""
        if self._probe is None:
            return
        self._heard = False
        self._probe_token = uuid.uuid4().hex
        self._probe_deadline = time.monotonic() + self._probe_timeout
        try:
            self._probe(self._probe_token)
        except Exception as error:  # noqa: BLE001 - unheard: the deadline says so
            logger.debug("could not send the LISTEN test notification: %s", error)

    def _check_probe(self) -> None:
        """Warn once when the LISTEN did not hear its test notification in time."""
        if (
            self._heard
            or self.deaf
            or self._listener is None
            or time.monotonic() < self._probe_deadline
        ):
            return
        self.deaf = True
        logger.warning(
            "the LISTEN connection hears no notifications (its own test did not arrive "
            "within %g s): is the database URL a transaction-mode pooler (PgBouncer, "
            "Supavisor, Neon's pooled URL)? Set DEFER_LISTEN_DATABASE_URI to a direct "
            "connection's URL; until then this worker polls every poll interval",
            self._probe_timeout,
        )

    def _try_listen(self) -> bool:
        assert self._open_listener is not None
        try:
            self._listener = self._open_listener()
        except Exception as error:  # noqa: BLE001 - any failure means "poll for now"
            # Loud on the first failure of a streak, quiet while the server is down.
            first = self._reconnect_delay == 0.1
            logger.log(
                logging.WARNING if first else logging.DEBUG,
                "could not open the LISTEN connection (%s); polling meanwhile",
                str(error).strip().splitlines()[0] if str(error).strip() else repr(error),
            )
            self._schedule_reconnect()
            return False
        if self._selector is not None:
            # Remember the number: a lost psycopg connection no longer reports it.
            self._listener_fd = self._listener.fileno()
            self._selector.register(self._listener_fd, selectors.EVENT_READ, "listener")
        if self._ever_listened:
            logger.info("LISTEN connection re-established")
        self._ever_listened = True
        self._reconnect_delay = 0.1
        self._send_probe()
        return True

    def _schedule_reconnect(self) -> None:
        self._reconnect_at = time.monotonic() + self._reconnect_delay
        self._reconnect_delay = min(self._reconnect_delay * 2, MAX_RECONNECT_DELAY)

    def _drop_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            if self._selector is not None and self._listener_fd is not None:
                try:
                    self._selector.unregister(self._listener_fd)
                except (KeyError, ValueError, OSError):
                    pass  # the socket is already gone
            self._listener_fd = None
            try:
                listener.close()
            except Exception:  # noqa: BLE001 - closing a dead connection may fail
                pass
