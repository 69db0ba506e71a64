"""blinker signals for a job's life, so apps can log, count or react without patching.

Each is sent with the Flask app as sender and the :class:`~flask_defer.Job` as ``job``;
``job_failed`` also carries ``error`` (the traceback text) and ``will_retry``.

``queue_paused`` and ``queue_resumed`` are sent once a pause or resume of a queue or a
job name has committed, and only by the call that changed it, with ``kind`` (``queue``
or ``name``), ``value`` (the queue or job name) and ``actor`` (who did it).
"""

from __future__ import annotations

from blinker import Namespace

_signals = Namespace()

job_scheduled = _signals.signal("job-scheduled")
job_started = _signals.signal("job-started")
job_succeeded = _signals.signal("job-succeeded")
job_failed = _signals.signal("job-failed")
job_cancelled = _signals.signal("job-cancelled")
#: A pending job settled as ``expired``: not started by its ``expires_at`` (sent by the
#: worker's sweep, or by ``run_due``, once the change committed).
job_expired = _signals.signal("job-expired")
queue_paused = _signals.signal("queue-paused")
queue_resumed = _signals.signal("queue-resumed")
