"""The jobs table's column types: aware UTC timestamps on every backend."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import Dialect
from sqlalchemy.dialects import postgresql, sqlite

from flask_defer.store.schema import UTCDateTime

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def _dialect(backend: str) -> Dialect:
    if backend == "postgresql":
        return postgresql.psycopg.dialect(paramstyle="format")  # type: ignore[no-any-return]
    return sqlite.dialect()  # type: ignore[no-any-return]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_utc_datetime_binding_is_unchanged_by_remembering(backend: str) -> None:
    dialect = _dialect(backend)
    # As the store's statements bind it: the type made for the dialect (on SQLite its
    # impl writes SQLAlchemy's text format, which the bind reproduces in one step).
    typed = UTCDateTime().dialect_impl(dialect)
    remembering = typed.bind_processor(dialect)
    plain = UTCDateTime().process_bind_param
    impl = typed.impl_instance.bind_processor(dialect)

    def expected(value: datetime | None) -> Any:
        converted = plain(value, dialect)
        return impl(converted) if impl is not None and converted is not None else converted

    paris = datetime(2030, 1, 1, 13, 0, tzinfo=UTC).astimezone(ZoneInfo("Europe/Paris"))
    values = [NOW, NOW, None, NOW + timedelta(microseconds=1), NOW, paris, paris, None]
    # SQLite's text: the edges of the format (short years, no or all microseconds, a
    # zone whose local date is a day ahead of UTC's).
    values += [
        datetime(999, 1, 1, tzinfo=UTC),
        datetime(1, 1, 1, 0, 0, 0, 5, tzinfo=UTC),
        datetime(2030, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2031, 1, 1, 0, 30, tzinfo=ZoneInfo("Asia/Tokyo")),
    ]
    assert remembering is not None
    assert [remembering(v) for v in values] == [expected(v) for v in values]
    # Equal but distinct objects are converted, not matched by identity alone.
    twin = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    assert remembering(twin) == expected(twin)
    with pytest.raises(ValueError, match="aware"):
        remembering(datetime(2030, 1, 1, 12, 0))


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_naive_datetimes_never_reach_the_database(backend: str) -> None:
    with pytest.raises(ValueError, match="aware"):
        UTCDateTime().process_bind_param(datetime(2030, 1, 1), _dialect(backend))


def test_sqlite_text_reads_as_sqlalchemys_own_parse_does() -> None:
    """SQLite's timestamps are read by ``fromisoformat`` with a per-column memory: the
    same aware UTC values as SQLAlchemy's own parse then the zone, for the text the
    store writes (its edges included), repeated values, other apps' ISO text and NULL."""
    dialect = sqlite.dialect()
    typed = UTCDateTime().dialect_impl(dialect)
    fast = typed.result_processor(dialect, None)
    usual = typed.impl_instance.result_processor(dialect, None)
    assert fast is not None and usual is not None

    def expected(text: str | None) -> datetime | None:
        return UTCDateTime().process_result_value(usual(text), dialect)

    written = typed.bind_processor(dialect)
    assert written is not None
    stored = [
        written(v)
        for v in (
            NOW, NOW, NOW + timedelta(microseconds=1), datetime(999, 1, 1, tzinfo=UTC),
            datetime(1, 1, 1, 0, 0, 0, 5, tzinfo=UTC),
            datetime(2030, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        )
    ]  # fmt: skip
    texts = [*stored, None, stored[0], "2030-01-01 12:00:00", "2030-01-01 12:00:00.5"]
    assert [fast(t) for t in texts] == [expected(t) for t in texts]
    assert all(v is None or v.tzinfo is UTC for v in map(fast, texts))
    # ISO text with a zone (another writer's) is converted to UTC, not relabelled.
    assert fast("2030-01-01T14:00:00+02:00") == NOW
