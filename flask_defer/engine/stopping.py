"""How a worker stops: SIGTERM/SIGINT, the shutdown grace, and handing jobs back.

The first signal asks the worker to stop claiming and gives running handlers
``shutdown_grace`` to finish; a second one exits at once (logs flushed first). Jobs
that did not finish, and claimed ones no thread started yet, are released to pending
so another worker takes them without waiting for their leases to lapse.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from types import FrameType

from sqlalchemy.exc import SQLAlchemyError

from ..jobs import Job
from ..store import JobStore
from .execution import JobLog
from .logs import brief
from .pool import HandlerPool

logger = logging.getLogger("flask_defer.worker")

#: Shortest wait for a handler's timeout while draining (no busy loop on a past one).
MIN_WAIT = 0.001


def install_signal_handlers(
    stop: Callable[[], None], stopping: Callable[[], bool], grace: float
) -> Callable[[], None] | None:
    """Make SIGTERM/SIGINT call *stop* (a second one exits); return how to undo that.

    Only the main thread may set signal handlers: elsewhere nothing is installed and
    None is returned.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if stopping():
            logger.warning("second %s: exiting at once", name)
            flush_logs()
            os._exit(128 + signum)
        logger.info("%s received: no new jobs; running ones get %g s to finish", name, grace)
        stop()

    for sig in previous:
        signal.signal(sig, on_signal)

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def wait_for_handlers(
    pool: HandlerPool, grace: float, record_timeouts: Callable[[], None]
) -> None:
    """Wait up to *grace* seconds for *pool*'s running handlers to return.

    Handlers that overrun their own timeout meanwhile are recorded as they expire
    (*record_timeouts*), so a short timeout is not stretched to the whole grace.
    """
    grace_ends = time.monotonic() + grace
    if pool.busy():
        logger.info("waiting up to %g s for %d running job(s)", grace, len(pool.in_flight()))
    while pool.busy():
        try:
            record_timeouts()
        except Exception:  # noqa: BLE001 - shutting down regardless
            logger.exception("recording timeouts during shutdown failed")
        now = time.monotonic()
        if now >= grace_ends:
            break
        wait = grace_ends - now
        deadline = pool.next_deadline()
        if deadline is not None:
            wait = min(wait, max(deadline - now, MIN_WAIT))
        pool.wait_idle(wait)


def release(store: JobStore, jobs: list[Job], why: str, now: datetime) -> None:
    """Hand *jobs* back to pending, their attempt given back, logging each.

    A database that is down is logged, not raised: the jobs then return to pending
    when their leases lapse.
    """
    if not jobs:
        return
    try:
        released = store.release(jobs, now=now)
    except SQLAlchemyError as error:
        logger.error(
            "could not release %d job(s) (%s); they return to pending when "
            "their leases lapse",
            len(jobs),
            brief(error),
        )
        return
    for job in jobs:
        JobLog(logger, {"job": job}).warning("%s; released to pending", why)
    logger.info("released %d job(s) back to pending", released)


def flush_logs() -> None:
    """Flush every log handler and stderr: ``os._exit`` skips Python's own flushing."""
    for handler in logging.getLogger().handlers + logging.getLogger("flask_defer").handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
    sys.stderr.flush()
