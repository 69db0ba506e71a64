"""The garbage collector in a worker process: its full collections stop every thread.

Python's full collection walks every tracked object while all threads wait, and a
process that has imported an app, its handlers and their libraries holds tens of
thousands of objects that live as long as it does. :func:`startup_objects_spared_from_gc`
moves them out of the collector's way for as long as a worker runs.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def startup_objects_spared_from_gc() -> Iterator[None]:
    """While the block runs, the objects the process holds once started are left out of
    every full garbage collection (:func:`gc.freeze`), after one collection of what
    start-up left behind; they are handed back to the collector after it.

    A worker process holds the app, its handlers and the libraries they import (about
    90,000 objects for a small app) for as long as it lives, and Python's full
    collection walks them all while every thread waits. In a PostgreSQL worker under
    the lateness benchmark those collections took 38-57 ms each, a few times a run, and
    they were its late starts beyond 20 ms: p99 15-49 ms and max 53-78 ms, against
    8-13 ms and 9-18 ms with the freeze, whose later full collections took about 1 ms
    (3 interleaved runs each). ``flask defer worker`` owns its process, so it
    decides so; ``Worker.run`` called from an application's own code (and the embedded
    worker) leaves the collector alone. Nothing is done in a process that already froze
    objects of its own (a pre-forking server's choice).
    """
    if gc.get_freeze_count():
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        # Back in reach when the command runs in a longer-lived process (a test's
        # CLI runner): nothing frozen here outlives the worker unreachable.
        gc.unfreeze()
