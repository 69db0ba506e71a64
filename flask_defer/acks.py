"""The worker's batch of acknowledgements: handlers' outcomes waiting to be written.

Handler threads hand their outcomes in here instead of each writing its own; the
worker's loop writes the whole batch in one statement (compare-and-set per row on the
claim token) once the first of them has waited ``DEFER_ACK_FLUSH``. A worker killed
before the flush re-runs those jobs after their leases (at least once, as documented).
"""

from __future__ import annotations

import threading
import time

from .execution import PendingAck

#: One handed-in outcome, and whether it counts in the summary (False: abandoned at
#: its timeout, already counted as a timeout).
Entry = tuple[PendingAck, bool]


class AckBuffer:
    """Outcomes handed in by handler threads, taken out by the loop in one batch."""

    def __init__(self, flush_after: float) -> None:
        self.flush_after = flush_after
        self._entries: list[Entry] = []
        self._lock = threading.Lock()
        self._deadline: float | None = None

    @property
    def deadline(self) -> float | None:
        """When (``time.monotonic()``) the batch must be written; None when empty."""
        return self._deadline

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, pending: PendingAck, counted: bool) -> bool:
        """Hand in one outcome; True when it starts a batch (the loop must learn when)."""
        with self._lock:
            self._entries.append((pending, counted))
            if self._deadline is not None:
                return False
            self._deadline = time.monotonic() + self.flush_after
            return True

    def take(self) -> list[Entry]:
        """Everything handed in so far, in order, leaving the buffer empty."""
        with self._lock:
            batch, self._entries = self._entries, []
            self._deadline = None
        return batch

    def put_back(self, batch: list[Entry]) -> None:
        """Return a batch that could not be written, ahead of newer ones, due at once."""
        with self._lock:
            self._entries[:0] = batch
            self._deadline = time.monotonic()
