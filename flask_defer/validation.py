"""Argument checks shared by the facade's methods, each naming the argument it refuses."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from .errors import InvalidArgument, JobNotFound
from .jobs import JobStatus
from .timeutil import as_duration

#: Ids are 64-bit signed integers on both backends, starting at 1.
MAX_JOB_ID = 2**63 - 1

#: Deepest nesting of lists and objects a payload (or result) may have. PostgreSQL's
#: and SQLite's JSON functions, and Python's own encoder, all give up somewhere
#: between 1,000 and 10,000 levels, each with a different error; no real payload
#: comes near 100.
MAX_PAYLOAD_DEPTH = 100

#: Default of ``DEFER_MAX_PAYLOAD_BYTES``: a payload is an intent, not a file.
DEFAULT_MAX_PAYLOAD_BYTES = 1_000_000

# PostgreSQL stores neither NUL nor a UTF-16 surrogate code point, in text or in
# JSONB; SQLite would, so without this one rule the two backends would disagree.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")

# The same characters as json.dumps (ensure_ascii) escapes them. A surrogate *pair* is
# how the encoder writes an emoji, so the precise check only runs when this matches.
_MAYBE_UNSTORABLE = re.compile(r"\\u(?:0000|d[89a-f])", re.IGNORECASE)

#: One encoder for every payload check, without building one per call.
_STRICT_JSON = json.JSONEncoder(allow_nan=False)
_MAKE_ENCODER = json.encoder.c_make_encoder  # type: ignore[attr-defined]
#: _STRICT_JSON's settings, as ``JSONEncoder.iterencode`` passes them to the C encoder.
_ENCODER_SETTINGS = (
    _STRICT_JSON.default, json.encoder.encode_basestring_ascii, _STRICT_JSON.indent,
    _STRICT_JSON.key_separator, _STRICT_JSON.item_separator, _STRICT_JSON.sort_keys,
    _STRICT_JSON.skipkeys, _STRICT_JSON.allow_nan,
)  # fmt: skip


def _strict_json(value: Any) -> str:
    """``_STRICT_JSON.encode(value)``, the same text, through the C encoder directly.

    ``JSONEncoder.encode`` spends half its time for a small payload in Python around
    the C encoder (building it, and a float formatter it does not use): 1.8 against
    0.9 µs measured, paid per job by ``schedule`` and ``schedule_many``. Where the C
    encoder is missing, the plain call. A fresh ``markers`` dict per call keeps the
    circular-reference check.
    """
    if _MAKE_ENCODER is None:
        return _STRICT_JSON.encode(value)
    encode = _MAKE_ENCODER({}, *_ENCODER_SETTINGS)
    return "".join(encode(value, 0))


def storable_text(value: str, argument: str) -> str:
    """Refuse a string PostgreSQL cannot store (NUL, lone surrogates), naming *argument*."""
    found = _UNSTORABLE.search(value)
    if found is not None:
        raise InvalidArgument(
            argument,
            f"contains {_describe(found.group())} at position {found.start()}, "
            "which the database cannot store",
        )
    return value


def _describe(char: str) -> str:
    if char == "\x00":
        return "a NUL character (\\u0000)"
    return f"a lone surrogate (\\u{ord(char):04x})"


def identity(job_id: Any, key: Any) -> tuple[int | None, str | None]:
    """Validate the "id or key" pair that several facade methods take."""
    if (job_id is None) == (key is None):
        raise InvalidArgument("id", "give exactly one of id or key=")
    if job_id is not None and (isinstance(job_id, bool) or not isinstance(job_id, int)):
        raise InvalidArgument("id", f"expected an integer job id, got {job_id!r}")
    if job_id is not None and not 1 <= job_id <= MAX_JOB_ID:
        # No row can have it; asking the database would overflow its bigint instead.
        raise JobNotFound(job_id=job_id)
    return job_id, checked_text(key, "key")


def checked_text(value: Any, argument: str, *, allow_empty: bool = False) -> str | None:
    """An optional short string (a key, owner, label, name): ≤ 255 characters."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgument(argument, f"expected a string, got {type(value).__name__} {value!r}")
    if not value and not allow_empty:
        raise InvalidArgument(argument, "must not be empty")
    if len(value) > 255:
        raise InvalidArgument(argument, f"at most 255 characters, got {len(value)}")
    return storable_text(value, argument)


def checked_commit(commit: Any) -> bool:
    """The ``commit=`` flag of the control calls: True or False, nothing truthy."""
    if not isinstance(commit, bool):
        raise InvalidArgument("commit", f"expected True or False, got {commit!r}")
    return commit


def checked_max_seconds(max_seconds: Any) -> timedelta:
    """``run_due``'s time budget: a positive, finite timedelta or number of seconds."""
    if isinstance(max_seconds, float) and not math.isfinite(max_seconds):
        raise InvalidArgument("max_seconds", f"expected a finite number, got {max_seconds!r}")
    try:
        return as_duration(max_seconds, "max_seconds", allow_zero=False)
    except OverflowError:
        raise InvalidArgument("max_seconds", f"too large: {max_seconds!r}") from None


