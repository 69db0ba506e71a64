"""SQLite's write lock taken in turn: arrival order, the busy timeout, the app's writes."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import OperationalError

from flask_defer import InvalidArgument
from flask_defer.store.sqlite import SqliteDriver, write_lock
from flask_defer.store.sqlite.write_lock import FairLock, WriteLock, write_lock_of


@pytest.fixture
def tuned(tmp_path: Path) -> Iterator[Engine]:
    """A SQLite file engine tuned as flask_defer tunes the app's, busy timeout 1 s."""
    engine = create_engine(f"sqlite:///{tmp_path / 'app.sqlite3'}")
    SqliteDriver.prepare_engine(engine, timedelta(seconds=1))
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE events (who TEXT)"))
    yield engine
    engine.dispose()


def hold_write_lock(path: str) -> sqlite3.Connection:
    """Another process's writer, as far as SQLite can tell: it holds the lock until closed."""
    other = sqlite3.connect(path, isolation_level=None, timeout=0, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    return other


def test_fair_lock_passes_to_the_waiters_in_the_order_they_came() -> None:
    lock = FairLock()
    assert lock.acquire(1)
    order: list[int] = []

    def wait(n: int) -> None:
        assert lock.acquire(5)
        order.append(n)
        lock.release()

    threads = []
    for n in range(4):
        threads.append(threading.Thread(target=wait, args=(n,)))
        threads[-1].start()
        # Queued before the next one comes (not a fixed sleep, which a loaded
        # machine's scheduler can outrun).
        deadline = time.monotonic() + 5
        while len(lock._waiters) != n + 1:
            assert time.monotonic() < deadline, f"waiter {n} never queued"
            time.sleep(0.001)
    lock.release()
    for thread in threads:
        thread.join(10)
    assert order == [0, 1, 2, 3]


def test_fair_lock_gives_up_after_its_timeout_and_leaves_the_queue() -> None:
    lock = FairLock()
    assert lock.acquire(1)
    began = time.monotonic()
    assert not lock.acquire(0.1)
    assert time.monotonic() - began >= 0.1
    lock.release()
    assert lock.acquire(0)  # the one that gave up holds no place in the queue


def test_writers_of_one_engine_get_the_lock_in_the_order_they_asked(tuned: Engine) -> None:
    """SQLite's busy handler has no order; writers queued in turn write in arrival order."""
    other = hold_write_lock(str(tuned.url.database))
    written: list[int] = []

    def write(n: int) -> None:
        with tuned.begin() as conn:
            conn.execute(text("INSERT INTO events VALUES (:n)"), {"n": str(n)})
            written.append(n)

    turns = write_lock_of(tuned)._turns
    threads = []
    for n in range(4):
        threads.append(threading.Thread(target=write, args=(n,)))
        threads[-1].start()
        # Queued before the next one starts (a fixed sleep raced a loaded machine's
        # scheduler): the first holds the turn, the others wait in line behind it.
        deadline = time.monotonic() + 5
        while not (turns._held and len(turns._waiters) == n):
            assert time.monotonic() < deadline, f"writer {n} never queued"
            time.sleep(0.001)
    other.rollback()
    other.close()
    for thread in threads:
        thread.join(10)
    assert written == [0, 1, 2, 3]


def test_a_write_waits_up_to_the_busy_timeout_then_fails_as_locked(tuned: Engine) -> None:
    other = hold_write_lock(str(tuned.url.database))
    try:
        began = time.monotonic()
        with pytest.raises(OperationalError, match="database is locked"), tuned.begin() as conn:
            conn.execute(text("INSERT INTO events VALUES ('late')"))
        waited = time.monotonic() - began
    finally:
        other.close()
    assert 1.0 <= waited < 3.0
    with tuned.begin() as conn:  # the connection's own busy timeout is back
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 1000
        conn.execute(text("INSERT INTO events VALUES ('after')"))


def test_a_write_takes_the_lock_soon_after_another_process_lets_it_go(tuned: Engine) -> None:
    """Looks every millisecond, not in SQLite's 100 ms sleeps once a writer has waited.

    SQLite's own handler looks at fixed moments (…, 428, 528 ms into the wait): a lock
    freed 450 ms in was taken about 80 ms later.
    """
    delays: list[float] = []
    for _ in range(3):
        other = hold_write_lock(str(tuned.url.database))
        released: list[float] = []

        def release_later(holder: sqlite3.Connection = other, at: list[float] = released) -> None:
            time.sleep(0.45)
            holder.rollback()
            at.append(time.monotonic())

        releaser = threading.Thread(target=release_later)
        releaser.start()
        with tuned.begin() as conn:
            conn.execute(text("INSERT INTO events VALUES ('waited')"))
            taken = time.monotonic()
        releaser.join(10)
        other.close()
        delays.append(max(taken - released[0], 0.0))
    assert sum(delays) / len(delays) < 0.05, delays  # SQLite alone: about 80 ms


def test_a_write_in_autocommit_is_left_to_sqlite(tuned: Engine) -> None:
    with tuned.connect() as conn:
        auto = conn.execution_options(isolation_level="AUTOCOMMIT")
        auto.execute(text("INSERT INTO events VALUES ('auto')"))
        assert not auto.connection.dbapi_connection.in_transaction
    with tuned.connect() as conn:
        assert conn.execute(text("SELECT who FROM events")).scalars().all() == ["auto"]


def trace_looks(engine: Engine) -> list[tuple[int, str]]:
    """Every statement SQLite starts on *engine*'s connections, by connection, as run."""
    seen: list[tuple[int, str]] = []

    @event.listens_for(engine, "connect")
    def traced(dbapi: sqlite3.Connection, _record: Any) -> None:
        key = id(dbapi)
        dbapi.set_trace_callback(lambda sql: seen.append((key, sql)))

    engine.dispose()  # connections opened from now on are traced
    return seen


def test_a_writer_of_the_same_process_takes_the_lock_at_the_commit_without_looking_twice(
    tuned: Engine,
) -> None:
    """Within a process the turn is handed over at the commit: the queued writer's one
    BEGIN IMMEDIATE succeeds (it used to look every millisecond while its neighbour
    held SQLite's lock, 100 failed looks for a 100 ms transaction)."""
    seen = trace_looks(tuned)
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        with tuned.begin() as conn:
            conn.execute(text("INSERT INTO events VALUES ('first')"))
            holding.set()
            time.sleep(0.1)

    def second() -> None:
        holding.wait(5)
        with tuned.begin() as conn:
            conn.execute(text("INSERT INTO events VALUES ('second')"))
        done.set()

    threads = [threading.Thread(target=hold), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert done.is_set()
    begins = [key for key, sql in seen if sql == "BEGIN IMMEDIATE"]
    assert len(begins) == 2 and len(set(begins)) == 2, seen
    with tuned.connect() as conn:
        rows = conn.execute(text("SELECT who FROM events")).scalars().all()
    assert rows == ["first", "second"]


def test_a_transaction_ended_behind_sqlalchemys_back_gives_up_its_turn(tuned: Engine) -> None:
    """A raw COMMIT ends the transaction without the hand-over; the next writer of the
    process still gets in at once, not after the busy timeout."""
    with tuned.connect() as conn:
        conn.execute(text("INSERT INTO events VALUES ('raw')"))
        conn.connection.dbapi_connection.execute("COMMIT")  # the turn is never handed on
        began = time.monotonic()
        with tuned.begin() as other:
            other.execute(text("INSERT INTO events VALUES ('next')"))
        assert time.monotonic() - began < 0.9  # the busy timeout is 1 s
        conn.rollback()
    with tuned.connect() as conn:
        rows = conn.execute(text("SELECT who FROM events")).scalars().all()
    assert sorted(rows) == ["next", "raw"]


def test_a_second_connection_of_the_writing_thread_fails_at_once_saying_why(
    tuned: Engine,
) -> None:
    """The turn is this thread's own (held by its first connection): the second would
    wait for itself, so it fails at once with what to do, not after the busy timeout
    (twice it, once in the queue and once in SQLite's handler, before the queue)."""
    with tuned.begin() as first:
        first.execute(text("INSERT INTO events VALUES ('first')"))
        began = time.monotonic()
        with pytest.raises(OperationalError, match="same thread") as refused:
            with tuned.begin() as other:
                other.execute(text("INSERT INTO events VALUES ('second')"))
        waited = time.monotonic() - began
        assert "commit=False" in str(refused.value)
    assert waited < 0.5, waited  # the busy timeout is 1 s
    with tuned.connect() as conn:
        assert conn.execute(text("SELECT who FROM events")).scalars().all() == ["first"]


@pytest.mark.parametrize("backend", ["sqlite"])
def test_the_sqlite_synchronous_setting_reaches_every_connection(
    make_app: Any,
) -> None:
    # None leaves SQLite's own level: FULL (2), each commit on disk when it returns.
    for setting, level in (("normal", 1), ("EXTRA", 3), (None, 2)):
        kit = make_app(DEFER_SQLITE_SYNCHRONOUS=setting)
        with kit.app.app_context():
            found = kit.db.session.execute(text("PRAGMA synchronous")).scalar()
            kit.db.session.rollback()
        assert found == level, (setting, found)
    with pytest.raises(InvalidArgument) as refused:
        make_app(DEFER_SQLITE_SYNCHRONOUS="sometimes")
    assert refused.value.argument == "DEFER_SQLITE_SYNCHRONOUS"



def test_the_last_holder_asking_again_while_the_next_takes_the_turn_waits_its_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread that held the turn and asks again just as another writer takes it waits
    for that writer. It must not read the new holder beside its own, older, thread and
    refuse as if it waited for itself (seen once in 4,000 batch appends under load)."""
    path = str(tmp_path / "turns.sqlite3")
    setup = sqlite3.connect(path)
    setup.execute("PRAGMA journal_mode = WAL")
    setup.close()
    lock = WriteLock()
    mine = sqlite3.connect(path, check_same_thread=False)
    theirs = sqlite3.connect(path, check_same_thread=False)
    ask_again, asked = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def last_holder() -> None:
        lock.begin(mine, 5000)  # holds the turn once and gives it back
        mine.commit()
        lock.ended(mine)
        ask_again.wait(10)
        try:
            lock.begin(mine, 0)  # waiting for the other writer: gives up at once
        except sqlite3.OperationalError as error:
            errors.append(error)
        asked.set()

    thread = threading.Thread(target=last_holder)
    thread.start()
    while lock._holder_thread != thread.ident:  # noqa: SLF001 - its first turn is over
        time.sleep(0.001)
    time.sleep(0.05)

    class TakingTheTurn:
        """The lock's ``threading``, whose get_ident (called as the other writer names
        itself the holder) lets the last holder ask at that very moment."""

        def __getattr__(self, name: str) -> Any:
            return getattr(threading, name)

        @staticmethod
        def get_ident() -> int:
            if threading.current_thread() is not thread and not ask_again.is_set():
                ask_again.set()
                asked.wait(0.5)  # it answers at once, or it waits for the turn
            return threading.get_ident()

    monkeypatch.setattr(write_lock, "threading", TakingTheTurn())
    lock.begin(theirs, 5000)
    theirs.commit()
    lock.ended(theirs)
    thread.join(10)
    assert asked.is_set()
    assert not [e for e in errors if "same thread" in str(e)], errors
    mine.close()
    theirs.close()
