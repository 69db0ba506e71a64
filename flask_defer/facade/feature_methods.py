"""``Defer``'s helper methods: soft delete and restore, batching, HTTP jobs.

Each forwards to its plugin in :mod:`flask_defer.features`, which receives the current
app's state and never sees ``Defer``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Unpack

from ..features import batching, http_jobs
from ..features import soft_delete as _soft_delete
from ..features.http_signing import Secret
from ..features.owner import resolve_owner
from ..jobs import Job
from ..operations.scheduling import ScheduleOptions
from ..timeutil import Duration
from .declarations import FacadeBase


class HelperMethods(FacadeBase):
    """The built-in helpers, on the facade: ``soft_delete``, ``restore``, ``batch``, HTTP."""

    def soft_delete(
        self,
        obj: Any,
        grace: Duration = _soft_delete.DEFAULT_GRACE,
        *,
        label: str | None = None,
        owner: str | None = None,
    ) -> Job:
        """Hide *obj* now and hard-delete it after *grace*, unless it is restored.

        *obj* is a model instance using :class:`~flask_defer.SoftDeleteMixin`. Sets
        ``deleted_at`` and schedules the purge in ``db.session``'s transaction (the
        caller commits) and returns the purge job, undoable by its *owner* until
        ``grace - DEFER_UNDO_MARGIN`` from now. :meth:`undo` of that job, or
        :meth:`restore`, brings the row back.
        """
        if owner is None:  # as Defer.current_owner(create=True)
            owner = resolve_owner(self._owner_loader, create=True)
        return _soft_delete.soft_delete(self._state(), obj, grace=grace, label=label, owner=owner)

    def restore(self, obj: Any) -> _soft_delete.RestoreOutcome:
        """Undo a :meth:`soft_delete` from code: cancel the purge and clear ``deleted_at``.

        Joins ``db.session`` (the caller commits). Returns ``RESTORED``, or ``PURGING``
        / ``PURGED`` when it is too late, or ``NOT_DELETED``.
        """
        return _soft_delete.restore(self._state(), obj)

    def batch(
        self,
        name: str,
        *,
        key: str,
        item: Any,
        window: Duration = batching.DEFAULT_WINDOW,
        max_items: int | None = None,
        mode: batching.BatchMode = "window",
        max_wait: Duration | None = None,
        now: datetime | None = None,
    ) -> batching.Batched:
        """Add *item* to the batch job *name* of *key* (see :mod:`flask_defer.features.batching`).

        The handler of *name* receives every item of the batch, in order, in
        ``job.payload["items"]``. Joins ``db.session``: the item is added when the
        caller commits.
        """
        return batching.batch(
            self._state(), name, key=key, item=item, window=window, max_items=max_items,
            mode=mode, max_wait=max_wait, now=now,
        )

    def schedule_http(
        self,
        url: str,
        method: str = "POST",
        *,
        json: Any = None,
        headers: Mapping[str, str | Secret] | None = None,
        sign: str | None = None,
        idempotency_key: str | None = None,
        timeout: Duration | None = None,
        **options: Unpack[ScheduleOptions],
    ) -> Job:
        """Schedule an HTTP request (see :mod:`flask_defer.features.http_jobs`); returns its job.

        The options are :meth:`schedule`'s (``run_at``, ``delay``, ``key``, the queue
        controls ...); the call joins ``db.session`` like ``schedule()``.

        2xx is done (status and a body excerpt in ``job.result``); 408, 429, 5xx and
        network errors are retried, honouring ``Retry-After``; other 4xx fail at once.
        Header values may be ``secret("name")`` (from ``DEFER_HTTP_SECRETS`` when the
        call runs); ``sign="name"`` signs it per Standard Webhooks with the keys of
        ``DEFER_WEBHOOK_SECRETS["name"]``; every attempt sends the same
        ``Idempotency-Key`` (*idempotency_key*, or one drawn now).
        """
        return http_jobs.schedule_http(
            self._state(), url, method=method, json_body=json, headers=headers, sign=sign,
            idempotency_key=idempotency_key, timeout=timeout, **options,
        )  # fmt: skip
