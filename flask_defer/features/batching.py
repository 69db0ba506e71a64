"""Notification batching: many items for one key become one job that receives them all.

``defer.batch("notify_comments", key=f"post:{post.id}", item={...})`` appends the item
to the pending batch job of that key, or opens a new batch. The handler is an ordinary
``@defer.job("notify_comments")`` handler and finds the items, in the order they were
added, in ``job.payload["items"]`` (and the batch key in ``job.payload["key"]``).

**Why no item is lost or delivered twice.** An append is one guarded ``UPDATE`` that
only touches a *pending* row; the worker's claim is one guarded ``UPDATE`` that moves
the row to running. Whichever commits first wins: the item is in the batch the worker
claims, or the append touches nothing and the item goes to another batch.

**Why slots.** The live-key index allows one pending *or running* job per key, so while
a batch runs its key is taken. A batch therefore lives in one of several *slots* of the
key: slot 1 is the key itself, slot *n* is ``f"{key}#{n}"``. Items go to the first slot
holding a pending batch that accepts them; a new batch opens in the first free slot.
A batch that reaches ``max_items`` gives its slot up at once (its key becomes
``f"{key}#full-{id}"``), so full batches waiting for a worker hold no slot. With one
batch running and one filling, slots 1 and 2 are all a key ever uses, and an item
costs one ``UPDATE`` (two while a batch runs). A batch that is due takes no more
items: the next item moves it out of its slot (``f"{key}#due-{id}"``) and opens a new
batch there. So a busy key's items never keep a due batch locked away from the
worker's claim (PostgreSQL's SKIP LOCKED passes over a row an open transaction has
updated; on SQLite they would be more writers queued for the lock ahead of the claim,
see ``store/sqlite/write_lock``), and ``max_wait`` holds however many producers there
are. Keys ending in ``#<number>``, ``#full-<number>`` or ``#due-<number>`` are
therefore reserved for batching. In a rare race (a running
batch finishing between another item's two steps) two pending batches of a key can
coexist for a while: each item is still in exactly one of them, and both are delivered.

**Why no deadlock with the worker (PostgreSQL).** Only the first statement, the append
to slot 1, may wait for a row; after it the key's producers take turns under an
advisory lock and pass over rows another transaction holds (``store/batches``), so a
producer never waits for a batch row while holding one the worker's claim waits for.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import Connection

from ..errors import DeferError, InvalidArgument, JobExists
from ..operations import scheduling
from ..operations.state import DeferState
from ..store import BatchAppend, NewJob
from ..timeutil import Duration, as_duration, as_utc, utcnow
from ..validation import payload_text, storable_text

#: Default batching window of ``defer.batch``.
DEFAULT_WINDOW = timedelta(minutes=1)

#: Slots tried before giving up: that many batches of one key running at once.
MAX_SLOTS = 32

#: Longest batch key: the job key adds a slot or "#full-<id>" suffix.
MAX_KEY_CHARS = 230

#: The suffixes batching writes after a key (slots, full and due batches): a caller's
#: key may not end like one of them.
RESERVED_SUFFIX = re.compile(r"#(?:full-|due-)?[0-9]+\Z")

BatchMode = Literal["window", "debounce"]


@dataclass(frozen=True, slots=True)
class Batched:
    """Where ``defer.batch`` put an item.

    ``job_id`` is the batch job; ``position`` the item's index in
    ``job.payload["items"]``; ``run_at`` when the batch is due now; ``opened`` is True
    when this item started the batch.
    """

    job_id: int
    position: int
    run_at: datetime
    opened: bool


def slot_key(key: str, slot: int) -> str:
    """The job key of a batch in *slot* (1-based) of *key*."""
    return key if slot == 1 else f"{key}#{slot}"


def batch(
    state: DeferState,
    name: str,
    *,
    key: str,
    item: Any,
    window: Duration = DEFAULT_WINDOW,
    max_items: int | None = None,
    mode: BatchMode = "window",
    max_wait: Duration | None = None,
    now: datetime | None = None,
) -> Batched:
    """Add *item* to the batch job *name* of *key*; joins ``db.session`` (caller commits).

    ``mode="window"``: the first item makes the batch due ``window`` later and later
    items ride along. ``mode="debounce"``: every item moves the batch to ``now +
    window``, but never later than ``max_wait`` after its first item, so a steady
    stream still flushes. ``max_items`` makes a full batch due at once; the next item
    opens a new one. ``now`` is when the item arrived (default: the current time).
    """
    # Long on purpose: the checks, then one transaction that joins or opens a slot, read
    # top to bottom as the single decision it is (split, the slot logic would be scattered).
    spec = scheduling.spec_for(state, name)
    if not isinstance(key, str) or not key:
        raise InvalidArgument("key", f"expected a non-empty string, got {key!r}")
    if len(key) > MAX_KEY_CHARS:
        # Room for a suffix ("#2", "#full-<id>") within the 255 characters of the column.
        raise InvalidArgument("key", f"at most {MAX_KEY_CHARS} characters, got {len(key)}")
    storable_text(key, "key")
    if RESERVED_SUFFIX.search(key):
        # "a#2" would land in key "a"'s second slot, inside a's batch.
        raise InvalidArgument(
            "key", f"{key!r} ends like a batch slot (#<n>, #full-<n>, #due-<n>), reserved"
        )
    item_json = payload_text(item, "item", max_bytes=state.config.max_payload_bytes)
    window = as_duration(window, "window")
    if max_items is not None and (
        isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 1
    ):
        raise InvalidArgument("max_items", f"expected an integer ≥ 1 or None, got {max_items!r}")
    if mode not in ("window", "debounce"):
        raise InvalidArgument("mode", f"expected 'window' or 'debounce', got {mode!r}")
    flush_by: datetime | None = None
    arrived = as_utc(now, "now") if now is not None else utcnow()
    if max_wait is not None:
        if mode != "debounce":
            raise InvalidArgument("max_wait", "only applies to mode='debounce'")
        wait = as_duration(max_wait, "max_wait")
        if wait < window:
            raise InvalidArgument("max_wait", f"must be at least the window ({window})")
        flush_by = arrived + wait
    debounce_until = arrived + window if mode == "debounce" else None

    store = state.store

    def append(conn: Connection, slot: int, *, wait: bool = False) -> BatchAppend | None:
        return store.batch_append(
            conn,
            name=name,
            key=slot_key(key, slot),
            item_json=item_json,
            now=arrived,
            max_items=max_items,
            debounce_until=debounce_until,
            wait=wait,
        )

    with state.transactions.joined(writes=True) as conn:
        # The open batch is nearly always in slot 1, or in slot 2 while slot 1 runs. The
        # first statement may wait for slot 1's row (other producers appending), as it
        # holds no batch row yet; after it, on PostgreSQL, producers of this key take
        # turns and no statement waits for a batch row while this one holds another
        # (the deadlock with the worker's claim, see store/batches).
        appended = append(conn, 1, wait=True)
        if appended is not None:
            return _batched(appended)
        store.batch_lock(conn, name=name, key=key)
        for slot in (1, 2):
            appended = append(conn, slot)
            if appended is not None:
                return _batched(appended)
        payload: dict[str, Any] = {"key": key, "items": [json.loads(item_json)]}
        if flush_by is not None:
            # ISO 8601 UTC with microseconds: fixed width, so the store can compare it.
            payload["flush_by"] = flush_by.isoformat(timespec="microseconds")

        def open_batch(job_key: str | None, run_at: datetime) -> Batched | None:
            new = NewJob(
                name=name,
                payload=payload,
                run_at=run_at,
                max_attempts=scheduling.max_attempts(state, spec),
                queue=spec.queue,
                key=job_key,
                **spec.rate_fields(),
            )
            try:
                job = scheduling.insert(state, new, now=arrived, conn=conn)
            except JobExists:
                return None
            return Batched(job_id=job.id, position=0, run_at=job.run_at, opened=True)

        if max_items == 1:
            # Full with its first item: a job of its own, due now, holding no slot.
            opened = open_batch(None, arrived)
            assert opened is not None
            return opened
        for slot in range(1, MAX_SLOTS + 1):
            opened = open_batch(slot_key(key, slot), arrived + window)
            if opened is not None:
                return opened
            # Taken: by a batch opened a moment ago (join it), by one that is due and
            # waits for a worker (move it out of the slot and take the slot), or by
            # one that is running (move on to the next slot).
            appended = append(conn, slot)
            if appended is not None:
                return _batched(appended)
            if store.batch_retire_due(conn, name=name, key=slot_key(key, slot), now=arrived):
                opened = open_batch(slot_key(key, slot), arrived + window)
                if opened is not None:
                    return opened
    raise DeferError(
        f"{MAX_SLOTS} batches of key {key!r} are running at once; "
        "the item was not added (add workers or use max_items)"
    )


def _batched(appended: BatchAppend) -> Batched:
    return Batched(
        job_id=appended.job_id,
        position=appended.items - 1,
        run_at=appended.run_at,
        opened=False,
    )