def checked_limit(limit: Any) -> int:
    """A page size: an integer from 1 to 10,000."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
        raise InvalidArgument("limit", f"expected an integer from 1 to 10000, got {limit!r}")
    return limit


def checked_payload(payload: Any, *, max_bytes: int | None = None) -> Any:
    """Refuse what JSON cannot carry before anything is written; return the stored form."""
    return checked_payload_text(payload, max_bytes=max_bytes)[0]


def checked_payload_text(payload: Any, *, max_bytes: int | None = None) -> tuple[Any, str]:
    """:func:`checked_payload` and the JSON text it is stored as (None stores ``{}``)."""
    if payload is None:
        return {}, "{}"
    text = payload_text(payload, "payload", max_bytes=max_bytes)
    # Round-trip so the caller's Job shows exactly what the handler will receive.
    return json.loads(text), text


def payload_text(value: Any, argument: str, *, max_bytes: int | None = None) -> str:
    """*value* as the JSON text both backends store, or :class:`InvalidArgument`.

    Refused, naming *argument*: what JSON cannot carry (sets, NaN, objects), nesting
    deeper than :data:`MAX_PAYLOAD_DEPTH`, strings the database cannot store (see
    :func:`storable_text`, in keys too), and text longer than *max_bytes*.
    """
    try:
        text = _strict_json(value)
    except RecursionError:
        raise InvalidArgument(
            argument, f"nested deeper than {MAX_PAYLOAD_DEPTH} levels of lists and objects"
        ) from None
    except (TypeError, ValueError) as error:
        raise InvalidArgument(argument, f"must be JSON-serialisable: {error}") from None
    if max_bytes is not None and len(text) > max_bytes:
        # The text escapes every non-ASCII character (é is "\u00e9": 6 bytes for 2), so
        # it is never shorter than the UTF-8 JSON a database keeps; only past the limit
        # is the real size worth computing.
        size = len(json.dumps(value, ensure_ascii=False, allow_nan=False).encode())
        if size > max_bytes:
            raise InvalidArgument(
                argument,
                f"{size} bytes as JSON (UTF-8), more than DEFER_MAX_PAYLOAD_BYTES "
                f"({max_bytes}); store the data in your own table and pass its id",
            )
    # Both checks below walk the value, so they only run when the text says they may
    # find something: a payload needs at least that many brackets to be that deep.
    if text.count("[") + text.count("{") > MAX_PAYLOAD_DEPTH:
        _check_depth(value, argument)
    if _MAYBE_UNSTORABLE.search(text):
        _check_strings(value, argument)
    return text


def _check_depth(value: Any, argument: str) -> None:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if isinstance(item, dict | list | tuple):
            if depth > MAX_PAYLOAD_DEPTH:
                raise InvalidArgument(
                    argument, f"nested deeper than {MAX_PAYLOAD_DEPTH} levels of lists and objects"
                )
            stack.extend((child, depth + 1) for child in children)


def _check_strings(value: Any, argument: str) -> None:
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            storable_text(item, argument)
        elif isinstance(item, dict):
            stack.extend(str(k) if not isinstance(k, str) else k for k in item)
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)


def statuses(
    status: JobStatus | str | Iterable[JobStatus | str] | None,
) -> tuple[JobStatus, ...] | None:
    """One status or several, as JobStatus values (None: any status)."""
    if status is None:
        return None
    items = [status] if isinstance(status, str) else list(status)
    try:
        return tuple(JobStatus(item) for item in items)
    except ValueError:
        allowed = ", ".join(s.value for s in JobStatus)
        raise InvalidArgument("status", f"expected one of {allowed}, got {status!r}") from None


#: Who a Python call is in the job history when it passes no ``actor=``.
DEFAULT_ACTOR = "app"


def checked_actor(actor: Any) -> str:
    """Who made a change, for its history event: ``app`` unless the caller says."""
    return checked_text(actor, "actor") or DEFAULT_ACTOR


#: The longest queue name (the jobs table's ``queue`` column) and job name (``name``).
MAX_QUEUE_LENGTH, MAX_NAME_LENGTH = 100, 200


def pause_target(queue: Any, name: Any) -> tuple[str, str]:
    """``pause``/``resume``'s target as ``(kind, value)``: exactly one of queue or name."""
    if (queue is None) == (name is None):
        both = "not both" if queue is not None else "got neither"
        raise InvalidArgument("queue", f"give exactly one of queue= or name=, {both}")
    kind, value, limit = (
        ("queue", queue, MAX_QUEUE_LENGTH) if queue is not None else ("name", name, MAX_NAME_LENGTH)
    )
    if not isinstance(value, str):
        raise InvalidArgument(kind, f"expected a string, got {type(value).__name__} {value!r}")
    if not value:
        raise InvalidArgument(kind, "must not be empty")
    if len(value) > limit:
        raise InvalidArgument(kind, f"at most {limit} characters, got {len(value)}")
    return kind, storable_text(value, kind)


def checked_state_texts(texts: Mapping[str, str | None] | None) -> dict[str, Any]:
    """An Undo toast's state texts (``done_label=`` ...), each checked like a label."""
    return {name: checked_text(text, name) for name, text in (texts or {}).items()}
