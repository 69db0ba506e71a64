"""The timestamp type of flask_defer's statements: aware UTC in, aware UTC out."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime, Dialect
from sqlalchemy.types import TypeDecorator

_NOTHING = object()
#: Whether a dialect class stores timestamps as text (see UTCDateTime._stored_as_text).
_AS_TEXT: dict[type, bool] = {}


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that goes in aware and comes out aware UTC, on every backend.

    PostgreSQL stores ``timestamptz``. SQLite has no time zones, so values are stored as
    naive UTC in SQLAlchemy's fixed-width text format, which sorts correctly as text.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, datetime) or value.tzinfo is None:
            raise ValueError(f"flask_defer stores aware datetimes only, got {value!r}")
        utc: datetime = value.astimezone(UTC)
        return utc.replace(tzinfo=None) if self._stored_as_text(dialect) else utc

    def _stored_as_text(self, dialect: Dialect) -> bool:
        """True where the database keeps timestamps as text without a zone (SQLite):
        asked of the dialect's own DateTime type, once per dialect class."""
        kind = type(dialect)
        found = _AS_TEXT.get(kind)
        if found is None:
            impl = self.impl_instance.dialect_impl(dialect)
            found = _AS_TEXT[kind] = getattr(impl, "_storage_format", None) is not None
        return found

    def bind_processor(self, dialect: Dialect) -> Any:
        """The usual processing (``process_bind_param``, then the dialect's), remembering
        the last value.

        A bulk insert binds the same ``now`` and ``run_at`` objects into every row, and an
        acknowledgement binds one ``now`` twice; converting them once instead of per row
        is most of what a bulk enqueue spends in Python. Datetimes are immutable and the
        remembered value is held, so an identity match always means the same result.
        """
        impl = self.impl_instance.dialect_impl(dialect)
        process = _default_text_writer(impl) or super().bind_processor(dialect)
        if process is None:
            return None
        last: list[tuple[Any, Any]] = [(_NOTHING, None)]

        def remembering(value: Any) -> Any:
            seen, result = last[0]  # one tuple: consistent even across threads
            if value is seen:
                return result
            result = process(value)
            last[0] = (value, result)
            return result

        return remembering

    def result_processor(self, dialect: Dialect, coltype: Any) -> Any:
        """Where timestamps are stored as SQLAlchemy's default text (SQLite), the text is
        parsed by ``datetime.fromisoformat`` in C, and each column remembers its last
        value; elsewhere the usual chain.

        A claimed batch shares its lease, its ``updated_at`` and often its
        ``created_at``, and SQLAlchemy's regular-expression parse of each of a row's
        eight timestamps, then the zone, was a tenth of a SQLite drain (profiled).
        Text it cannot read (another app's format) goes the usual way.
        """
        usual = super().result_processor(dialect, coltype)
        impl = self.impl_instance.dialect_impl(dialect)
        if getattr(impl, "_storage_format", None) != _SQLITE_DEFAULT_FORMAT:
            return usual
        parse = datetime.fromisoformat
        last: list[tuple[Any, Any]] = [(_NOTHING, None)]

        def process(value: Any) -> Any:
            if value is None:
                return None
            seen, result = last[0]  # one tuple: consistent even across threads
            if value == seen:
                return result
            try:
                parsed = parse(value)
            except (TypeError, ValueError):
                return usual(value) if usual is not None else value
            result = (
                parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
            )
            last[0] = (value, result)
            return result

        return process

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def _default_text_writer(impl: Any) -> Any:
    """Where timestamps are stored as SQLAlchemy's default text format (SQLite's
    DATETIME): the whole bind conversion in one step (else None: the usual chain).

    ``isoformat`` writes the same text as SQLAlchemy's ``%``-format of that default
    (four-digit year, always six digits of microseconds; a test compares them) in C,
    and every enqueue converts four to six timestamps.
    """
    if getattr(impl, "_storage_format", None) != _SQLITE_DEFAULT_FORMAT:
        return None

    def to_text(value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, datetime) or value.tzinfo is None:
            raise ValueError(f"flask_defer stores aware datetimes only, got {value!r}")
        return value.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")

    return to_text


#: SQLAlchemy's text format of a SQLite DATETIME, which ``to_text`` reproduces.
_SQLITE_DEFAULT_FORMAT = (
    "%(year)04d-%(month)02d-%(day)02d %(hour)02d:%(minute)02d:%(second)02d.%(microsecond)06d"
)
