"""Log output for ``flask defer worker``: readable text or one JSON object per line.

Every line about a job carries ``job_id``, ``job_name`` and ``job_key`` as record
fields (:class:`~flask_defer.engine.execution.JobLog` puts them there), so the JSON form can
be filtered by job in any log store. Apps that configure logging themselves keep
their configuration: :func:`configure` only adds a handler when there is none.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any


def brief(error: BaseException) -> str:
    """The first line of a database error, without SQLAlchemy's background link."""
    text = str(getattr(error, "orig", None) or error).strip().splitlines()
    return text[0] if text else type(error).__name__


#: Record attributes copied into JSON lines when present.
JOB_FIELDS = ("job_id", "job_name", "job_key")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, job fields, error."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "thread": record.threadName,
        }
        for name in JOB_FIELDS:
            if hasattr(record, name):
                data[name] = getattr(record, name)
        if record.exc_info:
            data["error"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s [%(threadName)s] %(message)s"


def configure(level: str = "INFO", fmt: str = "text") -> None:
    """Send flask_defer's log to stderr, unless the app already routed it somewhere."""
    target = logging.getLogger("flask_defer")
    target.setLevel(level.upper())
    if target.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    target.addHandler(handler)
