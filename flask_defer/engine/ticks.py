"""When the worker looks at the recurring schedules, and when their next tick is due.

The schedules table is read when a known tick is due, and otherwise every
``poll_interval`` (another process may have resumed or changed a schedule; a NOTIFY
asks for a look at once), so an idle worker costs the table one indexed read a poll.
The ticker itself (which writes exactly one job per tick) is handed in, as the app
context is: the engine imports no feature, and :class:`RecurringTicks` says what it
asks of one (the recurring schedules' ``Ticker`` is the one implementation).
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any, Protocol


class LateTicks(Protocol):
    """Schedules whose tick was not written on time: how many, and the oldest tick."""

    @property
    def count(self) -> int: ...

    @property
    def oldest_tick(self) -> datetime | None: ...


class RecurringTicks(Protocol):
    """What the worker, ``run_due`` and health ask of the app's recurring schedules."""

    def sync(self, now: datetime) -> Any:
        """Bring the schedules table in line with this code's declarations."""

    def materialise(self, now: datetime) -> Any:
        """Write exactly one job for every tick due at *now*."""

    def next_due(self) -> datetime | None:
        """When the earliest live schedule ticks next (the worker's wake-up)."""

    def late(self, now: datetime) -> LateTicks:
        """Live schedules whose tick is overdue (health counts them as backlog)."""

    def undeclared(self, now: datetime) -> tuple[str, ...]:
        """Ids of live schedules no running code has declared lately."""


class TickTimer:
    """Writes due ticks' jobs through a ticker, at most once per poll unless one is due."""

    def __init__(self, ticker: RecurringTicks | None, poll_interval: float) -> None:
        self.ticker = ticker
        self.poll_interval = poll_interval
        self.next_tick: datetime | None = None
        self._recheck = 0.0  # time.monotonic() of the next look without a known tick

    def sync(self, now: datetime) -> None:
        """Bring the schedules table in line with the declarations (a worker's start)."""
        if self.ticker is not None:
            self.ticker.sync(now)

    def look_again(self) -> None:
        """Read the schedules on the next round (one may have been resumed or added)."""
        self._recheck = 0.0

    def write_due(self, now: datetime) -> None:
        """Write the jobs of due ticks, and learn when the next tick is."""
        if self.ticker is None:
            return
        mono = time.monotonic()
        if mono < self._recheck and (self.next_tick is None or self.next_tick > now):
            return
        self.ticker.materialise(now)
        self.next_tick = self.ticker.next_due()
        self._recheck = mono + self.poll_interval

    def wait(self, now: datetime, clock_now: datetime) -> float | None:
        """Seconds until the next tick after *now* (None: none known, or it failed).

        A tick still due after :meth:`write_due` is a schedule that failed to write:
        no busy loop on it.
        """
        if self.next_tick is None or self.next_tick <= now:
            return None
        return (self.next_tick - clock_now).total_seconds()
