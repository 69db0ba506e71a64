"""The worker's handler threads: a fixed-size pool that a stuck handler cannot shrink.

The worker claims only as many jobs as the pool has idle threads, so a claimed job
waits for nothing but a thread's wake-up: its attempt is counted by the claim itself,
and a worker killed at any moment has spent exactly the attempts of the jobs it
handed to a thread. The hand-off is a plain queue.

Python cannot kill a thread, so a handler past its timeout keeps its thread. The pool
*abandons* it instead: the job stops counting as in flight (no more heartbeats; the
worker records the timeout as a failed attempt), the thread is told to exit once the
handler returns, and a fresh thread takes its place. So ``size`` handlers can always
run, and a worker with a hung handler is degraded by one thread, not blocked.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..jobs import Job
from .execution import JobLog, Outcome, PendingAck

logger = logging.getLogger("flask_defer.worker")

_thread_numbers = itertools.count(1)


@dataclass(eq=False)
class Task:
    """One claimed job handed to the pool."""

    job: Job
    timeout: float | None
    started_at: float = 0.0  # time.monotonic() when a thread began the handler
    # queued → running → finished | abandoned | overrun; or queued → withdrawn
    state: str = "queued"
    thread: _PoolThread | None = field(default=None, repr=False)

    @property
    def deadline(self) -> float | None:
        if self.timeout is None or self.state != "running":
            return None
        return self.started_at + self.timeout


class _PoolThread(threading.Thread):
    def __init__(self, pool: HandlerPool) -> None:
        super().__init__(name=f"flask-defer-handler-{next(_thread_numbers)}", daemon=True)
        self.pool = pool
        self.abandoned = False

    def run(self) -> None:
        get = self.pool._queue.get
        run = self.pool._run
        while not self.abandoned:
            task = get()
            if task is None:
                return
            run(task, self)


#: What the timeout warning adds for a keyed job (see :meth:`HandlerPool.expire`).
HELD = " (its concurrency key stays held until the thread ends)"


class HandlerPool:
    """Runs claimed jobs on ``size`` threads, with per-job timeouts.

    *run* executes one job (``Executor.execute``) and returns its outcome, or the
    acknowledgement still to be written in a batch; *on_done* is called after every
    job with that and whether the job was still the pool's (False once abandoned at
    its timeout, whose failed attempt the worker already counted), so the worker can
    batch the acknowledgement; *on_free* after the job has left the pool, so the
    worker can claim another for the thread.
    """

    def __init__(
        self,
        size: int,
        run: Callable[[Job], Outcome | PendingAck],
        on_done: Callable[[Outcome | PendingAck, bool], None],
        on_free: Callable[[], None] = lambda: None,
        on_overrun_end: Callable[[Task], None] = lambda task: None,
    ) -> None:
        if size < 1:
            raise ValueError("a handler pool needs at least one thread")
        self.size = size
        self._execute = run
        self._on_done = on_done
        self._on_free = on_free
        self._on_overrun_end = on_overrun_end
        #: Keyed jobs past their timeout whose threads still run (see :meth:`expire`).
        self._overrun: set[Task] = set()
        self._queue: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._tasks: set[Task] = set()
        self._threads: list[_PoolThread] = []
        self.abandoned_threads = 0
        #: A moving average of the handlers' run time in seconds (the worker's claim
        #: waits a moment for more free threads when jobs are this short).
        self.run_time = 0.0

    def start(self) -> None:
        """Start the threads (once; :meth:`close` asks them to exit)."""
        while len(self._threads) < self.size:
            self._spawn()

    # -- what the worker asks -------------------------------------------------------

    def free(self) -> int:
        """How many more claimed jobs the pool takes now: its threads without a job."""
        return self.size - len(self._tasks)

    def busy(self) -> bool:
        """True while any job is queued or running (abandoned ones do not count)."""
        return bool(self._tasks)

    def in_flight(self) -> list[Job]:
        """Claimed jobs whose outcome is not recorded yet: what the heartbeat renews
        (keyed jobs past their timeout included: their threads still run)."""
        with self._lock:
            return [task.job for task in self._tasks | self._overrun]

    def submit(self, job: Job, timeout: float | None) -> None:
        """Hand *job* to a thread; the caller claimed at most :meth:`free` jobs."""
        task = Task(job, timeout)
        with self._lock:
            self._tasks.add(task)
        self._queue.put(task)

    def next_deadline(self) -> float | None:
        """The earliest monotonic time at which a running handler times out."""
        with self._lock:
            deadlines = [d for task in self._tasks if (d := task.deadline) is not None]
        return min(deadlines, default=None)

    def expire(self, now: float | None = None) -> list[Task]:
        """Abandon every running handler past its deadline and return their tasks.

        The caller records each as a failed attempt. Each abandoned thread is replaced
        so the pool keeps ``size`` working threads.

        A job with a ``concurrency_key`` is not returned: its abandoned thread still
        runs the handler, so the job stays ``running`` (its lease renewed, its key's
        slot held) until that thread ends, and *on_overrun_end* then records the
        timeout. Otherwise another job of the key would start beside a handler that
        has not stopped, over the key's limit.
        """
        at = time.monotonic() if now is None else now
        expired: list[Task] = []
        overrun: list[Task] = []
        with self._lock:
            for task in list(self._tasks):
                deadline = task.deadline
                if deadline is not None and deadline <= at:
                    keyed = task.job.concurrency_key is not None
                    task.state = "overrun" if keyed else "abandoned"
                    self._tasks.discard(task)
                    assert task.thread is not None
                    task.thread.abandoned = True
                    self.abandoned_threads += 1
                    if keyed:
                        self._overrun.add(task)
                        overrun.append(task)
                    else:
                        expired.append(task)
            if not self._tasks:
                self._idle.notify_all()
        for task in expired + overrun:
            self._threads = [t for t in self._threads if t is not task.thread]
            self._spawn()
            JobLog(logger, {"job": task.job}).warning(
                "handler exceeded its timeout of %g s; its thread is abandoned%s",
                task.timeout or 0.0,
                HELD if task in overrun else "",
            )
        return expired

    def withdraw_queued(self) -> list[Task]:
        """Take back the handed-over jobs no thread has started yet (a stopping worker's).

        A withdrawn task is never run: a thread that dequeues it later skips it.
        """
        with self._lock:
            queued = [task for task in self._tasks if task.state == "queued"]
            for task in queued:
                task.state = "withdrawn"
                self._tasks.discard(task)
            if not self._tasks:
                self._idle.notify_all()
        return queued

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to *timeout* seconds for every job to finish; True if they did."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._tasks, timeout=max(timeout, 0.0))

    def close(self) -> None:
        """Ask the idle threads to exit (running handlers finish on their own)."""
        for _ in self._threads:
            self._queue.put(None)

    # -- internals ----------------------------------------------------------------

    def _spawn(self) -> None:
        thread = _PoolThread(self)
        self._threads.append(thread)
        thread.start()

    def _run(self, task: Task, thread: _PoolThread) -> None:
        with self._lock:
            if task.state != "queued":
                return
            task.state = "running"
            task.started_at = time.monotonic()
            task.thread = thread
        outcome: Outcome | PendingAck = Outcome.LOST
        try:
            outcome = self._execute(task.job)
        except BaseException:  # noqa: BLE001 - the worker must outlive any one job
            # Typically the database went away while acknowledging. The row stays
            # running; its lease lapses and another round runs the job again.
            JobLog(logger, {"job": task.job}).exception(
                "could not record the outcome; the job returns to pending when its "
                "lease lapses"
            )
        finally:
            self._forget(task, outcome)

    def _forget(self, task: Task, outcome: Outcome | PendingAck) -> None:
        """The task's thread is done with it: tell the worker, then drop it.

        Handed over before the task leaves the pool, so a worker that waited for the
        pool to go idle finds every acknowledgement in its batch. An abandoned job's
        late acknowledgement is handed over too: written, it is refused by the
        compare-and-set unless recording the timeout failed.
        """
        with self._lock:
            was_ours = task.state == "running"
            if was_ours:
                task.state = "finished"  # no longer expires nor withdraws
                self.run_time += (time.monotonic() - task.started_at - self.run_time) / 8
            overran = task in self._overrun
            self._overrun.discard(task)
        if overran:
            # Its timeout is recorded now that its thread ended (its own late outcome is
            # not: the attempt had timed out).
            self._on_overrun_end(task)
            return
        try:
            if was_ours or isinstance(outcome, PendingAck):
                self._on_done(outcome, was_ours)
        finally:
            with self._lock:
                self._tasks.discard(task)
                if not self._tasks:
                    self._idle.notify_all()
            self._on_free()


def warn_if_connections_short(engine: Any, threads: int) -> None:
    """Tell the operator when *engine*'s pool cannot serve every handler thread at once.

    The worker's own loop, heartbeat and flusher need a connection each; a handler
    thread needs one only while its handler uses the database. Short of the worker's
    own is a warning (it stalls); short of one per thread is a note: handlers that all
    use the database at once then wait their turn for a connection, holding their
    jobs' leases. The setting to change (``SQLALCHEMY_ENGINE_OPTIONS``) is named.
    """
    pool: Any = engine.pool
    size = getattr(pool, "size", None)
    overflow = getattr(pool, "_max_overflow", 0)
    if not callable(size) or overflow < 0:
        return  # not a QueuePool, or unbounded overflow
    allowed = size() + overflow
    if allowed >= threads + OWN_CONNECTIONS:
        return
    level = logging.WARNING if allowed < OWN_CONNECTIONS + 1 else logging.INFO
    logger.log(
        level,
        "the engine's pool allows %d connections and this worker has %d handler threads "
        "(plus %d connections of its own): handlers using the database at once may wait "
        "for one; raise pool_size/max_overflow (SQLALCHEMY_ENGINE_OPTIONS) to avoid it",
        allowed,
        threads,
        OWN_CONNECTIONS,
    )


#: Connections the worker itself holds: its loop's claims, the heartbeat, the flusher.
OWN_CONNECTIONS = 3
