"""Empty PostgreSQL databases for the test suite, reused from test to test.

Every PostgreSQL test gets a database of its own with nothing in it. Creating and
dropping one per test (``CREATE DATABASE`` copies a template, ``DROP DATABASE`` deletes
its files) costs about 0.2 s on a loaded 2-core machine, times the suite's ~740
PostgreSQL tests; emptying a used one costs a fifth of that.
"""

from __future__ import annotations

import itertools
import os

from sqlalchemy import Connection, create_engine, text
from sqlalchemy.pool import NullPool

__all__ = ["EmptyDatabases", "kill_server_side"]

_numbers = itertools.count()

#: Drops every schema of the connected database (its tables, indexes, sequences, types
#: and functions go with it), then creates an empty ``public``. No ``%`` anywhere: the
#: driver would read it as a placeholder.
_EMPTY_DATABASE = """
DO $$
DECLARE name text;
BEGIN
    FOR name IN
        SELECT nspname FROM pg_namespace
        WHERE left(nspname, 3) <> 'pg_' AND nspname <> 'information_schema'
    LOOP
        EXECUTE 'DROP SCHEMA ' || quote_ident(name) || ' CASCADE';
    END LOOP;
END $$;
CREATE SCHEMA public;
"""


class EmptyDatabases:
    """Empty databases on one server: ``take()`` one for a test, ``give_back()`` after.

    A database given back leaves the next test nothing to see of the last one: every
    other session on it is ended first (as ``DROP DATABASE ... WITH (FORCE)`` would end
    them, so no LISTEN, lock or open transaction survives), then every schema is dropped
    and ``public`` created anew. A database that cannot be emptied is dropped and never
    handed out again.
    """

    def __init__(self, server_url: str) -> None:
        self._base_url = server_url.rsplit("/", 1)[0]
        self._admin = create_engine(server_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        self._free: list[str] = []
        self._made: list[str] = []

    def take(self) -> str:
        """The URL of an empty database, a new one when none is free."""
        if self._free:
            return self._url(self._free.pop())
        name = f"defer_test_{os.getpid()}_{next(_numbers)}"
        with self._admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        self._made.append(name)
        return self._url(name)

    def give_back(self, url: str) -> None:
        """Empty the database of *url* for the next test (drop it if that fails)."""
        name = url.rsplit("/", 1)[1]
        try:
            self._end_sessions(name)
            emptier = create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
            try:
                with emptier.connect() as conn:
                    conn.execute(text(_EMPTY_DATABASE))
            finally:
                emptier.dispose()
        except Exception:
            self._drop(name)
            raise
        self._free.append(name)

    def close(self) -> None:
        """Drop every database made, then close the admin engine."""
        try:
            for name in list(self._made):
                self._drop(name)
        finally:
            self._admin.dispose()

    def _url(self, name: str) -> str:
        return f"{self._base_url}/{name}"

    def _end_sessions(self, name: str) -> None:
        with self._admin.connect() as conn:
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": name},
            )

    def _drop(self, name: str) -> None:
        with self._admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        if name in self._made:
            self._made.remove(name)


def kill_server_side(conn: Connection) -> None:
    """End *conn*'s PostgreSQL backend from another connection, as a server restart or
    an idle timeout would, and wait until it is gone; *conn* learns it at its next use."""
    pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
    killer = create_engine(conn.engine.url, poolclass=NullPool)
    try:
        with killer.connect() as other:
            other.exec_driver_sql("SELECT pg_terminate_backend(%s, 5000)", (pid,))
    finally:
        killer.dispose()
