"""The worker's event loop: where coroutine (``async def``) handlers run.

A handler that awaits an HTTP call or an email API should not hold a thread for the
seconds it waits. The worker hands such jobs to one asyncio loop on a thread of its own;
each job is a task there, so hundreds can wait at once while the handler threads run the
plain ``def`` handlers. Up to *limit* tasks run at once: the worker claims no more jobs
than the loop has room for.

No Flask here: the executor's coroutine pushes the app context inside the task (Flask's
contexts are context variables, so every task has its own).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from ..jobs import Job
from .execution import JobLog, Outcome, PendingAck

logger = logging.getLogger("flask_defer.worker")

Result = Outcome | PendingAck


class CoroutineRunner:
    """Runs coroutine handlers' jobs as tasks of one event loop, started on first use.

    *on_done* is called (on the loop's thread) with each job's outcome or pending
    acknowledgement, as :class:`~flask_defer.engine.pool.HandlerPool` calls it for threads;
    *on_free* after the job has left the runner.
    """

    def __init__(
        self,
        limit: int,
        on_done: Callable[[Result, bool], None],
        on_free: Callable[[], None] = lambda: None,
    ) -> None:
        if limit < 1:
            raise ValueError("the event loop needs room for at least one job")
        self.limit = limit
        self._on_done = on_done
        self._on_free = on_free
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._running: dict[int, tuple[Job, concurrent.futures.Future[Result]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- what the worker asks ---------------------------------------------------------

    def room(self) -> int:
        """How many more jobs may start here: the worker claims no more than that."""
        return max(self.limit - len(self._running), 0)

    def busy(self) -> bool:
        return bool(self._running)

    def in_flight(self) -> list[Job]:
        """Jobs whose outcome is not handed in yet: what the heartbeat renews."""
        with self._lock:
            return [job for job, _ in self._running.values()]

    def submit(self, job: Job, run: Callable[[], Coroutine[Any, Any, Result]]) -> None:
        """Start *run()* (the job's execution) as a task on the loop."""
        loop = self._started()
        with self._lock:
            future = asyncio.run_coroutine_threadsafe(run(), loop)
            self._running[job.id] = (job, future)
        future.add_done_callback(lambda f: self._finished(job, f))

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to *timeout* seconds for every task to end; True if they did."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._running, timeout=max(timeout, 0.0))

    def cancel(self) -> list[Job]:
        """Cancel the tasks still running (a stop past its grace); return their jobs.

        Their outcomes are not handed in: the worker releases them to pending.
        """
        with self._lock:
            cancelled = list(self._running.values())
            self._running.clear()
            self._idle.notify_all()
        for _, future in cancelled:
            future.cancel()
        return [job for job, _ in cancelled]

    def close(self) -> None:
        """Stop the loop and end its thread (after :meth:`cancel` or once idle)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        if not thread.is_alive():
            loop.close()
        self._loop = self._thread = None

    # -- internals ------------------------------------------------------------------

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(
                    target=serve, name="flask-defer-event-loop", daemon=True
                )
                self._thread.start()
                ready.wait(10)
                self._loop = loop
            return self._loop

    def _finished(self, job: Job, future: concurrent.futures.Future[Result]) -> None:
        if future.cancelled():
            return  # handed back by the worker (cancel() forgot it already)
        error = future.exception()
        try:
            if error is not None:
                # The outcome could not be mapped (the database went away in between):
                # the row stays running and the job runs again once its lease lapses.
                JobLog(logger, {"job": job}).error(
                    "could not record the outcome (%s); the job returns to pending when "
                    "its lease lapses",
                    error,
                )
            else:
                # Handed in before the job leaves the runner, so a worker that waited
                # for it to go idle finds the acknowledgement in its flusher.
                self._on_done(future.result(), job.id in self._running)
        finally:
            with self._lock:
                self._running.pop(job.id, None)
                if not self._running:
                    self._idle.notify_all()
            self._on_free()
