"""A worker thread inside the development server, so the demo needs one command.

With ``DEFER_EMBEDDED_WORKER = True`` the process that serves requests also runs a
worker thread. It must start exactly once, and in the right process: under the
Werkzeug reloader ``flask run`` is two processes, a watcher that never serves and a
child (``WERKZEUG_RUN_MAIN=true``) that does. Two triggers cover it:

* at ``init_app``, when this is the reloader's child, or the ``flask run`` command
  with the reloader off, so jobs already due run without waiting for a request;
* at the first request, for every other server (``app.run()``, waitress ...):
  the reloader's watcher never handles a request, so it never starts one.

Other commands (``flask shell``, ``flask defer worker`` ...) start nothing. This is
for development; in production run ``flask defer worker`` processes. The triggers need
Flask, so they are the extension's wiring (``extension.install_embedded_worker``);
this module owns the thread.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable
from datetime import timedelta

from .worker import Worker

logger = logging.getLogger("flask_defer.worker")

#: Seconds between two looks at the schema while the embedded worker waits for it.
SCHEMA_RECHECK = 1.0
#: An embedded worker waits at most this long for handlers when the server exits,
#: so Ctrl-C in development is not held up by the production grace period.
EMBEDDED_SHUTDOWN_GRACE = timedelta(seconds=5)


class EmbeddedWorker:
    """Owns the one worker thread of a web process; starting it twice does nothing."""

    def __init__(
        self,
        make_worker: Callable[[], Worker],
        check: Callable[[], None] | None = None,
        *,
        recheck: float = SCHEMA_RECHECK,
    ) -> None:
        """*check* raises while the worker must not run yet (the schema does not match
        the code); the thread then says why once and looks again every *recheck* s."""
        self._make_worker = make_worker
        self._check = check
        self._recheck = recheck
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.worker: Worker | None = None
        self.thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return self.thread is not None

    def start(self) -> bool:
        """Start the worker thread unless it runs already; True if this call started it."""
        if self.thread is not None:  # the cheap check every request makes
            return False
        with self._lock:
            if self.thread is not None:
                return False
            self.worker = self._make_worker()
            self.thread = threading.Thread(
                target=self._run, name="flask-defer-embedded-worker", daemon=True
            )
            self.thread.start()
        atexit.register(self.stop)
        logger.info("embedded worker started in process %d", os.getpid())
        return True

    def stop(self, timeout: float | None = None) -> None:
        """Stop the worker gracefully and wait for its thread (at most *timeout* s)."""
        atexit.unregister(self.stop)
        self._stopping.set()
        worker, thread = self.worker, self.thread
        if worker is None or thread is None:
            return
        worker.stop()
        if timeout is None:
            timeout = worker.options.shutdown_grace.total_seconds() + 5.0
        thread.join(timeout)

    def _run(self) -> None:
        assert self.worker is not None
        if not self._wait_for_schema():
            return
        try:
            self.worker.run(install_signal_handlers=False)
        except Exception:  # noqa: BLE001 - a dying thread must say why
            logger.exception("the embedded worker stopped with an error")


    def _wait_for_schema(self) -> bool:
        """Until *check* passes (True) or a stop is asked for (False).

        ``flask defer worker`` refuses to start on a schema behind or ahead of the
        code; the embedded one cannot refuse the web, so it waits, says why once, and
        starts by itself once ``flask defer db upgrade`` (or ``db.create_all()`` in a
        factory that runs after ``init_app``) has made the schema current.
        """
        if self._check is None:
            return True
        said = False
        while not self._stopping.is_set():
            try:
                self._check()
            except Exception as error:  # noqa: BLE001 - said, then looked at again
                if not said:
                    logger.error("the embedded worker waits to start: %s", error)
                    said = True
                self._stopping.wait(self._recheck)
                continue
            if said:
                logger.info("the schema is current now; the embedded worker starts")
            return True
        return False
