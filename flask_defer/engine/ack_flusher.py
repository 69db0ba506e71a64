"""The worker's batched acknowledgements, written on a thread of their own.

Handler threads hand their outcomes in here instead of each writing its own. The
flusher writes everything handed in once the first of it has waited
``DEFER_ACK_FLUSH``: one statement for the batch, compare-and-set per row on the claim
token. It has its own thread so that a flush's commit (which waits for the disk) never
holds up the claim loop: claims and flushes overlap, and a busy worker pays one
durable commit per batch of outcomes, not per job. A worker killed before the flush
re-runs those jobs after their leases (at least once, as documented).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import partial

from sqlalchemy.exc import SQLAlchemyError

from .execution import Outcome, PendingAck
from .logs import brief
from .outcomes import DROPPED, written_alone

logger = logging.getLogger("flask_defer.worker")

#: Longest pause between attempts to write a batch while the database is down.
MAX_RETRY_DELAY = 5.0


#: One handed-in outcome, and whether it counts in the summary (False: abandoned at
#: its timeout, already counted as a timeout).
Entry = tuple[PendingAck, bool]


class AckFlusher:
    """Outcomes handed in by handler threads, written in batches by one thread.

    *write* writes a batch and returns its outcomes in order (``Runner.flush``); its
    second argument names the claims (job id, token) whose outcome was written once
    before and raised, so may be written already. *settled* is called with each
    counted outcome once written. *refused* tells a batch the database refused for a
    value in it, written again one outcome at a time, from one it could not take for
    its own state, retried whole (``JobStore.refuses_values``).
    """

    def __init__(
        self,
        write: Callable[[Sequence[PendingAck], Collection[tuple[int, str]]], list[Outcome]],
        settled: Callable[[Outcome], None],
        flush_after: float,
        *,
        refused: Callable[[SQLAlchemyError], bool],
        keeping: Callable[[], AbstractContextManager[None]] = nullcontext,
    ) -> None:
        self.flush_after = flush_after
        self._refused = refused
        #: The flushing thread's scope: the store keeps its connection in between
        #: batches (``JobStore.keeping_connections``).
        self._keeping = keeping
        self._write = write
        self._settled = settled
        self._entries: list[Entry] = []
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._writing = 0  # entries taken out and not yet written
        self._stopping = False
        self._failures = 0
        #: Claims (job id, token) whose counted outcome met an error: that write may
        #: have committed before the error, so the next one asks (``Executor.flush``).
        self._tried: set[tuple[int, str]] = set()
        self._thread = threading.Thread(target=self._run, name="flask-defer-acks", daemon=True)

    def __len__(self) -> int:
        return len(self._entries) + self._writing

    def start(self) -> None:
        self._thread.start()

    def add(self, pending: PendingAck, counted: bool) -> None:
        """Hand in one outcome (from any thread); the first of a batch sets its deadline."""
        with self._cond:
            self._entries.append((pending, counted))
            if self._deadline is None:
                self._deadline = time.monotonic() + self.flush_after
                self._cond.notify()

    def idle(self) -> bool:
        """True when every handed-in outcome is written (or given up at shutdown)."""
        with self._cond:
            return not self._entries and not self._writing

    def stop(self, timeout: float = 30.0) -> int:
        """Write what is left now and end the thread; how many outcomes stayed unwritten."""
        with self._cond:
            self._stopping = True
            self._deadline = time.monotonic()
            self._cond.notify()
        if self._thread.ident is not None:
            self._thread.join(timeout)
        else:
            self._flush_once()  # never started (a worker that failed to start)
        return len(self)

    # -- the flushing thread ----------------------------------------------------------

    def _run(self) -> None:
        with self._keeping():
            self._loop()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._entries and self._deadline is not None:
                        wait = self._deadline - time.monotonic()
                        if wait <= 0:
                            break
                    elif self._stopping:
                        return
                    else:
                        wait = None
                    self._cond.wait(wait)
            if not self._flush_once() and self._stopping:
                return  # the database is down at shutdown: those jobs run again

    def _flush_once(self) -> bool:
        """Write the batch handed in so far; False when the database refused it."""
        with self._cond:
            batch, self._entries = self._entries, []
            self._deadline = None
            self._writing = len(batch)
        if not batch:
            return True
        try:
            outcomes = self._write([pending for pending, _ in batch], self._tried_in(batch))
        except SQLAlchemyError as error:
            # Part of it may be written all the same: a lost reply after the commit, or
            # (PostgreSQL) a refusal after the batch statement, releasing children.
            self._remember_tried(batch)
            if self._refused(error):
                return self._write_one_by_one(batch, error)
            self._put_back(batch, error)
            return False
        except Exception:  # noqa: BLE001 - the flusher must outlive a bad batch
            # Not the database: retrying would fail the same way. The rows stay running
            # and their jobs run again once their leases lapse.
            logger.exception("could not write %d outcome(s); dropped", len(batch))
            self._tried.difference_update(_claims(batch))
            with self._cond:
                self._writing = 0
            return True
        try:
            self._count(outcomes, batch)
        finally:
            with self._cond:
                self._writing = 0
        return True

    def _tried_in(self, entries: Sequence[Entry]) -> set[tuple[int, str]]:
        """The claims of *entries* written once before: looked at only after an error."""
        if not self._tried:
            return set()
        return set(_claims(entries)) & self._tried

    def _remember_tried(self, entries: Sequence[Entry]) -> None:
        """*entries*' write raised: the counted ones may be written already. Not a
        time-out's late outcome (uncounted), whose event kind the time-out shares."""
        self._tried.update(_claims(entry for entry in entries if entry[1]))

    def _count(self, outcomes: list[Outcome], entries: Sequence[Entry]) -> None:
        """The batch is written, after any failed attempts: its counted outcomes settle."""
        if self._failures:
            logger.info("outcomes written again after %d failed attempt(s)", self._failures)
            self._failures = 0
        self._settle(outcomes, entries)

    def _settle(self, outcomes: list[Outcome], entries: Sequence[Entry]) -> None:
        """*entries* were written, with these *outcomes*: the counted ones are settled."""
        if self._tried:
            self._tried.difference_update(_claims(entries))
        for outcome, (_, counted) in zip(outcomes, entries, strict=True):
            if counted:
                self._settled(outcome)

    def _put_back(self, entries: list[Entry], error: SQLAlchemyError) -> None:
        """The database could not take *entries* now: ahead of newer ones, they are tried
        again after a pause that doubles with each failure (at once when stopping)."""
        self._failures += 1
        delay = min(0.1 * 2.0 ** min(self._failures - 1, 10), MAX_RETRY_DELAY)
        with self._cond:
            self._entries[:0] = entries
            self._writing = 0
            self._deadline = time.monotonic() + (0.0 if self._stopping else delay)
        level = logging.ERROR if self._stopping else logging.WARNING
        logger.log(
            level,
            "could not write %d outcome(s) (%s); %s",
            len(entries),
            brief(error),
            "those jobs run again when their leases lapse"
            if self._stopping
            else f"retrying in {delay:.1f} s",
        )

    def _write_one_by_one(self, batch: list[Entry], error: SQLAlchemyError) -> bool:
        """The database refused *batch* for a value in it, not for its own state: each
        outcome is written on its own, so that one it refuses for good (an app's trigger
        or constraint on the jobs table, a value too large for it) holds none of the
        others back. Retried as a batch, it would fail the same way for ever, with
        every newer outcome behind it.

        A done outcome refused on its own for its result's size fails its job instead
        (``written_alone``): running the handler again would only make the same
        result. Any other outcome refused on its own is dropped, logged with the
        database's reason: its row stays running and its job runs again once its lease
        lapses, as a killed worker's would. Should the database fail otherwise meanwhile
        (gone, locked), the outcomes not written yet go back for the usual retry
        (False). A batch of one is written once more too: part of a refused batch may be
        written (see ``_flush_once``), and the second write is what finds that out.
        """
        written: list[Outcome] = []
        entries: list[Entry] = []
        try:
            if len(batch) > 1:
                logger.warning(
                    "the database refused a batch of %d outcomes (%s); writing them one by one",
                    len(batch),
                    brief(error),
                )
            for i, entry in enumerate(batch):
                try:
                    write = partial(self._write_one, self._tried_in([entry]))
                    outcome, pending = written_alone(write, entry[0])
                except SQLAlchemyError as alone:
                    if not self._refused(alone):
                        self._put_back(batch[i:], alone)  # back before the flusher looks idle
                        return False
                    self._drop(entry[0], alone)
                    continue
                written.append(outcome)
                entries.append((pending, entry[1]))
            return True
        finally:
            try:
                self._settle(written, entries)
            finally:
                with self._cond:
                    self._writing = 0

    def _write_one(self, tried: Collection[tuple[int, str]], pending: PendingAck) -> Outcome:
        (outcome,) = self._write([pending], tried)
        return outcome

    def _drop(self, pending: PendingAck, error: SQLAlchemyError) -> None:
        self._tried.discard((pending.ack.job_id, pending.ack.claim_token))
        logger.error(DROPPED, pending.ack.job_id, brief(error))


def _claims(entries: Iterable[Entry]) -> Iterator[tuple[int, str]]:
    """Each entry's claim: its job id and claim token."""
    return ((pending.ack.job_id, pending.ack.claim_token) for pending, _ in entries)
