"""When SQLite waits for the disk: the store's commits that do not, and one that waits
outside the write lock.

SQLite in WAL mode at ``synchronous`` FULL (flask_defer's default) fsyncs the log at
every commit, while it holds the database's one write lock. Two of the worker's writes
need less: a claim only has to outlive the worker (:func:`without_flush_wait`), and a
batch of outcomes has to be on disk before the worker counts it, but not before the
next writer may start (the driver's ``durable_write``: commit at NORMAL, then
:func:`sync_file` on the log named by :func:`wal_file`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

from sqlalchemy import Connection

#: Where a pooled connection remembers its write-ahead log's path (see wal_file).
_WAL_FILE = "flask_defer.wal_file"


@contextmanager
def without_flush_wait(conn: Connection) -> Iterator[bool]:
    """The next transaction on *conn* commits without an fsync (WAL, NORMAL); yields
    whether the level was lowered for it.

    A claim only has to outlive the worker, which it does once the database has it (see
    the claim's docstring in :mod:`..claims`). The level can only change outside a
    transaction, so it is set before and put back after; a level already NORMAL or below
    is left alone.
    """
    dbapi = conn.connection.dbapi_connection
    assert dbapi is not None
    (level,) = dbapi.execute("PRAGMA synchronous").fetchone()
    if int(level) <= 1:
        yield False
        return
    dbapi.execute("PRAGMA synchronous = NORMAL")
    try:
        yield True
    finally:
        dbapi.execute(f"PRAGMA synchronous = {int(level)}")


def wal_file(conn: Connection) -> str | None:
    """The path of *conn*'s write-ahead log, or None when its database keeps none (another
    journal mode, or in memory). Read once per connection."""
    info = conn.connection.info
    if _WAL_FILE not in info:
        dbapi = conn.connection.dbapi_connection
        assert dbapi is not None
        (mode,) = dbapi.execute("PRAGMA journal_mode").fetchone()
        files = {row[1]: row[2] for row in dbapi.execute("PRAGMA database_list")}
        main = files.get("main") or ""
        info[_WAL_FILE] = f"{main}-wal" if str(mode).lower() == "wal" and main else None
    return cast("str | None", info[_WAL_FILE])


def sync_file(path: str) -> None:
    """Wait until *path*'s written data is on disk, as SQLite's own commit would
    (``fdatasync`` where there is one). The path is opened anew each time: a log that
    SQLite deleted and created again is another file. A log that is gone was
    checkpointed first, and a checkpoint syncs the database. Opened for writing (nothing
    is written): Windows flushes only a handle that may write."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return
    try:
        getattr(os, "fdatasync", os.fsync)(fd)
    finally:
        os.close(fd)
