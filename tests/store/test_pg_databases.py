"""The suite's reused PostgreSQL databases: each test still starts on an empty one."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from ..pg_databases import EmptyDatabases

#: What a test can leave behind, in public and in a schema of its own.
LEFTOVERS = """
CREATE TABLE public.jobs (id serial PRIMARY KEY, name text UNIQUE);
CREATE TYPE public.mood AS ENUM ('ok', 'not ok');
CREATE SEQUENCE public.numbers;
CREATE SCHEMA elsewhere;
CREATE TABLE elsewhere.notes (id int);
CREATE FUNCTION elsewhere.one() RETURNS int LANGUAGE sql AS 'SELECT 1';
"""

#: Everything user-made, in any schema but PostgreSQL's own.
USER_OBJECTS = """
SELECT n.nspname || '.' || c.relname FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE left(n.nspname, 3) <> 'pg_' AND n.nspname <> 'information_schema'
UNION ALL
SELECT n.nspname || '.' || t.typname FROM pg_type t
JOIN pg_namespace n ON n.oid = t.typnamespace
WHERE left(n.nspname, 3) <> 'pg_' AND n.nspname <> 'information_schema'
UNION ALL
SELECT n.nspname || '.' || p.proname FROM pg_proc p
JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE left(n.nspname, 3) <> 'pg_' AND n.nspname <> 'information_schema'
"""


def libpq(url: str) -> str:
    parsed = make_url(url)
    return f"host={parsed.host} port={parsed.port} user={parsed.username} dbname={parsed.database}"


@pytest.fixture
def databases(postgres_server_url: str) -> Iterator[EmptyDatabases]:
    made = EmptyDatabases(postgres_server_url)
    yield made
    made.close()


def test_a_database_given_back_comes_out_again_empty_with_its_sessions_ended(
    databases: EmptyDatabases,
) -> None:
    url = databases.take()
    engine = create_engine(url, poolclass=NullPool)
    with engine.begin() as conn:
        for statement in LEFTOVERS.strip().split(";\n"):
            conn.execute(text(statement))
    # A session left listening inside an open transaction that holds a lock.
    lingering = psycopg.connect(libpq(url))
    lingering.execute("LISTEN defer_jobs")
    lingering.execute("LOCK TABLE public.jobs IN ACCESS EXCLUSIVE MODE")

    databases.give_back(url)
    assert databases.take() == url  # reused, not created anew

    with pytest.raises(psycopg.OperationalError):
        lingering.execute("SELECT 1")
    lingering.close()
    with engine.connect() as conn:
        assert conn.execute(text(USER_OBJECTS)).all() == []
        assert conn.execute(text("SELECT current_schema()")).scalar() == "public"
        others = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        assert conn.execute(text(others)).scalar() == 1
        conn.execute(text("CREATE TABLE jobs (id int)"))  # the name is free again
        conn.rollback()
    engine.dispose()


def test_close_drops_every_database_it_made(
    databases: EmptyDatabases, postgres_server_url: str
) -> None:
    names = {make_url(databases.take()).database, make_url(databases.take()).database}
    databases.close()
    admin = create_engine(postgres_server_url, poolclass=NullPool)
    with admin.connect() as conn:
        left = conn.execute(
            text("SELECT datname FROM pg_database WHERE datname = ANY(:names)"),
            {"names": list(names)},
        ).all()
    admin.dispose()
    assert left == []
