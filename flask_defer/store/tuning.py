"""SQLite connection tuning: WAL and a busy timeout on every pooled connection."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import Engine, event

from .write_lock import take_turns_to_write


def tune_sqlite(engine: Engine, busy_timeout: timedelta) -> None:
    """WAL lets the web read while the worker writes; the busy timeout makes writers wait."""
    busy_ms = int(busy_timeout.total_seconds() * 1000)

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {busy_ms}")
            if engine.url.database not in (None, "", ":memory:"):
                cursor.execute("PRAGMA journal_mode = WAL")
        finally:
            cursor.close()

    event.listen(engine, "connect", on_connect)
    take_turns_to_write(engine, busy_ms)
    # Connections opened before init_app (if any) are replaced so all get the pragmas.
    engine.pool.dispose()
